package sandbox

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/leftover"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// snapshotDir is where a snapshot image keeps the working directory; a
// restored sandbox copies it from there into its own fresh disk.
const snapshotDir = "/.agentsandbox/workdir"

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

// Snapshot saves the sandbox's working directory and settings. The sandbox
// is paused while its files are copied, so they are consistent, and keeps
// running afterwards. The snapshot's image carries the library's labels, so
// Prune removes it if this process dies without calling Remove.
func (s *Sandbox) Snapshot(ctx context.Context) (_ *Snapshot, err error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	start := time.Now()
	defer func() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.snapshot", slog.String("sandbox", s.id),
			slog.Duration("duration", time.Since(start)), errAttr(err))
	}()
	// A container that will only receive the files: never started. Removed
	// by name, which is known even if the create's answer is lost.
	tmpName := objectName("snapshot-build")
	dctx, cancel := detached(ctx)
	tmp, err := s.cli.ContainerCreate(dctx, &container.Config{
		Image:      s.base,
		Entrypoint: []string{"/bin/sh"},
		Labels:     engine.Labels("snapshot-build", nil),
	}, &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}}, nil, nil, tmpName)
	cancel()
	defer s.removeHelper(ctx, tmpName)
	if err != nil {
		return nil, s.engineErr("snapshot: create", err)
	}
	if err := ctxErr(ctx, "snapshot: create"); err != nil {
		return nil, err
	}

	// The sandbox must never stay paused. A pause request cut short by ctx
	// may still be carried out, so it is not cancelled with ctx; and when
	// it fails without the engine's word that nothing was paused (no answer
	// in time, connection lost), it is undone just in case.
	dctx, cancel = detached(ctx)
	err = s.cli.ContainerPause(dctx, s.id)
	cancel()
	if err != nil {
		if !engine.IsConflict(err) && !engine.IsNotFound(err) {
			s.cli.ContainerUnpause(context.WithoutCancel(ctx), s.id)
		}
		return nil, s.engineErr("snapshot: pause", err)
	}
	err = ctxErr(ctx, "snapshot: pause")
	if err == nil {
		err = s.copyWorkdir(ctx, tmp.ID)
	}
	if uerr := s.cli.ContainerUnpause(context.WithoutCancel(ctx), s.id); uerr != nil && err == nil {
		err = s.engineErr("snapshot: unpause", uerr)
	}
	if err != nil {
		return nil, err
	}
	// The engine answers a commit only once the layer is written, which
	// takes longer the more files there are: a client with a longer bound.
	dctx, cancel = detached(ctx)
	defer cancel()
	ccli, err := connect(dctx, s.cfg.host, commitTimeout)
	if err != nil {
		return nil, err
	}
	defer ccli.Close()
	img, err := ccli.ContainerCommit(dctx, tmp.ID, container.CommitOptions{
		Comment: "agentsandbox snapshot of " + shortID(s.id),
		Config: &container.Config{
			Labels: engine.Labels("snapshot", map[string]string{"dev.agentsandbox.source": s.id}),
		},
	})
	if err != nil {
		return nil, s.engineErr("snapshot: commit", err)
	}
	if err := ctxErr(ctx, "snapshot: commit"); err != nil {
		s.cli.ImageRemove(context.WithoutCancel(ctx), img.ID, image.RemoveOptions{})
		return nil, err
	}
	cfg := s.cfg
	cfg.env = append([]string(nil), s.cfg.env...)
	cfg.restore = nil
	return &Snapshot{id: img.ID, cfg: cfg, base: s.base}, nil
}

// removeHelper removes a never-started helper container by name (it may not
// exist: its create failed), whatever ctx says.
func (s *Sandbox) removeHelper(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.timeout)
	defer cancel()
	err := s.cli.ContainerRemove(ctx, name, container.RemoveOptions{Force: true})
	if err != nil && !engine.IsGone(err) {
		s.remember(leftover.Container, name, err)
	}
}

