package docker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/seccomp"
	"github.com/agentsandbox/sandbox/internal/disk"
	"github.com/agentsandbox/sandbox/internal/engine"
)

// Create makes and starts the sandbox's container with the agent as its
// main process and attaches to it.
func (d *Driver) Create(ctx context.Context, spec *driver.Spec) (_ driver.Instance, err error) {
	cli, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	in := &instance{d: d, cli: cli, spec: *spec, created: time.Now()}
	in.spec.Timeout = cmp.Or(in.spec.Timeout, d.cfg.Timeout)
	in.spec.Log = cmp.Or(in.spec.Log, slog.New(slog.DiscardHandler))
	in.image = spec.Image
	in.name = objectName("sandbox")
	if in.leased() {
		in.spec.Agent.Listen = agentSocket
	}
	if err := d.checkRuntime(ctx, spec.Runtime); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			in.Remove(context.WithoutCancel(ctx))
		}
	}()
	if err := in.ensureImage(ctx); err != nil {
		return nil, err
	}
	if err := in.createVolume(ctx); err != nil {
		return nil, err
	}
	if spec.Network == driver.NetworkOpen {
		if err := in.createOpenNetwork(ctx); err != nil {
			return nil, err
		}
	}
	err = in.createContainer(ctx)
	if errors.Is(err, errAgentMissing) {
		// The agent's volume was removed or emptied behind the library:
		// fill it again, once.
		in.discardContainer()
		err = in.createContainer(ctx)
	}
	if err != nil {
		return nil, err
	}
	return in, nil
}

func (in *instance) ensureImage(ctx context.Context) error {
	_, err := in.cli.ImageInspect(ctx, in.image)
	if err == nil {
		return nil
	}
	if !engine.IsNotFound(err) {
		return in.err("inspect image", err)
	}
	if !in.spec.Pull {
		return fmt.Errorf("%w: %q is not on the engine at %s, and the pull policy is PullNever: build it (docker build -t %s ...) or pull it (docker pull %s)",
			driver.ErrImageNotFound, in.image, in.d.Host(), in.image, in.image)
	}
	start := time.Now()
	log := in.spec.Log
	rc, err := in.cli.ImagePull(ctx, in.image, image.PullOptions{})
	if err == nil {
		rc = engine.IdleBounded(rc, in.spec.Timeout)
		err = readJSONStream(rc, func(id, status string) {
			log.LogAttrs(ctx, slog.LevelInfo, "sandbox.pull.progress", slog.String("image", in.image),
				slog.String("layer", id), slog.String("status", status))
		})
		rc.Close()
	}
	log.LogAttrs(ctx, slog.LevelInfo, "sandbox.pull", slog.String("image", in.image),
		slog.Duration("duration", time.Since(start)), errAttr(err))
	if err != nil {
		return fmt.Errorf("%w: %q is not on the engine and pulling it failed: %v (build it, or pull it with docker pull %s)",
			driver.ErrImageNotFound, in.image, err, in.image)
	}
	return nil
}

