package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// MaxFork is the largest n Fork accepts.
const MaxFork = 256

// forkConcurrency bounds how many sandboxes Fork creates at once.
const forkConcurrency = 8

// Snapshot is a saved state of a sandbox: an image holding its working
// directory, plus the sandbox's settings. New and Fork start sandboxes from
// it. A Snapshot is safe for concurrent use.
//
// A snapshot captures:
//   - the working directory, whole (files, directories, empty ones too,
//     symbolic links whatever they point to, hard links, permissions and
//     modification times of files), which is also HOME, so packages
//     installed with pip install --user, virtual environments and tools'
//     dotfiles are kept; restored files belong to the sandbox user;
//   - the settings: image, limits, user, working directory, environment
//     (WithEnv), runtime and labels.
//
// It does not capture running processes, /tmp (a tmpfs) or anything else
// outside the working directory (the root filesystem is read-only, so
// nothing else can have changed), open connections, or FIFOs, sockets and
// devices in the working directory. Restored sandboxes
// log to the source's logger unless given WithLogger.
type Snapshot struct {
	id   string
	cfg  config // the source's settings
	base string // the image the source sandbox was made from

	mu      sync.Mutex
	users   int  // sandboxes running from this snapshot in this process
	removed bool // Remove was called; delete the image when users drops to 0
}

// ID returns the snapshot's image ID.
func (sn *Snapshot) ID() string { return sn.id }

// Snapshot saves the sandbox's working directory and settings. Nothing in
// the sandbox runs while its files are copied, so they are consistent, and
// it keeps running afterwards. The snapshot carries the library's labels,
// so Prune removes it if this process dies without calling Remove. On
// Docker it is an image (the source's image and one layer); a backend
// without snapshots gives an error wrapping ErrUnsupported.
func (s *Sandbox) Snapshot(ctx context.Context) (_ *Snapshot, err error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot", slog.String("sandbox", s.id),
			slog.Duration("duration", time.Since(start)), errAttr(err))
	}()
	sn, ok := s.drv.(driver.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("sandbox: Snapshot: %w (%T)", ErrUnsupported, s.drv)
	}
	id, err := sn.Snapshot(ctx, s.inst, driver.SnapshotRequest{
		Base: s.base, Workdir: s.cfg.workdir, MaxBytes: s.snapshotBound(), Timeout: s.cfg.timeout,
	})
	if err != nil {
		return nil, s.backendErr("snapshot", err)
	}
	cfg := s.cfg
	cfg.env = append([]string(nil), s.cfg.env...)
	cfg.snapshot, cfg.base = "", ""
	return &Snapshot{id: id, cfg: cfg, base: s.base}, nil
}

// snapshotBound is how many bytes of file contents a snapshot of the
// working directory may hold: what the disk limit lets the sandbox store,
// or, for a tmpfs working directory, what its memory limit does. Only
// sparse files can make the contents larger, and a snapshot would store
// their holes in full.
func (s *Sandbox) snapshotBound() int64 {
	if l := s.cfg.limits; l.Disk > 0 {
		return l.Disk
	} else if l.Memory > 0 {
		return l.Memory
	}
	return 0
}

// restoreWorkdir fills the fresh working directory with the snapshot's
// files, through the agent, which extracts as the sandbox user and keeps
// every link as it was (an engine's archive upload refuses links that
// point outside the directory it extracts into: "cache -> ../tmp",
// "python -> /usr/bin/python3").
func (s *Sandbox) restoreWorkdir(ctx context.Context, id string) error {
	sn, ok := s.drv.(driver.Snapshotter)
	if !ok {
		return fmt.Errorf("sandbox: restore: %w (%T)", ErrUnsupported, s.drv)
	}
	rc, err := sn.ReadSnapshot(ctx, id, s.inst, s.cfg.timeout)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = s.fileOp(ctx, wire.FileRequest{Op: wire.Untar, Path: []byte(s.cfg.workdir)}, func(op *agentconn.FileOp) error {
		if _, err := io.Copy(op, rc); err != nil {
			return err
		}
		return op.CloseInput()
	})
	if err != nil {
		return &fs.PathError{Op: "restore", Path: s.cfg.workdir, Err: err}
	}
	return nil
}

