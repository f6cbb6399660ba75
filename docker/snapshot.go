package docker

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/engine"
)

// snapshotDir is where a snapshot image keeps the working directory.
const snapshotDir = "/.agentsandbox/workdir"

// commitTimeout bounds the wait for a snapshot's commit: the engine answers
// only once the layer is written.
const commitTimeout = 5 * time.Minute

// Snapshot pauses the sandbox's container while its working directory is
// copied into /.agentsandbox/workdir of a never-started container of
// req.Base, and commits that container: the snapshot is an image (base + one layer)
// that outlives the process, carries the library's labels, and can be
// tagged and pushed.
func (d *Driver) Snapshot(ctx context.Context, inst driver.Instance, req driver.SnapshotRequest) (string, error) {
	in, ok := inst.(*instance)
	if !ok || in.d != d {
		return "", errors.New("docker: Snapshot of an instance of another driver")
	}
	if info, err := d.engineInfo(ctx); err != nil {
		return "", err
	} else if info.Podman {
		return "", fmt.Errorf("%w: snapshots on Podman (its archive API refuses the snapshot's layout)", driver.ErrUnsupported)
	}
	cli := in.cli
	// A container that will only receive the files: never started. Removed
	// by name, which is known even if the create's answer is lost.
	tmpName := objectName("snapshot-build")
	dctx, cancel := detached(ctx)
	tmp, err := cli.ContainerCreate(dctx, &container.Config{
		Image:      req.Base,
		Entrypoint: []string{"/bin/sh"},
		Labels:     engine.Labels("snapshot-build", nil),
	}, &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}}, nil, nil, tmpName)
	cancel()
	defer d.removeHelper(ctx, cli, tmpName, req.Timeout)
	if err != nil {
		return "", in.err("snapshot: create", err)
	}
	if err := ctxErr(ctx, "snapshot: create"); err != nil {
		return "", err
	}

	// The sandbox must never stay paused. A pause request cut short by ctx
	// may still be carried out, so it is not cancelled with ctx; and when
	// it fails without the engine's word that nothing was paused (no answer
	// in time, connection lost), it is undone just in case.
	in.paused.Lock()
	dctx, cancel = detached(ctx)
	err = cli.ContainerPause(dctx, in.id)
	cancel()
	if err != nil {
		if !engine.IsConflict(err) && !engine.IsNotFound(err) {
			cli.ContainerUnpause(context.WithoutCancel(ctx), in.id)
		}
		in.paused.Unlock()
		return "", in.err("snapshot: pause", err)
	}
	err = ctxErr(ctx, "snapshot: pause")
	if err == nil {
		err = in.copyWorkdir(ctx, tmp.ID, req)
	}
	if uerr := cli.ContainerUnpause(context.WithoutCancel(ctx), in.id); uerr != nil && err == nil {
		err = in.err("snapshot: unpause", uerr)
	}
	in.paused.Unlock()
	if err != nil {
		return "", err
	}
	// The engine answers a commit only once the layer is written, which
	// takes longer the more files there are: a client with a longer bound.
	dctx, cancel = detached(ctx)
	defer cancel()
	ccli, err := d.longClient(dctx, commitTimeout)
	if err != nil {
		return "", err
	}
	defer ccli.Close()
	img, err := ccli.ContainerCommit(dctx, tmp.ID, container.CommitOptions{
		Comment: "agentsandbox snapshot of " + shortID(in.id),
		Config: &container.Config{
			Labels: engine.Labels("snapshot", map[string]string{"dev.agentsandbox.source": in.id}),
		},
	})
	if err != nil {
		return "", in.err("snapshot: commit", err)
	}
	if err := ctxErr(ctx, "snapshot: commit"); err != nil {
		cli.ImageRemove(context.WithoutCancel(ctx), img.ID, image.RemoveOptions{})
		return "", err
	}
	return img.ID, nil
}

