package docker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/disk"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/leftover"
)

// instance is a sandbox's container and what was made for it.
type instance struct {
	d       *Driver
	cli     engine.API
	spec    driver.Spec
	image   string // what the container runs: the image, or the snapshot's
	name    string // the container's name, unique, chosen before it is created
	id      string
	volume  string       // the working directory's volume
	dev     *disk.Device // backs volume when Resources.Disk > 0 and loop devices can be made
	net     *openNet     // NetworkOpen's network and firewall rules
	attach  types.HijackedResponse
	stream  *stream
	created time.Time
}

var (
	_ driver.Instance    = (*instance)(nil)
	_ driver.OOMReporter = (*instance)(nil)
)

func (in *instance) ID() string            { return in.id }
func (in *instance) Stream() driver.Stream { return in.stream }

// stream is the attach stream: frames from the agent's stdout (demuxed),
// writes to its stdin. ended closes when reading it ends.
type stream struct {
	h     types.HijackedResponse
	r     io.Reader
	once  sync.Once
	ended chan struct{}
}

func newStream(h types.HijackedResponse, r io.Reader) *stream {
	return &stream{h: h, r: r, ended: make(chan struct{})}
}

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil {
		s.once.Do(func() { close(s.ended) })
	}
	return n, err
}
func (s *stream) Write(p []byte) (int, error)        { return s.h.Conn.Write(p) }
func (s *stream) SetWriteDeadline(t time.Time) error { return s.h.Conn.SetWriteDeadline(t) }
func (s *stream) CloseWrite() error                  { return s.h.CloseWrite() }
func (s *stream) Close() error                       { s.h.Close(); return nil }

// streamEnded reports whether the agent's stream has ended, or ends within
// wait.
func (in *instance) streamEnded(wait time.Duration) bool {
	if in.stream == nil {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-in.stream.ended:
		return true
	case <-t.C:
		return false
	}
}

// streamEndWait is how long stateAfterFailure waits for the agent's stream
// to end when the engine still sees the container running: the engine's
// view lags the kill by a moment.
const streamEndWait = time.Second

// stateTimeout bounds State's one inspect request (less than the
// Timeout when that is longer): State is asked while deciding how to
// report a failure already seen.
const stateTimeout = 5 * time.Second

// State asks the engine what state the container is in.
func (in *instance) State(ctx context.Context) driver.State {
	ctx, cancel := context.WithTimeout(ctx, min(stateTimeout, in.spec.Timeout))
	defer cancel()
	info, err := in.cli.ContainerInspect(ctx, cmp.Or(in.id, in.name))
	switch {
	case engine.IsNotFound(err):
		return driver.StateGone
	case err != nil:
		return driver.StateUnknown
	case info.State == nil || !info.State.Running || info.State.Dead || info.State.Restarting:
		return driver.StateGone
	case info.State.Paused:
		return driver.StatePaused
	}
	return driver.StateRunning
}

// stateAfterFailure says what state the container is in after the engine
// refused a request about it. The engine's view can lag behind: a
// container killed a moment ago may still be "running" to it, and its
// refusal then names no state. The end of the agent's stream is the
// sandbox's own sign of its end, so it is asked first, and waited for a
// moment if the engine sees the container running.
func (in *instance) stateAfterFailure() driver.State {
	if in.streamEnded(0) {
		return driver.StateGone
	}
	st := in.State(context.Background())
	if (st == driver.StateRunning || st == driver.StateUnknown) && in.streamEnded(streamEndWait) {
		return driver.StateGone
	}
	return st
}

// err turns an engine error about the container into one the caller can
// act on.
func (in *instance) err(op string, err error) error {
	if err != nil && in.id != "" && engine.MayBeState(err) && !engine.IsTimeout(err) && !engine.IsUnreachable(err) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		switch in.stateAfterFailure() {
		case driver.StateGone:
			return fmt.Errorf("%w: %s: %s stopped: %v", driver.ErrGone, op, shortID(in.id), err)
		case driver.StatePaused:
			return pausedErr(op, in.id)
		}
	}
	return in.d.err(op, err)
}

func pausedErr(op, id string) error {
	return fmt.Errorf("%w: %s: %s is paused from outside the library (docker pause / podman pause); unpause it to use it again",
		driver.ErrUnresponsive, op, shortID(id))
}

// OOMKilled reports whether the engine remembers the kernel's OOM killer
// acting in the container within a second of its end.
func (in *instance) OOMKilled(ctx context.Context) bool {
	return in.id != "" && engine.DiedOfOOM(ctx, in.cli, in.id, in.created)
}