// createVolume makes the volume the working directory lives on: an ext4
// image of Resources.Disk bytes, a tmpfs of that size where there are no
// loop devices, or an unsized tmpfs when Disk is unlimited.
func (in *instance) createVolume(ctx context.Context) error {
	// The name is chosen here, not by the engine, so that Remove can
	// remove a volume whose create timed out but happened.
	info, err := in.d.engineInfo(ctx)
	if err != nil {
		return err
	}
	size := in.spec.Resources.Disk
	in.volume = objectName("workdir")
	opts := volume.CreateOptions{Name: in.volume, Driver: "local", Labels: in.labels("workdir", nil)}
	switch {
	case size > 0 && in.d.diskBacking() != nil:
		// No loop devices here (not root, or the engine is elsewhere): a
		// tmpfs of Disk bytes, which the engine mounts. Writes past it
		// fail with ENOSPC all the same.
		if info.Podman {
			// Podman takes a local volume's size option for a quota
			// its file system lacks: the container gets a tmpfs mount
			// of its own instead (see workdirMount).
			in.volume = ""
			return nil
		}
		opts.DriverOpts = map[string]string{"type": "tmpfs", "device": "tmpfs",
			"o": fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", size, driver.TmpfsInodes(size))}
	case size > 0:
		dev, err := disk.Create(ctx, size, 0, 0)
		if err != nil {
			return fmt.Errorf("sandbox: creating the %d-byte disk: %w", size, err)
		}
		in.dev = dev
		opts.DriverOpts = map[string]string{"type": "ext4", "device": dev.Path()}
	default:
		// No disk limit: a tmpfs volume (RAM, charged to the sandbox's
		// memory).
		opts.DriverOpts = map[string]string{"type": "tmpfs", "device": "tmpfs", "o": "mode=0755"}
	}
	dctx, cancel := detached(ctx)
	v, err := in.cli.VolumeCreate(dctx, opts)
	cancel()
	if err != nil {
		return in.err("create volume", err)
	}
	in.volume = v.Name
	return ctxErr(ctx, "create volume")
}

// workdirMount is the working directory's mount, its volume; without one
// (Podman without a loop device) it is a tmpfs of Resources.Disk in
// tmpfs, the container's tmpfs mounts (an option string: the mount API's
// TmpfsOptions has no inode bound).
func (in *instance) workdirMount(tmpfs map[string]string) []mount.Mount {
	if in.volume == "" {
		tmpfs[in.spec.Workdir] = tmpfsOpts(in.spec.Resources.Disk, "0755", false) // Podman
		return nil
	}
	return []mount.Mount{{Type: mount.TypeVolume, Source: in.volume, Target: in.spec.Workdir,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true}}}
}

// tmpfsOpts are the options of a tmpfs of size bytes that programs may
// run from: its size bounded, and its inodes (driver.TmpfsInodes) where
// the engine takes the option: Docker does, Podman (4.3) refuses
// nr_inodes ("unknown mount option"), so there a tmpfs's inodes are
// bounded only by Memory.
func tmpfsOpts(size int64, mode string, inodes bool) string {
	o := fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=%s", size, mode)
	if inodes {
		o += fmt.Sprintf(",nr_inodes=%d", driver.TmpfsInodes(size))
	}
	return o
}

