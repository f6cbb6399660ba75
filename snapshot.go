package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/blob"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// MaxFork is the largest n Fork accepts.
const MaxFork = 256

// forkConcurrency bounds how many sandboxes Fork creates at once.
const forkConcurrency = 8

// Snapshot is a saved state of a sandbox: its working directory's files,
// kept by the library, plus the sandbox's settings. New and Fork start
// sandboxes from it. A Snapshot is safe for concurrent use.
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
// It does not capture running processes or their memory (an Interpreter's
// variables are lost), /tmp (a tmpfs) or anything else outside the
// working directory (the root filesystem is read-only, so nothing else
// can have changed), open connections, or FIFOs, sockets and devices in
// the working directory. Restored sandboxes log to the source's logger
// unless given WithLogger.
//
// The content is kept in this process, in a temporary file without a name
// (in os.TempDir, so under TMPDIR), of at most the source's disk limit of
// file contents: it takes no engine time to make or to restore from, works
// the same on every backend, and is gone when the snapshot is removed or
// the process ends, however it ends (or when the garbage collector finds
// the Snapshot unreachable). WriteTo writes it, settings and all, as an
// archive that ReadSnapshot reads back in any process, on any machine;
// Image saves a copy on the engine (Docker) that outlives the process.
type Snapshot struct {
	content *blob.Blob
	cfg     config // the source's settings
	base    string // the image the source sandbox was made from
	source  string // the source sandbox's ID

	mu      sync.Mutex
	users   int  // sandboxes being restored or running from this snapshot
	removed bool // Remove was called: free the content when users drops to 0
	image   string
	commit  sync.Mutex // held while Image commits
}

// ID returns the snapshot's content digest ("sha256:" and hex): two
// snapshots of the same files, modes and times have the same ID.
func (sn *Snapshot) ID() string { return sn.content.Digest() }

// Size returns the size in bytes of the snapshot's content, a tar archive
// of the working directory.
func (sn *Snapshot) Size() int64 { return sn.content.Size() }

// Snapshot saves the sandbox's working directory and settings. The
// sandbox's agent stops every process in it (SIGSTOP) while it sends the
// files, so they are from one moment, and resumes them (SIGCONT)
// afterwards, also when the snapshot fails or ctx ends; no command starts
// meanwhile, and the engine is not involved, so the source keeps running
// on any backend. Processes that resume each other are stopped again
// until all are, and the agent proves that none ran while the files were
// read; if one did, the capture is tried again, and after a few attempts
// Snapshot fails with ErrNotStopped. What carries the library's frames
// (on Kubernetes, the exec'd relay) is never stopped. Files its user made unreadable to themselves (chmod 000) are
// read too, and keep their modes. More than the disk limit of file
// contents is an error wrapping ErrTooLarge, as is an archive whose
// entries' headers (names, link targets, times: about 1.5 KiB an entry
// with long names) take more than 64 MiB plus four times the disk limit;
// the error says which. The agent walks the tree a directory buffer at a
// time, relative to directory descriptors, so its memory does not grow
// with the number of names and paths longer than PATH_MAX are kept; a
// directory it cannot open for want of descriptors (a tree deeper than
// about Limits.OpenFiles levels) is kept empty, and a
// "sandbox.snapshot.skipped" record names it.
func (s *Sandbox) Snapshot(ctx context.Context) (_ *Snapshot, err error) {
	start := time.Now()
	var size int64
	defer func() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot", slog.String("sandbox", s.id),
			slog.Int64("bytes", size), slog.Duration("duration", time.Since(start)), errAttr(err))
	}()
	bound := s.snapshotBound()
	var content *blob.Blob
	var res wire.FileResult
	for attempt := 1; ; attempt++ {
		content, res, err = s.capture(ctx, bound)
		if err == nil || !errors.Is(err, ErrNotStopped) || ctx.Err() != nil {
			break
		}
		if attempt == snapshotAttempts {
			err = fmt.Errorf("snapshot: %d attempts: %w", attempt, err)
			break
		}
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrFileTooLarge):
			// The agent's reason: file contents over the disk limit, or
			// entries' headers over their bound (see wire.CaptureHeaderBound).
			err = fmt.Errorf("%w: snapshot: %v", ErrTooLarge, err)
		case errors.Is(err, blob.ErrTooLarge):
			err = fmt.Errorf("%w: snapshot: the archive sent is larger than %d bytes (%d of file contents, the disk limit, and %d of entries' headers): %v",
				ErrTooLarge, archiveBound(bound), bound, wire.CaptureHeaderBound(bound), err)
		case errors.Is(err, ErrSandboxGone), errors.Is(err, ErrUnresponsive), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
			errors.Is(err, ErrNotStopped):
		default:
			err = &fs.PathError{Op: "snapshot", Path: s.cfg.workdir, Err: err}
		}
		return nil, err
	}
	size = content.Size()
	if res.Skips > 0 {
		s.log.LogAttrs(ctx, slog.LevelWarn, "sandbox.snapshot.skipped", slog.String("sandbox", s.id),
			slog.Int64("entries", res.Skips), slog.Any("first", skippedNames(res.Skipped)))
	}
	cfg := s.cfg
	cfg.env = append([]string(nil), s.cfg.env...)
	cfg.snapshot, cfg.base, cfg.take = "", "", nil
	sn := &Snapshot{content: content, cfg: cfg, base: s.base, source: s.id}
	// Forgotten without Remove: its file is closed with it.
	runtime.AddCleanup(sn, func(b *blob.Blob) { b.Close() }, content)
	return sn, nil
}