// copyWorkdir streams the sandbox's working directory into snapshotDir of
// container dst.
func (s *Sandbox) copyWorkdir(ctx context.Context, dst string) error {
	rc, err := s.copyFrom(ctx, s.id, s.cfg.workdir)
	if err != nil {
		return s.engineErr("snapshot: read workdir", err)
	}
	defer rc.Close()
	pr, pw := io.Pipe()
	rerr := make(chan error, 1)
	go func() {
		// Entries are named base(workdir)/...; move them under snapshotDir.
		err := rebase(pw, rc, path.Base(s.cfg.workdir), strings.TrimPrefix(snapshotDir, "/"), true, s.snapshotBound())
		pw.CloseWithError(err)
		rerr <- err
	}()
	err = s.copyTo(ctx, dst, "/", pr)
	pr.CloseWithError(errors.New("aborted"))
	rc.Close() // ends a rebase still reading
	if e := <-rerr; errors.Is(e, ErrTooLarge) {
		return e
	}
	if err != nil {
		return s.engineErr("snapshot: write workdir", err)
	}
	return nil
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

// rebase copies a tar stream, renaming entries under from to be under to
// ("" for the top). With parents, it first adds the directories leading to
// to. With maxBytes > 0, file contents beyond maxBytes in all are an error
// wrapping ErrTooLarge.
func rebase(w io.Writer, r io.Reader, from, to string, parents bool, maxBytes int64) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	var total int64
	if parents {
		dir := ""
		for _, part := range strings.Split(path.Dir(to), "/") {
			dir = path.Join(dir, part)
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755, ModTime: time.Now()}); err != nil {
				return err
			}
		}
	}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		rest, ok := strings.CutPrefix(name, from)
		if !ok || (rest != "" && rest[0] != '/') {
			return fmt.Errorf("unexpected entry %q", hdr.Name)
		}
		rest = strings.TrimPrefix(rest, "/")
		switch {
		case rest == "" && to == "":
			continue // the top directory itself: the destination exists
		case to == "":
			hdr.Name = rest
		default:
			hdr.Name = path.Join(to, rest)
		}
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if hdr.Typeflag == tar.TypeLink {
			if lrest, ok := strings.CutPrefix(hdr.Linkname, from+"/"); ok {
				hdr.Linkname = path.Join(to, lrest)
			}
		}
		if total += hdr.Size; maxBytes > 0 && total > maxBytes {
			return fmt.Errorf("%w: snapshot: the working directory's files add up to more than %d bytes (the disk limit) at %q; sparse files count in full",
				ErrTooLarge, maxBytes, rest)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// restoreWorkdir fills the fresh working directory from snapshotDir. The
// files are read from a never-started container of the snapshot image, not
// from the sandbox's own: the engine locks a container while an archive is
// read from it, so writing into the container being read would deadlock as
// soon as the files outgrow the connection's buffers.
func (s *Sandbox) restoreWorkdir(ctx context.Context) error {
	srcName := s.name + "-restore"
	dctx, cancel := detached(ctx)
	src, err := s.cli.ContainerCreate(dctx, &container.Config{
		Image:      s.cfg.image,
		Entrypoint: []string{"/bin/sh"},
		Labels:     engine.Labels("snapshot-read", nil),
	}, &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}}, nil, nil, srcName)
	cancel()
	defer s.removeHelper(ctx, srcName)
	if err != nil {
		return s.engineErr("restore: create reader", err)
	}
	if err := ctxErr(ctx, "restore: create reader"); err != nil {
		return err
	}
	rc, err := s.copyFrom(ctx, src.ID, snapshotDir)
	if err != nil {
		return s.engineErr("restore: read snapshot", err)
	}
	defer rc.Close()
	// Into the sandbox through its agent, which extracts as the sandbox
	// user and keeps every link as it was: the engine's archive upload
	// refuses links that point outside the directory it extracts into
	// ("cache -> ../tmp", "python -> /usr/bin/python3").
	_, err = s.fileOp(ctx, wire.FileRequest{Op: wire.Untar, Path: []byte(s.cfg.workdir)}, func(op *agentconn.FileOp) error {
		if err := rebase(op, rc, path.Base(snapshotDir), "", false, 0); err != nil {
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
	cfg.image = sn.id
	cfg.restore = sn
	sb, err := create(ctx, cfg) // on failure, its teardown releases sn
	if err != nil {
		if errors.Is(err, ErrImageNotFound) {
			return nil, fmt.Errorf("sandbox: snapshot %s was removed: %w", shortID(sn.id), err)
		}
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
	cli, err := connect(ctx, sn.cfg.host, sn.cfg.timeout)
	if err != nil {
		return err
	}
	defer cli.Close()
	// Conflict: a container of it (auto-removed) is still going away.
	err = engine.RetryBusy(ctx, func() error {
		_, err := cli.ImageRemove(ctx, sn.id, image.RemoveOptions{PruneChildren: true})
		if err != nil && engine.IsGone(err) {
			return nil
		}
		return err
	}, engine.IsConflict)
	if err != nil {
		return fmt.Errorf("sandbox: remove snapshot %s: %w", shortID(sn.id), err)
	}
	return nil
}