func (in *instance) createContainer(ctx context.Context) error {
	r := in.spec.Resources
	argv, err := in.spec.Agent.Argv()
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	agentVol, err := in.d.agentVolume(ctx, in.cli, in.image, in.spec.Timeout)
	if err != nil {
		return err
	}
	info, err := in.d.engineInfo(ctx)
	if err != nil {
		return err
	}
	profile, err := json.Marshal(seccomp.Profile(info.Arch))
	if err != nil {
		return fmt.Errorf("sandbox: seccomp profile: %w", err)
	}
	secOpt := "seccomp=" + string(profile)
	if info.Podman {
		// Podman reads the profile from a file on its host (this one,
		// for a local socket).
		p, err := seccomp.File(os.TempDir(), profile)
		if err != nil {
			return fmt.Errorf("sandbox: seccomp profile for Podman: %w", err)
		}
		secOpt = "seccomp=" + p
	}
	cc := &container.Config{
		Image:        in.image,
		Entrypoint:   append([]string{agentDir + "/agent"}, argv...),
		User:         "0:0", // the agent; commands run as the sandbox user
		WorkingDir:   in.spec.Workdir,
		Env:          in.spec.Env,
		Labels:       in.sandboxLabels(),
		Hostname:     "sandbox",
		AttachStdin:  !in.leased(),
		AttachStdout: !in.leased(),
		AttachStderr: !in.leased(),
		OpenStdin:    !in.leased(), // a leased sandbox has no tether (see lease.go)
		StdinOnce:    !in.leased(),
	}
	hc := &container.HostConfig{
		AutoRemove: !in.leased(), // an ended leased sandbox stays known until Prune

		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		CapAdd:         driver.AgentCaps,
		SecurityOpt:    []string{"no-new-privileges:true", secOpt},
		ReadonlyRootfs: true,
		LogConfig:      container.LogConfig{Type: "none"},
		Runtime:        in.spec.Runtime,
		// /tmp and /dev/shm: RAM counted towards Memory, sizes and
		// inodes bounded. /dev/shm is a tmpfs of the container's own
		// (not ShmSize, which bounds no inodes) in a private IPC
		// namespace.
		IpcMode: container.IPCModePrivate,
		Tmpfs: map[string]string{
			"/tmp": tmpfsOpts(r.TmpSize, "1777", !info.Podman),
			// No programs run from /dev/shm, as with the engine's own.
			"/dev/shm": strings.Replace(tmpfsOpts(r.TmpSize, "1777", !info.Podman), ",exec,", ",noexec,", 1),
		},
		Mounts: []mount.Mount{{
			Type: mount.TypeVolume, Source: agentVol, Target: agentDir, ReadOnly: true,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true},
		}},
	}
	hc.Mounts = append(hc.Mounts, in.workdirMount(hc.Tmpfs)...)
	if info.Podman {
		// Podman mounts a writable tmpfs at /run and /var/tmp of a
		// container with a read-only root file system, places no limit
		// names: a read-only one of its own at each instead.
		for _, p := range []string{"/run", "/var/tmp"} {
			hc.Tmpfs[p] = "ro,nosuid,nodev,noexec,size=65536,mode=0755"
		}
	}
	if in.net != nil {
		hc.NetworkMode = container.NetworkMode(in.net.name)
	}
	res := &hc.Resources
	if r.CPUs > 0 {
		res.NanoCPUs = int64(r.CPUs * 1e9)
	}
	if r.Memory > 0 {
		res.Memory, res.MemorySwap = r.Memory, r.Memory
	}
	if r.PIDs > 0 {
		res.PidsLimit = &r.PIDs
	}
	if r.FileSize > 0 {
		res.Ulimits = append(res.Ulimits, &container.Ulimit{Name: "fsize", Soft: r.FileSize, Hard: r.FileSize})
	}
	if r.OpenFiles > 0 {
		res.Ulimits = append(res.Ulimits, &container.Ulimit{Name: "nofile", Soft: r.OpenFiles, Hard: r.OpenFiles})
	}
	// POSIX message queues: the kernel's default per-user bound, set here
	// so that the engine's own limits do not change it.
	res.Ulimits = append(res.Ulimits, &container.Ulimit{Name: "msgqueue", Soft: msgQueueBytes, Hard: msgQueueBytes})
	if info.Podman {
		res.Ulimits = append(res.Ulimits, podmanUlimits()...)
	}
	hc.Sysctls = ipcSysctls(r)
	dctx, cancel := detached(ctx)
	created, err := in.cli.ContainerCreate(dctx, cc, hc, nil, nil, in.name)
	cancel()
	if err != nil {
		return in.err("create container", err)
	}
	in.id = created.ID
	if err := ctxErr(ctx, "create container"); err != nil {
		return err
	}
	if in.leased() {
		return in.startLeased(ctx, agentVol)
	}
	if in.attach, err = engine.Attach(ctx, in.spec.Timeout, func(ctx context.Context) (types.HijackedResponse, error) {
		return in.cli.ContainerAttach(ctx, in.id, container.AttachOptions{
			Stream: true, Stdin: true, Stdout: true, Stderr: true,
		})
	}); err != nil {
		if info.Podman {
			// Podman readies the container for an attach and answers 409
			// with no reason when its runtime refuses it; a start gives the
			// reason (a resource limit above the engine's own, say).
			if serr := in.cli.ContainerStart(ctx, in.id, container.StartOptions{}); serr != nil {
				if lerr := rlimitErr(serr, in.spec.Resources); lerr != nil {
					return lerr
				}
			}
		}
		return in.err("attach", err)
	}
	// The attach stream multiplexes the agent's stdout (frames) and
	// stderr (its complaints).
	stderr := in.spec.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	in.stream = newStream(in.attach, engine.Demux(in.attach.Reader, stderr))
	return in.start(ctx, agentVol)
}

