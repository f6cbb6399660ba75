// Package docker is the sandbox package's backend for a Docker engine, and
// for Podman through its Docker-compatible API (podman system service). It
// is the default backend: sandbox.New uses one for the engine DOCKER_HOST
// names (or the default socket) unless given sandbox.WithDriver.
//
// A Driver holds one connection to its engine, shared by all the
// sandboxes made through it, and what it learns of the engine (its
// architecture, whether it is Podman, that the agent's volume is filled):
// make one per engine and pass it to every sandbox of that engine.
//
// Each sandbox is a container whose main process is the library's agent,
// mounted read-only from a volume that holds the agent's program for the
// engine's architecture (filled once per engine and re-checked when found
// missing); its working directory is a volume of its own (a loop-mounted
// ext4 image of Limits.Disk where this process is root on the engine's
// host, else a tmpfs of that size); NetworkPolicy{Open: true} gets a
// bridge network of its own with host firewall rules that keep the host's
// services and other sandboxes out (root and iptables on the engine's
// host, else sandbox.ErrNetworkUnsupported). A snapshot's image, when asked
// for (sandbox.Snapshot.Image), is the sandbox's image and one layer made
// from the snapshot's content, committed from a never-started container.
//
// Every object carries the labels dev.agentsandbox.managed=true,
// dev.agentsandbox.owner (host, boot, process ID and start time) and
// dev.agentsandbox.kind, so Prune removes only what dead processes left.
package docker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/disk"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
	"github.com/agentsandbox/sandbox/internal/leftover"
)

// DefaultTimeout bounds each engine request until its answer starts, when
// Config.Timeout is 0.
const DefaultTimeout = 30 * time.Second

// Config configures a Driver. The zero Config is the engine of the
// environment with the defaults.
type Config struct {
	// Host is the engine's address ("unix:///var/run/docker.sock",
	// "tcp://host:2376", a rootless Podman's socket); "" means DOCKER_HOST,
	// else the default socket. TLS material comes from DOCKER_CERT_PATH as
	// with the docker CLI.
	Host string
	// Timeout bounds each request until the engine's answer starts
	// (DefaultTimeout if 0): an engine that stops answering fails
	// requests with errors wrapping sandbox.ErrEngineUnavailable and
	// sandbox.ErrUnresponsive.
	Timeout time.Duration
	// TmpfsWorkdir makes every working directory a tmpfs (memory, counted
	// towards Limits.Memory), even where a loop-mounted disk could be made
	// (root on the engine's host, e2fsprogs): no losetup or mkfs is run.
	TmpfsWorkdir bool
	// NoFirewall never installs host firewall rules: NetworkPolicy{Open:
	// true} then fails with sandbox.ErrNetworkUnsupported. Allow-lists,
	// credentials and Expose need no rule.
	NoFirewall bool
	// AgentVolume names the volume that holds the agent's program
	// (default "agentsandbox-agent-" and the program's hash).
	AgentVolume string
}

// Driver is a Docker engine as a backend (driver.Driver). It is safe for
// concurrent use; Close releases its connection.
type Driver struct {
	cfg Config

	mu      sync.Mutex
	cli     engine.API // nil until first used
	version string     // the API version negotiated
	info    *engine.Info
	closed  bool

	agentMu    sync.Mutex // one fill of the agent's volume at a time
	agentReady map[string]bool

	left leftover.Set // objects whose removal the engine did not answer
}

var (
	_ driver.Driver      = (*Driver)(nil)
	_ driver.Snapshotter = (*Driver)(nil)
)

// New returns a Driver for the engine cfg names. It does not connect: the
// first request does, and fails with an error wrapping
// sandbox.ErrEngineUnavailable if the engine cannot be reached.
func New(cfg Config) *Driver {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Driver{cfg: cfg, agentReady: map[string]bool{}}
}

// newWithAPI is a Driver over cli, for tests of its logic.
func newWithAPI(cli engine.API, cfg Config) *Driver {
	d := New(cfg)
	d.cli = cli
	d.info = &engine.Info{Arch: "amd64"}
	return d
}

