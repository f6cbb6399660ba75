package sandbox

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/internal/agentbin"
	"github.com/agentsandbox/sandbox/internal/engine"
)

// Every sandbox's main process is the library's agent (internal/agent),
// mounted read-only from a volume that holds the binary for the engine's
// architecture. The volume is named by the binary's hash, filled once per
// engine, and shared by all sandboxes: the image is never changed, and any
// image works, even one without a shell.

// agentDir is where the agent's volume is mounted in every sandbox.
const agentDir = "/.sandbox-agent"

// agentCaps are the capabilities of the sandbox's container, which only the
// agent (root, non-dumpable) holds: commands run as the sandbox user with
// none, and an empty bounding set. KILL for the kill of a command's
// processes, SETUID and SETGID to start commands and run file operations
// as the sandbox user, SETPCAP to empty the bounding set, CHOWN to give
// the working directory to the sandbox user at start (then dropped). (Not
// SYS_RESOURCE, which would pin commands' oom_score_adj above the
// agent's: many hosts, this project's test machines among them, do not
// have it to give, and a container asking for it does not start.)
var agentCaps = []string{"KILL", "SETUID", "SETGID", "SETPCAP", "CHOWN"}

var (
	agentReady sync.Map   // engine address + volume name -> struct{}: filled and checked
	agentFill  sync.Mutex // one fill at a time in this process
)

// agentVolume returns the name of the volume holding the agent for the
// engine's architecture, creating and filling it if needed. Concurrent
// fills, from this process or others, are safe: the binary is written
// under a name of its own and then linked into place.
func (s *Sandbox) agentVolume(ctx context.Context) (string, error) {
	info, err := s.engineInfo(ctx)
	if err != nil {
		return "", err
	}
	bin, hash, err := agentbin.Binary(info.Arch)
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	name := cmp.Or(s.cfg.agentVolume, "agentsandbox-agent-"+hash)
	key := engine.Host(s.cfg.host) + "|" + name
	if _, ok := agentReady.Load(key); ok {
		return name, nil
	}
	agentFill.Lock()
	defer agentFill.Unlock()
	if _, ok := agentReady.Load(key); ok {
		return name, nil
	}
	// A cache, like an image: it carries the library's mark but no owner,
	// so Prune and leak checks leave it alone.
	labels := engine.Labels("agent", nil)
	delete(labels, engine.LabelOwner)
	dctx, cancel := detached(ctx)
	defer cancel()
	if _, err := s.cli.VolumeCreate(dctx, volume.CreateOptions{Name: name, Labels: labels}); err != nil {
		return "", s.engineErr("create agent volume", err)
	}
	helper := objectName("agentfill")
	hl := engine.Labels("helper", nil)
	_, err = s.cli.ContainerCreate(dctx,
		&container.Config{Image: s.cfg.image, Entrypoint: []string{agentDir + "/agent"}, Labels: hl, NetworkDisabled: true},
		&container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: name, Target: agentDir}}},
		nil, nil, helper)
	defer s.removeHelper(ctx, helper)
	if err != nil {
		return "", s.engineErr("create agent volume: helper container", err)
	}
	if ok, err := s.agentPresent(ctx, helper, bin); err != nil {
		return "", err
	} else if !ok {
		if err := s.copyTo(ctx, helper, agentDir, agentArchive(bin)); err != nil {
			return "", s.engineErr("create agent volume: copy", err)
		}
		if ok, err := s.agentPresent(ctx, helper, bin); err != nil || !ok {
			return "", fmt.Errorf("sandbox: the agent volume %s does not hold the agent after filling it (%v)", name, err)
		}
	}
	agentReady.Store(key, struct{}{})
	return name, nil
}

// forgetAgentVolume drops the knowledge that the agent's volume is filled:
// it was found missing or empty (removed behind the library's back, and
// made anew, empty, by the engine when a container mounted it).
func (s *Sandbox) forgetAgentVolume(name string) {
	agentReady.Delete(engine.Host(s.cfg.host) + "|" + name)
}

// agentPresent reports whether the agent in helper's volume is bin.
func (s *Sandbox) agentPresent(ctx context.Context, helper string, bin []byte) (bool, error) {
	rc, err := s.copyFrom(ctx, helper, agentDir+"/agent")
	if engine.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, s.engineErr("check agent volume", err)
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

// engineInfos caches what an engine said of itself, by address.
var engineInfos sync.Map // engine address -> engine.Info

// engineInfo returns what the engine says of itself: its architecture
// ("amd64", "arm64") and whether it is Podman.
func (s *Sandbox) engineInfo(ctx context.Context) (engine.Info, error) {
	host := engine.Host(s.cfg.host)
	if i, ok := engineInfos.Load(host); ok {
		return i.(engine.Info), nil
	}
	v, err := s.cli.ServerVersion(ctx)
	if err != nil {
		return engine.Info{}, s.engineErr("engine version", err)
	}
	info := engine.InfoOf(v)
	engineInfos.Store(host, info)
	return info, nil
}