// snapshotAttempts is how many captures Snapshot tries when the agent
// finds that a process of the sandbox ran while the files were read.
const snapshotAttempts = 3

// capture has the agent stop the sandbox's processes and send an archive
// of the working directory, kept in a blob. It fails with ErrNotStopped
// if a process ran meanwhile (the archive may mix moments).
func (s *Sandbox) capture(ctx context.Context, bound int64) (*blob.Blob, wire.FileResult, error) {
	var content *blob.Blob
	res, err := s.fileOp(ctx, wire.FileRequest{Op: wire.Capture, Path: []byte(s.cfg.workdir), Limit: bound}, func(op *agentconn.FileOp) error {
		var err error
		content, err = blob.Write("", op, archiveBound(bound))
		return err
	})
	if err != nil {
		if content != nil {
			content.Close()
		}
		return nil, res, err
	}
	return content, res, nil
}

// snapshotBound is how many bytes of file contents a snapshot of the
// working directory may hold: what the disk limit lets the sandbox store,
// or, for a tmpfs working directory, what its memory limit does. Only
// sparse files can make the contents larger, and a snapshot would store
// their holes in full.
func (s *Sandbox) snapshotBound() int64 { return contentBound(s.cfg.limits) }

// contentBound is snapshotBound for a sandbox of limits l.
func contentBound(l Limits) int64 {
	if l.Disk > 0 {
		return l.Disk
	} else if l.Memory > 0 {
		return l.Memory
	}
	return 0
}

// archiveBound bounds the archive of at most contents bytes of file
// contents: those plus the entries' headers (the agent bounds both, and
// says which was too large; this bounds what the library stores whatever
// it is sent).
func archiveBound(contents int64) int64 {
	if contents <= 0 {
		return 0
	}
	return contents + wire.CaptureHeaderBound(contents) + wire.CaptureSlack
}

