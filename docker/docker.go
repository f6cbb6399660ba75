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
// missing). The library keeps the container's stdin attached (StdinOnce):
// when the owning process closes the sandbox or dies, the agent's stdin
// ends, the container ends and the engine removes it (AutoRemove). A
// snapshot's image, when asked for (sandbox.Snapshot.Image), is the
// sandbox's image and one layer made from the snapshot's content,
// committed from a never-started container.
//
// # How the sandbox package's promises are kept here
//
//   - User and privileges: the container drops every capability but the
//     agent's (driver.AgentCaps), with no-new-privileges, the library's
//     seccomp profile (package seccomp; Podman reads it from a file this
//     process writes, so a local socket only), the engine's masked /proc
//     paths, a private IPC namespace and no log driver; the agent runs
//     commands as the sandbox's user with no capabilities.
//   - Files: a read-only root file system. /tmp and /dev/shm are tmpfs
//     mounts of Limits.TmpSize with one inode per 8 KiB (Podman 4.3
//     refuses nr_inodes: there Memory is their only bound on files); on
//     Podman, which mounts a writable tmpfs at /run and /var/tmp, a
//     read-only one of the driver's own covers each.
//   - Disk: the working directory is a volume of its own: an ext4 image of
//     Limits.Disk on a loop device (sparse, deleted from the host file
//     system once attached) where this process is root on the engine's
//     host with e2fsprogs and the engine is local; else a tmpfs of that
//     size the engine mounts, counted towards Memory (Config.TmpfsWorkdir
//     chooses it always). Driver.Caps says which.
//   - CPUs, Memory, PIDs: the container's CFS quota, memory cgroup (swap
//     equal to memory: none) and pids cgroup. FileSize, OpenFiles and
//     POSIX message queues (800 KiB): the container's resource limits.
//     Podman is also given RLIMIT_NPROC 16384, which the agent is exempt
//     from. On cgroup v1, where a sandbox's TCP buffers count towards no
//     memory limit, the driver bounds them at a quarter of Memory
//     (memory.kmem.tcp) where it is root on the engine's host. Rootless
//     Podman on cgroup v1 applies none of these limits: the agent sees so
//     and sandbox.New fails with sandbox.ErrLimitsUnsupported.
//   - Network: NetworkMode "none", so the container has only loopback;
//     allow-lists, credentials and Expose travel over the agent's stream
//     and need nothing of the engine's host. NetworkPolicy{Open: true}
//     gets a bridge network of its own (a /28 from 10.213.0.0/16) with
//     host firewall rules (iptables, INPUT, scoped to its bridge) that keep
//     the host's services and other sandboxes out: root and iptables on
//     the engine's host, else sandbox.ErrNetworkUnsupported
//     (Config.NoFirewall refuses it always).
//   - gVisor: sandbox.WithRuntime("runsc") sets the container's runtime;
//     everything above is asked of the engine as with runc, but the
//     seccomp profile is not in force there (see package seccomp), and
//     only commands, their kill, files, the user and the lack of a network
//     are tested under it. On Podman, WithRuntime fails with
//     sandbox.ErrUnsupported: its Docker-compatible API ignores the runtime
//     asked for, and the sandbox would run under runc.
//
// Podman does not report why a sandbox died (the engine's events), a pause
// from outside (a paused container still answers) or a removed agent
// volume, and has no snapshot image (sandbox.ErrUnsupported).
//
// Every object carries the labels dev.agentsandbox.managed=true,
// dev.agentsandbox.owner (host, boot, process ID and start time) and
// dev.agentsandbox.kind, so Prune removes only what dead processes left.
//
// # Limits
//
// How this backend puts sandbox.Limits in force:
//
//   - CPUs: the container's CPU quota (CFS).
//   - Memory: the container's memory cgroup, swap disabled. The kernel
//     buffers of the sandbox's own TCP sockets count towards it on cgroup
//     v2; on cgroup v1 they count towards no memory limit, so they are
//     bounded apart, at a quarter of Memory (at least 16 MiB), in
//     memory.kmem.tcp, which the library writes itself where it is root on
//     the engine's host (runc ignores the engine's setting); past it the
//     sandbox's sockets stall, the agent does not. Elsewhere on cgroup v1
//     they are unbounded.
//   - PIDs: the container's pids cgroup, which counts the sandbox's
//     processes and threads. On Podman, which as root raises RLIMIT_NPROC
//     past what some hosts allow, the sandbox's user also gets an
//     RLIMIT_NPROC of 16384.
//   - Disk: where this process is root on the engine's host, with
//     e2fsprogs, and the engine is on this host (a unix socket), the
//     working directory is an ext4 image of that size on a loop device,
//     mounted as a volume: its files are on disk, with the inodes
//     mkfs.ext4 gives it (driver.DiskExt4). Elsewhere (a docker-group
//     user, a remote engine, Config.TmpfsWorkdir) it is a tmpfs of that
//     size mounted by the engine, whose files count towards Memory
//     (driver.DiskMemory; Caps.DiskWhy says why). /etc/hosts,
//     /etc/hostname and /etc/resolv.conf are read-only with the read-only
//     root file system.
//   - Files: the nr_inodes of each tmpfs. Podman (4.3) refuses the
//     option: there Memory is the only bound on a tmpfs's inodes.
//   - FileSize, OpenFiles: the container's resource limits. One above the
//     daemon's own hard limit (raising it needs a privilege the runtime
//     does not have; the engine says "error setting rlimit") fails with
//     sandbox.ErrLimitsUnsupported naming the limit.
//   - Lifetime: the agent ends the container, which the engine removes
//     (auto-remove).
//
// # Network
//
// The zero policy and allow-lists give the container no network but
// loopback (network mode none): the allow-list's proxy runs in the
// library's process, reached through the agent. NetworkPolicy{Open:
// true} gives the sandbox a bridge network of its own, with host firewall
// rules (iptables) that keep the host's services, other sandboxes and the
// engine's networks out of reach: that needs root on the engine's host,
// iptables, and a runc runtime, else New fails with
// sandbox.ErrNetworkUnsupported (and so it does with Config.NoFirewall).
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
	_ driver.Lister      = (*Driver)(nil)
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
	si, err := cli.SystemInfo(ctx)
	if err != nil {
		return engine.Info{}, d.err("engine info", err)
	}
	i := engine.InfoOf(v, si)
	d.mu.Lock()
	d.info = &i
	d.mu.Unlock()
	return i, nil
}

// Caps reports that a working directory with a size limit is a
// loop-mounted ext4 image where this process may make one (root on the
// engine's host), else a tmpfs; which engine this is, as it says of
// itself (Docker, or Podman, rootful or rootless); and that a rootless
// engine on cgroup v1 puts no resource limits in force (Podman's drops
// cgroup limits and rlimits alike there). It asks the engine
// the first time, and fails as a request would if the engine cannot be
// reached.
func (d *Driver) Caps(ctx context.Context) (driver.Caps, error) {
	info, err := d.engineInfo(ctx)
	if err != nil {
		return driver.Caps{}, err
	}
	caps := driver.Caps{Disk: driver.DiskExt4, Engine: driver.EngineDocker, NoResourceLimits: info.Rootless && info.CgroupV1}
	if err := d.diskBacking(); err != nil {
		caps.Disk, caps.DiskWhy = driver.DiskMemory, "no loop-mounted disk here: "+err.Error()
	}
	switch {
	case info.Podman && info.Rootless:
		caps.Engine = driver.EnginePodmanRootless
	case info.Podman:
		caps.Engine = driver.EnginePodman
	}
	return caps, nil
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
