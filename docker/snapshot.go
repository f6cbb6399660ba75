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
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
)

// snapshotDir is where a snapshot image keeps the working directory.
const snapshotDir = "/.agentsandbox/workdir"

// commitTimeout bounds the wait for a snapshot's commit: the engine answers
// only once the layer is written.
const commitTimeout = 5 * time.Minute

// CommitSnapshot saves req.Content as an image: req.Base and one layer
// holding the working directory's files under /.agentsandbox/workdir,
// labelled as the library's. The content is copied into a never-started
// container of req.Base, which is committed; the sandbox it was taken
// from is not involved. Podman's archive API refuses the layout, so there
// it is an error wrapping driver.ErrUnsupported.
func (d *Driver) CommitSnapshot(ctx context.Context, req driver.CommitRequest) (string, error) {
	if info, err := d.engineInfo(ctx); err != nil {
		return "", err
	} else if info.Podman {
		return "", fmt.Errorf("%w: snapshot images on Podman (its archive API refuses the snapshot's layout)", driver.ErrUnsupported)
	}
	cli, err := d.client(ctx)
	if err != nil {
		return "", err
	}
	// Removed by name, which is known even if the create's answer is lost.
	tmpName := objectName("snapshot-build")
	dctx, cancel := detached(ctx)
	tmp, err := cli.ContainerCreate(dctx, &container.Config{
		Image:      req.Base,
		Entrypoint: []string{"/bin/sh"},
		Labels:     owner.Labels("snapshot-build", nil),
	}, &container.HostConfig{NetworkMode: "none", LogConfig: container.LogConfig{Type: "none"}}, nil, nil, tmpName)
	cancel()
	defer d.removeHelper(ctx, cli, tmpName, req.Timeout)
	if err != nil {
		if engine.IsNotFound(err) {
			return "", fmt.Errorf("%w: the snapshot's base image %q is not on the engine at %s", driver.ErrImageNotFound, req.Base, d.Host())
		}
		return "", d.err("snapshot: create", err)
	}
	if err := ctxErr(ctx, "snapshot: create"); err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(underDir(pw, req.Content, strings.TrimPrefix(snapshotDir, "/"))) }()
	err = copyTo(ctx, cli, tmp.ID, "/", pr, req.Timeout)
	pr.CloseWithError(errors.New("aborted"))
	if err != nil {
		return "", d.err("snapshot: write the files", err)
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
		Comment: "agentsandbox snapshot of " + shortID(req.Source),
		Config: &container.Config{
			Labels: owner.Labels("snapshot", map[string]string{"dev.agentsandbox.source": req.Source}),
		},
	})
	if err != nil {
		return "", d.err("snapshot: commit", err)
	}
	if err := ctxErr(ctx, "snapshot: commit"); err != nil {
		cli.ImageRemove(context.WithoutCancel(ctx), img.ID, image.RemoveOptions{})
		return "", err
	}
	return img.ID, nil
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

// underDir copies a tar stream whose names are relative, moving every
// entry (and hard links' targets) under dir, after entries for dir and
// its parents.
func underDir(w io.Writer, r io.Reader, dir string) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	parent := ""
	for _, part := range strings.Split(dir, "/") {
		parent = path.Join(parent, part)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parent + "/", Mode: 0o755, ModTime: time.Now()}); err != nil {
			return err
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
		hdr.Name = path.Join(dir, hdr.Name)
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if hdr.Typeflag == tar.TypeLink {
			hdr.Linkname = path.Join(dir, hdr.Linkname)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}