// copyWorkdir streams the sandbox's working directory into snapshotDir of
// container dst.
func (in *instance) copyWorkdir(ctx context.Context, dst string, req driver.SnapshotRequest) error {
	rc, err := copyFrom(ctx, in.cli, in.id, req.Workdir, req.Timeout)
	if err != nil {
		return in.err("snapshot: read workdir", err)
	}
	defer rc.Close()
	pr, pw := io.Pipe()
	rerr := make(chan error, 1)
	go func() {
		// Entries are named base(workdir)/...; move them under snapshotDir.
		err := rebase(pw, rc, path.Base(req.Workdir), strings.TrimPrefix(snapshotDir, "/"), true, req.MaxBytes)
		pw.CloseWithError(err)
		rerr <- err
	}()
	err = copyTo(ctx, in.cli, dst, "/", pr, req.Timeout)
	pr.CloseWithError(errors.New("aborted"))
	rc.Close() // ends a rebase still reading
	if e := <-rerr; errors.Is(e, driver.ErrTooLarge) {
		return e
	}
	if err != nil {
		return in.err("snapshot: write workdir", err)
	}
	return nil
}

// ReadSnapshot returns the snapshot's files, read from a never-started
// container of its image (not from the sandbox being restored: the engine
// locks a container while an archive is read from it). Closing the reader
// removes that container.
func (d *Driver) ReadSnapshot(ctx context.Context, id string, into driver.Instance, timeout time.Duration) (io.ReadCloser, error) {
	cli, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	name := objectName("snapshot-read")
	if in, ok := into.(*instance); ok {
		name = in.name + "-restore" // named after the sandbox it fills
	}
	dctx, cancel := detached(ctx)
	src, err := cli.ContainerCreate(dctx, &container.Config{
		Image:      id,
		Entrypoint: []string{"/bin/sh"},
		Labels:     engine.Labels("snapshot-read", nil),
	}, &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}}, nil, nil, name)
	cancel()
	done := func() { d.removeHelper(ctx, cli, name, timeout) }
	if err == nil {
		err = ctxErr(ctx, "restore: create reader")
	}
	if err != nil {
		done()
		if engine.IsNotFound(err) {
			return nil, fmt.Errorf("%w: snapshot %s is not on the engine at %s", driver.ErrImageNotFound, shortID(id), d.Host())
		}
		return nil, d.err("restore: create reader", err)
	}
	rc, err := copyFrom(ctx, cli, src.ID, snapshotDir, timeout)
	if err != nil {
		done()
		return nil, d.err("restore: read snapshot", err)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(rebase(pw, rc, path.Base(snapshotDir), "", false, 0))
	}()
	return &snapReader{pr: pr, rc: rc, done: done}, nil
}

type snapReader struct {
	pr   *io.PipeReader
	rc   io.ReadCloser
	done func()
}

func (r *snapReader) Read(p []byte) (int, error) { return r.pr.Read(p) }
func (r *snapReader) Close() error {
	r.pr.CloseWithError(errors.New("closed"))
	r.rc.Close()
	r.done()
	return nil
}

// RemoveSnapshot deletes the snapshot's image.
func (d *Driver) RemoveSnapshot(ctx context.Context, id string) error {
	cli, err := d.client(ctx)
	if err != nil {
		return err
	}
	// Conflict: a container of it (auto-removed) is still going away.
	err = engine.RetryBusy(ctx, func() error {
		_, err := cli.ImageRemove(ctx, id, image.RemoveOptions{PruneChildren: true})
		if err != nil && engine.IsGone(err) {
			return nil
		}
		return err
	}, engine.IsConflict)
	if err != nil {
		return fmt.Errorf("sandbox: remove snapshot %s: %w", shortID(id), err)
	}
	return nil
}

// rebase copies a tar stream, renaming entries under from to be under to
// ("" for the top). With parents, it first adds the directories leading to
// to. With maxBytes > 0, file contents beyond maxBytes in all are an error
// wrapping driver.ErrTooLarge.
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
				driver.ErrTooLarge, maxBytes, rest)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}