// Host is the engine's address: Config.Host, else DOCKER_HOST as it is
// now, else the default socket.
func (d *Driver) Host() string { return engine.Host(d.cfg.Host) }

// client returns the connection, made on first use.
func (d *Driver) client(ctx context.Context) (engine.API, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("docker: driver closed")
	}
	if d.cli != nil {
		return d.cli, nil
	}
	cli, err := engine.Connect(ctx, d.cfg.Host, d.cfg.Timeout, "")
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("sandbox: connect to the engine: %w", ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("%w at %s: is dockerd running, and may this user use it? (%v)",
			driver.ErrUnavailable, d.Host(), err)
	}
	d.cli, d.version = cli, cli.ClientVersion()
	return cli, nil
}

// longClient returns a connection of its own whose requests may take up to
// answer before their answer starts (a commit answers once its layer is
// written); the caller closes it.
func (d *Driver) longClient(ctx context.Context, answer time.Duration) (engine.API, error) {
	if _, err := d.client(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	version := d.version
	d.mu.Unlock()
	cli, err := engine.Connect(ctx, d.cfg.Host, answer, version)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", driver.ErrUnavailable, d.Host(), err)
	}
	return cli, nil
}

// engineInfo returns what the engine says of itself, asked once.
func (d *Driver) engineInfo(ctx context.Context) (engine.Info, error) {
	cli, err := d.client(ctx)
	if err != nil {
		return engine.Info{}, err
	}
	d.mu.Lock()
	info := d.info
	d.mu.Unlock()
	if info != nil {
		return *info, nil
	}
	v, err := cli.ServerVersion(ctx)
	if err != nil {
		return engine.Info{}, d.err("engine version", err)
	}
	i := engine.InfoOf(v)
	d.mu.Lock()
	d.info = &i
	d.mu.Unlock()
	return i, nil
}

// Caps reports that a working directory with a size limit is a
// loop-mounted ext4 image where this process may make one (root on the
// engine's host), else a tmpfs.
func (d *Driver) Caps(context.Context) (driver.Caps, error) {
	if d.diskBacking() != nil {
		return driver.Caps{Disk: driver.DiskMemory}, nil
	}
	return driver.Caps{Disk: driver.DiskExt4}, nil
}

// diskBacking says why the working directory cannot be a loop-mounted
// ext4 image here (nil if it can): that needs root (CAP_SYS_ADMIN) and
// e2fsprogs on this host, and an engine on this host (a unix socket).
func (d *Driver) diskBacking() error {
	if d.cfg.TmpfsWorkdir {
		return errors.New("the driver was configured with TmpfsWorkdir")
	}
	if err := disk.Supported(); err != nil {
		return err
	}
	if !strings.HasPrefix(d.Host(), "unix://") {
		return fmt.Errorf("the engine at %s may not share this host's loop devices", d.Host())
	}
	return nil
}

// firewallSupported says why host firewall rules cannot be installed here
// (nil if they can).
func (d *Driver) firewallSupported() error {
	if d.cfg.NoFirewall {
		return errors.New("the driver was configured with NoFirewall")
	}
	return firewall.Supported()
}

// CloseIdleConnections closes the connections to the engine that no
// request uses now, as http.Client's method of that name does.
func (d *Driver) CloseIdleConnections() {
	d.mu.Lock()
	cli := d.cli
	d.mu.Unlock()
	if c, ok := cli.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Close closes the connection.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.cli != nil {
		return d.cli.Close()
	}
	return nil
}

// err turns an engine error that is not about one container into one the
// caller can act on.
func (d *Driver) err(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sandbox: %s: %w", op, err)
	case engine.IsTimeout(err):
		// The engine's error repeats the same in more words.
		return fmt.Errorf("%w at %s: %s: %w (none within %v: is dockerd stopped or overloaded?)",
			driver.ErrUnavailable, d.Host(), op, driver.ErrUnresponsive, d.cfg.Timeout)
	case engine.IsUnreachable(err):
		return fmt.Errorf("%w at %s: %s: is dockerd running? (%v)", driver.ErrUnavailable, d.Host(), op, err)
	}
	return fmt.Errorf("sandbox: %s: %w", op, err)
}