// start starts the container, and bounds its TCP buffers before any
// command runs: the kernel counts a socket against the bound only if it
// was set when the socket was made.
func (in *instance) start(ctx context.Context, agentVol string) error {
	if err := in.cli.ContainerStart(ctx, in.id, container.StartOptions{}); err != nil {
		if engine.IsMissingEntrypoint(err, agentDir+"/agent") {
			in.d.forgetAgentVolume(agentVol)
			return fmt.Errorf("%w: %v", errAgentMissing, err)
		}
		if lerr := rlimitErr(err, in.spec.Resources); lerr != nil {
			return lerr
		}
		return in.err("start container", err)
	}
	if err := in.boundTCPMemory(ctx); err != nil && !errors.Is(err, errTCPMemUnsupported) {
		return err
	}
	return nil
}

// startLeased starts a leased sandbox's container and its creator's
// session, through the agent's relay (see lease.go).
func (in *instance) startLeased(ctx context.Context, agentVol string) error {
	if err := in.start(ctx, agentVol); err != nil {
		return err
	}
	return in.relay(ctx)
}

// errAgentMissing is a container that did not start because the agent's
// volume no longer holds the agent.
var errAgentMissing = errors.New("sandbox: the agent's volume does not hold the agent")

// discardContainer removes a container that createContainer made but that
// did not start, so that it can be made again.
func (in *instance) discardContainer() {
	ctx, cancel := context.WithTimeout(context.Background(), in.spec.Timeout)
	defer cancel()
	in.cli.ContainerRemove(ctx, in.id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if in.attach.Conn != nil {
		in.attach.Close()
	}
	in.id, in.attach, in.stream = "", types.HijackedResponse{}, nil
}

// checkRuntime refuses a runtime the engine would not use. Podman's
// Docker-compatible API takes HostConfig.Runtime and ignores it (Podman
// 4.3: the container runs under the engine's default runtime, runc, and
// its compatible inspect says "oci"), so a sandbox asked to run under
// gVisor would silently run without it.
func (d *Driver) checkRuntime(ctx context.Context, runtime string) error {
	if runtime == "" {
		return nil
	}
	info, err := d.engineInfo(ctx)
	if err != nil {
		return err
	}
	if info.Podman {
		return fmt.Errorf("%w: runtime %q: Podman's Docker-compatible API ignores the runtime asked for and would run the sandbox under its default one; "+
			"set the runtime for the whole engine in containers.conf ([engine] runtime) and leave WithRuntime out, or use Docker", driver.ErrUnsupported, runtime)
	}
	return nil
}

// objectName returns a fresh, unique name for an engine object of the given
// kind. Objects are named by the library, not the engine, so that one whose
// create request timed out (it may have happened all the same) can still be
// found and removed.
func objectName(kind string) string {
	var b [8]byte
	rand.Read(b[:])
	return "agentsandbox-" + kind + "-" + hex.EncodeToString(b[:])
}

// detached returns a context for a call that makes an engine object. It is
// not cancelled with ctx: a request cancelled in flight may still have been
// carried out, and the object would be left behind, unknown to Remove.
// Callers check ctx (ctxErr) once they hold the object's ID. The bound is
// detachedBound.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), detachedBound)
}

// detachedBound bounds a call that makes an engine object (see detached):
// generous, because a commit's time grows with the files committed.
const detachedBound = 5 * time.Minute

// ctxErr returns ctx's error, if any, as the failure of op.
func ctxErr(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: %s: %w", op, err)
	}
	return nil
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}