// restoreWorkdir fills the fresh working directory with the snapshot's
// files, through the agent, which extracts as the sandbox user and keeps
// every link as it was.
func (s *Sandbox) restoreWorkdir(ctx context.Context, sn *Snapshot) error {
	_, err := s.fileOp(ctx, wire.FileRequest{Op: wire.Untar, Path: []byte(s.cfg.workdir)}, func(op *agentconn.FileOp) error {
		if _, err := io.Copy(op, sn.content.Reader()); err != nil {
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
//
// With WithPool, the sandbox is one of the pool's, already started, and
// New only fills its working directory: the pool's sandboxes must have
// the settings the snapshot's would (see WithPool).
func (sn *Snapshot) New(ctx context.Context, opts ...Option) (*Sandbox, error) {
	sb, err := sn.start(ctx, opts)
	if err == nil {
		sb.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.restore", slog.String("sandbox", sb.id), slog.String("snapshot", sn.ID()))
	}
	return sb, err
}

func (sn *Snapshot) start(ctx context.Context, opts []Option) (*Sandbox, error) {
	cfg, err := sn.cfg.with(opts)
	if err != nil {
		return nil, err
	}
	cfg.image, cfg.snapshot, cfg.base = sn.base, sn.ID(), sn.base
	if err := sn.acquire(); err != nil {
		return nil, err
	}
	var sb *Sandbox
	if cfg.take != nil {
		sb, err = cfg.take(ctx, &cfg)
	} else {
		sb, err = create(ctx, cfg)
	}
	defer sn.release() // the content is needed until it is restored
	if err != nil {
		return nil, err
	}
	if err := sb.restoreWorkdir(ctx, sn); err != nil {
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
	log.LogAttrs(ctx, slog.LevelInfo, "sandbox.fork", slog.String("snapshot", sn.ID()),
		slog.Int("n", n), slog.Duration("duration", time.Since(start)))
	return sbs, nil
}

// acquire counts a new sandbox using the snapshot.
func (sn *Snapshot) acquire() error {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.removed {
		return fmt.Errorf("%w: %s (Snapshot.Remove was called; take a new snapshot)", ErrSnapshotRemoved, sn.ID())
	}
	sn.users++
	return nil
}

// release uncounts a sandbox and frees the content if Remove was called
// and this was the last user.
func (sn *Snapshot) release() {
	sn.mu.Lock()
	sn.users--
	last := sn.users == 0 && sn.removed
	sn.mu.Unlock()
	if last {
		sn.content.Close()
	}
}

// Image saves the snapshot on the engine, once, and returns the engine's
// ID for it. On Docker it is an image: the source's image and one layer
// holding the working directory under /.agentsandbox/workdir, labelled as
// the library's (so Prune removes it once this process has ended, unless
// it was tagged), which docker tag and docker push take like any other.
// Restores do not use it. A backend without such images gives an error
// wrapping ErrUnsupported.
func (sn *Snapshot) Image(ctx context.Context) (string, error) {
	sn.commit.Lock()
	defer sn.commit.Unlock()
	if err := sn.acquire(); err != nil {
		return "", err
	}
	defer sn.release()
	sn.mu.Lock()
	id := sn.image
	sn.mu.Unlock()
	if id != "" {
		return id, nil
	}
	start := time.Now()
	d, own, err := sn.cfg.backend()
	if err != nil {
		return "", fmt.Errorf("sandbox: snapshot image: %w", err)
	}
	if own {
		defer d.Close()
	}
	st, ok := d.(driver.Snapshotter)
	if !ok {
		return "", fmt.Errorf("sandbox: snapshot image: %w (%T)", ErrUnsupported, d)
	}
	id, err = st.CommitSnapshot(ctx, driver.CommitRequest{
		Base: sn.base, Content: sn.content.Reader(), Source: sn.source, Timeout: sn.cfg.timeout,
	})
	sn.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot.image", slog.String("snapshot", sn.ID()),
		slog.String("image", id), slog.Duration("duration", time.Since(start)), errAttr(err))
	if err != nil {
		return "", fmt.Errorf("sandbox: snapshot image: %w", err)
	}
	sn.mu.Lock()
	sn.image = id
	sn.mu.Unlock()
	return id, nil
}

// Remove deletes the snapshot: its content once the last sandbox being
// restored from it has its files (sandboxes restored from it keep
// running), and its image if Image made one. New, Fork and Image fail
// after Remove with an error wrapping ErrSnapshotRemoved; Remove again
// does nothing.
func (sn *Snapshot) Remove(ctx context.Context) error {
	sn.commit.Lock() // not while Image commits
	defer sn.commit.Unlock()
	sn.mu.Lock()
	if sn.removed {
		sn.mu.Unlock()
		return nil
	}
	sn.removed = true
	inUse := sn.users > 0
	image := sn.image
	sn.mu.Unlock()
	if !inUse {
		sn.content.Close()
	}
	var err error
	if image != "" {
		err = sn.deleteImage(ctx, image)
	}
	sn.cfg.logger.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot.remove", slog.String("snapshot", sn.ID()),
		slog.Bool("deferred", inUse), slog.String("image", image), errAttr(err))
	return err
}

func (sn *Snapshot) deleteImage(ctx context.Context, image string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultTimeout)
	defer cancel()
	d, own, err := sn.cfg.backend()
	if err != nil {
		return fmt.Errorf("sandbox: remove snapshot: %w", err)
	}
	if own {
		defer d.Close()
	}
	st, ok := d.(driver.Snapshotter)
	if !ok {
		return fmt.Errorf("sandbox: remove snapshot: %w (%T)", ErrUnsupported, d)
	}
	return st.RemoveSnapshot(ctx, image)
}
