package docker

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver/agentbin"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/leftover"
)

// Every sandbox's main process is the library's agent (internal/agent),
// mounted read-only from a volume that holds the binary for the engine's
// architecture. The volume is named by the binary's hash, filled once per
// engine, and shared by all sandboxes: the image is never changed, and any
// image works, even one without a shell.

// agentDir is where the agent's volume is mounted in every sandbox.
const agentDir = "/.sandbox-agent"

// agentVolume returns the name of the volume holding the agent for the
// engine's architecture, creating and filling it (with a helper container
// of image) if needed. Concurrent fills, from this process or others, are
// safe: the binary is written under a name of its own and then linked into
// place.
func (d *Driver) agentVolume(ctx context.Context, cli engine.API, image string, timeout time.Duration) (string, error) {
	info, err := d.engineInfo(ctx)
	if err != nil {
		return "", err
	}
	bin, hash, err := agentbin.Binary(info.Arch)
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	name := cmp.Or(d.cfg.AgentVolume, "agentsandbox-agent-"+hash)
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	if d.agentReady[name] {
		return name, nil
	}
	// A cache, like an image: it carries the library's mark but no owner,
	// so Prune and leak checks leave it alone.
	labels := owner.Labels("agent", nil)
	delete(labels, owner.LabelOwner)
	dctx, cancel := detached(ctx)
	defer cancel()
	if _, err := cli.VolumeCreate(dctx, volume.CreateOptions{Name: name, Labels: labels}); err != nil {
		return "", d.err("create agent volume", err)
	}
	helper := objectName("agentfill")
	hl := owner.Labels("helper", nil)
	_, err = cli.ContainerCreate(dctx,
		&container.Config{Image: image, Entrypoint: []string{agentDir + "/agent"}, Labels: hl, NetworkDisabled: true},
		&container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: name, Target: agentDir}}},
		nil, nil, helper)
	defer d.removeHelper(ctx, cli, helper, timeout)
	if err != nil {
		return "", d.err("create agent volume: helper container", err)
	}
	if ok, err := d.agentPresent(ctx, cli, helper, bin, timeout); err != nil {
		return "", err
	} else if !ok {
		if err := copyTo(ctx, cli, helper, agentDir, agentArchive(bin), timeout); err != nil {
			return "", d.err("create agent volume: copy", err)
		}
		if ok, err := d.agentPresent(ctx, cli, helper, bin, timeout); err != nil || !ok {
			return "", fmt.Errorf("sandbox: the agent volume %s does not hold the agent after filling it (%v)", name, err)
		}
	}
	d.agentReady[name] = true
	return name, nil
}

// forgetAgentVolume drops the knowledge that the agent's volume is filled:
// it was found missing or empty (removed behind the library's back, and
// made anew, empty, by the engine when a container mounted it).
func (d *Driver) forgetAgentVolume(name string) {
	d.agentMu.Lock()
	delete(d.agentReady, name)
	d.agentMu.Unlock()
}

// agentPresent reports whether the agent in helper's volume is bin.
func (d *Driver) agentPresent(ctx context.Context, cli engine.API, helper string, bin []byte, timeout time.Duration) (bool, error) {
	rc, err := copyFrom(ctx, cli, helper, agentDir+"/agent", timeout)
	if engine.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, d.err("check agent volume", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			return false, nil
		}
		if h.Typeflag == tar.TypeReg && h.Size == int64(len(bin)) {
			got, err := io.ReadAll(io.LimitReader(tr, h.Size))
			return err == nil && bytes.Equal(got, bin), nil
		}
	}
}

// agentArchive is a tar archive that writes bin under a random name and
// then links it as "agent": the name appears only with the whole binary
// behind it, and a concurrent fill never writes into a file that a
// starting sandbox executes.
func agentArchive(bin []byte) io.Reader {
	var b [8]byte
	rand.Read(b[:])
	tmp := "agent." + hex.EncodeToString(b[:])
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	tw.WriteHeader(&tar.Header{Name: tmp, Mode: 0o555, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: now})
	tw.Write(bin)
	tw.WriteHeader(&tar.Header{Name: "agent", Linkname: tmp, Typeflag: tar.TypeLink, Mode: 0o555, ModTime: now})
	tw.Close()
	return &buf
}

// removeHelper removes a never-started helper container by name (it may not
// exist: its create failed), whatever ctx says. An engine that answers
// with a refusal is asked again until timeout (a cancelled copy can still
// hold the helper); a helper it did not remove is remembered, whatever
// the error, and removed by a later sweep.
func (d *Driver) removeHelper(ctx context.Context, cli engine.API, name string, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := engine.RetryBusy(ctx, func() error {
		return cli.ContainerRemove(ctx, name, container.RemoveOptions{Force: true})
	}, func(err error) bool { return !engine.IsGone(err) && !engine.IsUnreachable(err) })
	if err != nil && !engine.IsGone(err) {
		d.left.Add(leftover.Object{Kind: leftover.Container, Name: name})
	}
}

// copyTo streams the tar archive r into directory dir of container id. The
// upload is bounded by progress: it fails when the engine has taken nothing
// for timeout (a frozen engine stops reading).
func copyTo(ctx context.Context, cli engine.API, id, dir string, r io.Reader, timeout time.Duration) error {
	wctx, kick, stop := engine.Watch(ctx, timeout)
	defer stop()
	err := cli.CopyToContainer(wctx, id, dir, engine.Kicking(r, kick), container.CopyToContainerOptions{})
	return engine.Cause(wctx, err)
}

// copyFrom returns a tar archive of path p in container id. Every read of it
// is bounded: it fails when the engine sent nothing for timeout.
func copyFrom(ctx context.Context, cli engine.API, id, p string, timeout time.Duration) (io.ReadCloser, error) {
	rc, _, err := cli.CopyFromContainer(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return engine.IdleBounded(rc, timeout), nil
}