// New starts a sandbox from the snapshot: its working directory holds the
// snapshot's files, on a fresh disk of its own, and it has the source's
// settings (limits, user, working directory, environment, runtime, labels)
// and hardening unless opts override them. Options apply on top of the
// source's settings: WithEnv adds to the source's environment. Restoring
// into a Limits.Disk smaller than the files fails with ENOSPC.
func (sn *Snapshot) New(ctx context.Context, opts ...Option) (*Sandbox, error) {
	sb, err := sn.start(ctx, opts)
	if err == nil {
		sb.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.restore", slog.String("sandbox", sb.id), slog.String("snapshot", sn.id))
	}
	return sb, err
}

func (sn *Snapshot) start(ctx context.Context, opts []Option) (*Sandbox, error) {
	if err := sn.acquire(); err != nil {
		return nil, err
	}
	cfg := sn.cfg
	cfg.env = append([]string(nil), sn.cfg.env...)
	cfg.labels = maps.Clone(sn.cfg.labels)
	cfg.limits = Limits{}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			sn.release()
			return nil, err
		}
	}
	cfg.limits = cfg.limits.merge(sn.cfg.limits)
	if err := cfg.limits.validate(); err != nil {
		sn.release()
		return nil, err
	}
	cfg.image, cfg.snapshot, cfg.base = sn.id, sn.id, sn.base
	sb, err := create(ctx, cfg)
	if err != nil {
		sn.release()
		if errors.Is(err, ErrImageNotFound) {
			return nil, fmt.Errorf("sandbox: snapshot %s was removed: %w", shortID(sn.id), err)
		}
		return nil, err
	}
	sb.release = sn.release // when it is closed
	if err := sb.restoreWorkdir(ctx, sn.id); err != nil {
		sb.Close()
		return nil, err
	}
	return sb, nil
}

// Fork starts n sandboxes from the snapshot concurrently (at most 8 at a
// time) and returns them all, or none: if any fails, the ones already made
// are closed and the error names the failing fork. n must be between 1 and
// MaxFork.
func (sn *Snapshot) Fork(ctx context.Context, n int, opts ...Option) ([]*Sandbox, error) {
	if n < 1 || n > MaxFork {
		return nil, fmt.Errorf("sandbox: Fork: n = %d, want 1 to %d", n, MaxFork)
	}
	start := time.Now()
	sbs := make([]*Sandbox, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(forkConcurrency)
	for i := range n {
		g.Go(func() error {
			sb, err := sn.start(gctx, opts)
			if err != nil {
				return fmt.Errorf("sandbox: Fork: sandbox %d of %d: %w", i+1, n, err)
			}
			sbs[i] = sb
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		for _, sb := range sbs {
			sb.Close()
		}
		return nil, err
	}
	log := sbs[0].log // the fork record goes to the forks' logger
	log.LogAttrs(ctx, slog.LevelInfo, "sandbox.fork", slog.String("snapshot", sn.id),
		slog.Int("n", n), slog.Duration("duration", time.Since(start)))
	return sbs, nil
}

// acquire counts a new sandbox using the snapshot.
func (sn *Snapshot) acquire() error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.removed {
		return fmt.Errorf("%w: snapshot %s was removed", ErrImageNotFound, shortID(sn.id))
	}
	sn.users++
	return nil
}

// release uncounts a sandbox and deletes the image if Remove was called
// and this was the last user.
func (sn *Snapshot) release() {
	sn.mu.Lock()
	sn.users--
	last := sn.users == 0 && sn.removed
	sn.mu.Unlock()
	if last {
		sn.deleteImage(context.Background())
	}
}

// Remove deletes the snapshot. Sandboxes already started from it keep
// running; its image is deleted once the last of them (in this process)
// is closed. New and Fork fail after Remove.
func (sn *Snapshot) Remove(ctx context.Context) error {
	sn.mu.Lock()
	if sn.removed {
		sn.mu.Unlock()
		return nil
	}
	sn.removed = true
	inUse := sn.users > 0
	sn.mu.Unlock()
	var err error
	if !inUse {
		err = sn.deleteImage(ctx)
	}
	sn.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot.remove", slog.String("snapshot", sn.id),
		slog.Bool("deferred", inUse), errAttr(err))
	return err
}

func (sn *Snapshot) deleteImage(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	d, own := sn.cfg.backend()
	if own {
		defer d.Close()
	}
	st, ok := d.(driver.Snapshotter)
	if !ok {
		return fmt.Errorf("sandbox: remove snapshot: %w (%T)", ErrUnsupported, d)
	}
	return st.RemoveSnapshot(ctx, sn.id)
}
