// Package stubbackend is a backend outside the library's module, built
// from its public packages alone: it shows (and CI checks, by building it)
// that a third backend needs nothing under the library's internal/. It
// makes no instances on any engine: Create prepares what a real backend
// would hand its engine — the agent's program for the engine's
// architecture, its arguments, the owner's labels, the seccomp profile —
// and runs the instance as an in-memory pipe with no agent behind it.
package stubbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/agentbin"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/driver/seccomp"
)

// Driver is the stub backend.
type Driver struct {
	mu        sync.Mutex
	instances map[string]*Instance
}

var (
	_ driver.Driver   = (*Driver)(nil)
	_ driver.Instance = (*Instance)(nil)
)

// New returns a stub backend.
func New() *Driver { return &Driver{instances: map[string]*Instance{}} }

// Caps says the working directory is memory.
func (d *Driver) Caps(context.Context) (driver.Caps, error) {
	return driver.Caps{Disk: driver.DiskMemory}, nil
}

// Create prepares the instance's program, command line, labels and
// seccomp profile, and returns an instance whose stream is a pipe.
func (d *Driver) Create(ctx context.Context, spec *driver.Spec) (driver.Instance, error) {
	bin, hash, err := agentbin.Binary(runtime.GOARCH)
	if err != nil {
		return nil, fmt.Errorf("stubbackend: %w", err)
	}
	a := spec.Agent
	a.FileSize, a.OpenFiles = max(spec.Resources.FileSize, 0), max(spec.Resources.OpenFiles, 0)
	argv, err := a.Argv()
	if err != nil {
		return nil, fmt.Errorf("stubbackend: %w", err)
	}
	profile, err := json.Marshal(seccomp.Profile(runtime.GOARCH))
	if err != nil {
		return nil, fmt.Errorf("stubbackend: seccomp profile: %w", err)
	}
	in := &Instance{
		id:      "stub-" + hash,
		command: append([]string{"/agent"}, argv...),
		program: bin,
		labels:  owner.Labels("sandbox", spec.Labels),
		seccomp: profile,
	}
	var peer net.Conn
	in.conn, peer = net.Pipe()
	peer.Close() // no agent: the stream ends at once
	d.mu.Lock()
	d.instances[in.id] = in
	d.mu.Unlock()
	return in, nil
}

// Prune removes the instances whose owner has died.
func (d *Driver) Prune(context.Context) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for id, in := range d.instances {
		if owner.Dead(in.labels[owner.LabelOwner]) {
			delete(d.instances, id)
			n++
		}
	}
	return n, nil
}

// Close forgets every instance.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.instances)
	return nil
}

// Instance is a stub instance.
type Instance struct {
	id      string
	command []string
	program []byte
	labels  map[string]string
	seccomp []byte
	conn    net.Conn
}

// ID is the instance's name.
func (in *Instance) ID() string { return in.id }

// Stream is the pipe.
func (in *Instance) Stream() driver.Stream { return stream{in.conn} }

// State is always gone: no agent runs.
func (in *Instance) State(context.Context) driver.State { return driver.StateGone }

// Remove closes the pipe.
func (in *Instance) Remove(context.Context) error { return in.conn.Close() }

// Command is the agent's command line a real backend would run.
func (in *Instance) Command() []string { return in.command }

// stream is a net.Conn with CloseWrite.
type stream struct{ net.Conn }

func (s stream) CloseWrite() error { return s.Close() }

// Parsed reads a command line back as the agent would.
func Parsed(command []string) (agentargs.Args, error) { return agentargs.Parse(command[1:]) }