// Remove removes the container (stopping the agent), its network and
// firewall rules, its volume and disk. Objects whose removal the engine
// did not answer are remembered and removed by a later Remove on the same
// Driver, or Prune.
func (in *instance) Remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	var errs []error
	// Without an ID the create may still have happened: remove by name.
	if target := cmp.Or(in.id, in.name); target != "" {
		err := engine.RetryBusy(ctx, func() error {
			return in.cli.ContainerRemove(ctx, target, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}, engine.IsStopping)
		if err != nil && !engine.IsGone(err) {
			in.d.remember(leftover.Container, target, err)
			errs = append(errs, fmt.Errorf("sandbox: remove container %s: %w", shortID(target), err))
		}
	}
	if in.attach.Conn != nil {
		in.attach.Close()
	}
	if err := in.removeNetwork(ctx); err != nil {
		errs = append(errs, err)
	}
	if in.volume != "" {
		if err := removeVolume(ctx, in.cli, in.volume); err != nil {
			in.d.remember(leftover.Volume, in.volume, err)
			errs = append(errs, err)
		}
	}
	if in.leased() && len(errs) == 0 {
		// Opened from another process: what was made for it is known
		// by its label only.
		if err := removeMadeFor(ctx, in.cli, in.name); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		// The engine answers: remove what earlier removals on it could
		// not. Not the caller's failure if that fails again.
		sctx, cancel := context.WithTimeout(ctx, in.spec.Timeout)
		if n, err := in.d.sweep(sctx, in.cli); n > 0 || err != nil {
			in.spec.Log.LogAttrs(sctx, slog.LevelInfo, "sandbox.leftovers", slog.String("sandbox", in.id),
				slog.Int("removed", n), errAttr(err))
		}
		cancel()
	}
	if in.dev != nil {
		if err := in.dev.Release(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// remember records an object whose removal failed because the engine did
// not answer, for a later Remove or Prune to remove (the engine may still
// carry out a create it did not answer).
func (d *Driver) remember(kind, name string, err error) {
	if engine.IsUnreachable(err) || errors.Is(err, context.DeadlineExceeded) {
		d.left.Add(leftover.Object{Kind: kind, Name: name})
	}
}

// sweep removes the objects remembered (see remember), and remembers
// again those the engine still does not remove. It returns how many it
// removed.
func (d *Driver) sweep(ctx context.Context, cli engine.API) (int, error) {
	var n int
	var errs []error
	for _, o := range d.left.Take() {
		var err error
		switch o.Kind {
		case leftover.Container:
			err = cli.ContainerRemove(ctx, o.Name, container.RemoveOptions{Force: true, RemoveVolumes: true})
		case leftover.Network:
			err = cli.NetworkRemove(ctx, o.Name)
		case leftover.Volume:
			err = removeVolume(ctx, cli, o.Name)
		}
		switch {
		case err == nil:
			n++
		case engine.IsGone(err):
		default:
			d.left.Add(o)
			errs = append(errs, fmt.Errorf("sandbox: remove %s %s left by an unanswered request: %w", o.Kind, o.Name, err))
		}
	}
	return n, errors.Join(errs...)
}

// removeVolume removes a volume, waiting for an auto-removed container that
// still holds it to go away.
func removeVolume(ctx context.Context, cli engine.API, name string) error {
	// In use (a conflict): the container is still being removed.
	err := engine.RetryBusy(ctx, func() error {
		if err := cli.VolumeRemove(ctx, name, true); err != nil && !engine.IsNotFound(err) {
			return err
		}
		return nil
	}, engine.IsConflict)
	if err != nil {
		return fmt.Errorf("sandbox: remove volume %s: %w", name, err)
	}
	return nil
}

// readJSONStream drains a pull progress stream and returns its error. It
// calls step when a layer (or the image, id "") reaches a new status
// ("Pulling fs layer", "Download complete", ...), not for every byte.
func readJSONStream(r io.Reader, step func(id, status string)) error {
	dec := json.NewDecoder(r)
	last := map[string]string{}
	for {
		var m struct {
			Error  string `json:"error"`
			ID     string `json:"id"`
			Status string `json:"status"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if m.Status != "" && last[m.ID] != m.Status && len(last) < 1000 {
			last[m.ID] = m.Status
			step(m.ID, m.Status)
		}
	}
}

// msgQueueBytes bounds the bytes a sandbox's POSIX message queues may
// hold (RLIMIT_MSGQUEUE): the kernel's default.
const msgQueueBytes = 800 << 10

// ipcSysctls bound System V IPC in the sandbox's own IPC namespace: shared
// memory segments are destroyed when no process has them attached
// (shm_rmid_forced), so that memory detached segments hold always belongs
// to a process the OOM killer can end, and all segments together hold at
// most TmpSize; message queues at most 64 of 16 KiB.
func ipcSysctls(l driver.Resources) map[string]string {
	pages := max(l.TmpSize/4096, 1)
	return map[string]string{
		"kernel.shm_rmid_forced": "1",
		"kernel.shmall":          strconv.FormatInt(pages, 10),
		"kernel.shmmax":          strconv.FormatInt(pages*4096, 10),
		"kernel.msgmni":          "64",
		"kernel.msgmnb":          "16384",
	}
}

// podmanNPROC is the RLIMIT_NPROC a Podman sandbox gets (see
// podmanUlimits).
const podmanNPROC = 16384

// podmanUlimits are the limits Podman needs to be given: running as root it
// raises RLIMIT_NPROC to 4194304 by default (and RLIMIT_NOFILE to 1048576,
// unless OpenFiles sets it), which a host that caps root's limits refuses
// ("error setting rlimit"). RLIMIT_NPROC counts a user's processes on the
// whole host: sandbox users are uids of their own, the agent (root) is
// exempt, and PIDs stays the sandbox's bound.
func podmanUlimits() []*container.Ulimit {
	return []*container.Ulimit{{Name: "nproc", Soft: podmanNPROC, Hard: podmanNPROC}}
}
