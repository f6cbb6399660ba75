package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/disk"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
	"github.com/agentsandbox/sandbox/internal/ident"
	"github.com/agentsandbox/sandbox/internal/leftover"
	"github.com/agentsandbox/sandbox/internal/pseudofs"
	"github.com/agentsandbox/sandbox/internal/seccomp"
)

// DefaultImage is the image used when WithImage is not given.
const DefaultImage = "python:3.12-slim"

// DefaultTimeout bounds every wait on the engine and on the sandbox's init
// process that the caller's context does not bound sooner: one engine
// request (until its answer starts), the set-up of an attached stream, a
// reply from the init process, the readiness of a new sandbox. A wait that
// runs out fails with an error wrapping ErrUnresponsive that names what did
// not answer, so no call can block forever, even with
// context.Background(). Long transfers (copies, commits) are bounded by
// progress: each may go quiet for at most this long.
const DefaultTimeout = 30 * time.Second

// Sandbox is a running, hardened container that commands and files can be
// sent to. Create one with New and end it with Close. A Sandbox is safe for
// concurrent use by multiple goroutines.
type Sandbox struct {
	cfg     config
	cli     engine.API
	name    string // the container's name, unique, chosen before it is created
	id      string
	user    string // the user as given (WithUser) or drawn (ownUser)
	uid     int    // the user's IDs, as the agent resolved them
	gid     int
	log     *slog.Logger
	agent   *agentconn.Conn // the agent, the container's main process
	attach  types.HijackedResponse
	stderr  *tail     // the last of the agent's stderr, for errors
	volume  string    // the workdir volume
	base    string    // the image the sandbox (or the snapshot it came from) was made from
	snap    *Snapshot // the snapshot it was restored from, if any
	net     *netState // set when the network policy is not "none"
	exposed exposures
	dev     *disk.Device // backs volume when Limits.Disk > 0

	created time.Time // when create began

	mu       sync.Mutex
	closed   bool
	oomSeen  int64
	closeErr error
	closing  sync.Once
	whyOnce  sync.Once
	why      string // why the container stopped, once asked
}

// Option configures a sandbox in New.
type Option func(*config) error

type config struct {
	image   string
	pull    PullPolicy
	limits  Limits
	env     []string
	workdir string
	user    string
	runtime string
	labels  map[string]string
	logger  *slog.Logger
	host    string
	restore *Snapshot // set by Snapshot.New
	network NetworkPolicy
	diskSet bool // Limits.Disk was given, not the default
	tmpSet  bool // Limits.TmpSize was given, not the default

	agentVolume string // test hook: the agent's volume under another name

	timeout       time.Duration  // bound on each wait the caller's context does not bound (DefaultTimeout; a test hook can shorten it)
	resolve       resolveFunc    // test hook: the proxy's resolver
	upstreamRoots *x509.CertPool // test hook: roots for intercepted upstreams
}

// WithImage sets the image the sandbox runs (default DefaultImage). A
// missing image is pulled (see PullPolicy). Any image works for commands
// given as argv and for file operations; Exec needs /bin/sh.
func WithImage(ref string) Option {
	return func(c *config) error {
		if ref == "" {
			return errors.New("sandbox: WithImage: empty image reference")
		}
		c.image = ref
		return nil
	}
}

// PullPolicy says whether New pulls the image from its registry.
type PullPolicy int

const (
	// PullMissing pulls the image when the engine does not have it, as
	// docker run does. The audit log gets a sandbox.pull.progress record
	// per layer step and one sandbox.pull record at the end. It is the
	// default unless the environment says AGENTSANDBOX_PULL=never.
	PullMissing PullPolicy = iota
	// PullNever never pulls: a missing image is ErrImageNotFound, and New
	// never has the engine reach a registry. For tests and air-gapped
	// machines; AGENTSANDBOX_PULL=never in the environment makes it the
	// default.
	PullNever
)

// WithPullPolicy sets whether New pulls a missing image (default
// PullMissing, or PullNever when AGENTSANDBOX_PULL=never).
func WithPullPolicy(p PullPolicy) Option {
	return func(c *config) error {
		if p != PullMissing && p != PullNever {
			return fmt.Errorf("sandbox: WithPullPolicy: unknown policy %d", p)
		}
		c.pull = p
		return nil
	}
}

// defaultPull is the pull policy the environment asks for.
func defaultPull() PullPolicy {
	if strings.EqualFold(os.Getenv("AGENTSANDBOX_PULL"), "never") {
		return PullNever
	}
	return PullMissing
}

// WithLimits sets resource limits. Zero fields keep their defaults and
// negative fields remove a limit; see Limits.
func WithLimits(l Limits) Option {
	return func(c *config) error {
		c.limits = l
		return nil
	}
}

// WithEnv adds environment variables ("KEY=value") to every command in the
// sandbox. The host's environment is never passed in; this is the only way
// to set variables besides Cmd.Env.
func WithEnv(kv ...string) Option {
	return func(c *config) error {
		for _, e := range kv {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsAny(e, "\x00") {
				return fmt.Errorf("sandbox: WithEnv: %q is not KEY=value", e)
			}
		}
		if err := checkHostEnv("WithEnv", kv); err != nil {
			return err
		}
		c.env = append(c.env, kv...)
		return nil
	}
}

// checkHostEnv refuses an environment that holds this process's whole
// environment, as append(os.Environ(), "X=1") does: that would copy the
// host's variables (tokens, keys, paths) into the sandbox. With os/exec,
// Cmd.Env replaces the environment, so that idiom is common; here Env adds
// to the sandbox's own.
func checkHostEnv(what string, env []string) error {
	host := os.Environ()
	if len(host) < 2 || len(env) < len(host) {
		return nil
	}
	have := make(map[string]bool, len(env))
	for _, e := range env {
		have[e] = true
	}
	for _, e := range host {
		if !have[e] {
			return nil
		}
	}
	return fmt.Errorf("sandbox: %s holds this process's whole environment (append(os.Environ(), ...)?), "+
		"which would copy the host's variables into the sandbox: it adds to the sandbox's environment, so list only what the code needs", what)
}

// WithWorkdir sets the working directory (default "/workspace"): an absolute
// path, writable by the sandbox user, where relative file names and commands
// start. It is also HOME. Paths under /proc, /sys and /dev, and "/", are
// refused.
func WithWorkdir(dir string) Option {
	return func(c *config) error {
		if !path.IsAbs(dir) {
			return fmt.Errorf("sandbox: WithWorkdir: %q is not an absolute path", dir)
		}
		dir = path.Clean(dir)
		if m, ok := pseudofs.Under(dir); ok {
			return fmt.Errorf("sandbox: WithWorkdir: %q is under %s", dir, m)
		}
		if dir == "/" {
			return errors.New(`sandbox: WithWorkdir: "/" cannot be the working directory`)
		}
		c.workdir = dir
		return nil
	}
}

// WithUser sets the user commands and file operations run as: "uid",
// "uid:gid", "name" or "name:group", names from the image's /etc/passwd
// and /etc/group (as Cmd.User; a user without a group gets its passwd
// group, or the group of the same number if it has no entry). The user
// need not exist in the image. Root ("0") is allowed but still has no
// capabilities.
//
// The default is a user of the sandbox's own: a uid (with the group of
// the same number) drawn at random from 1,000,000,000 to 1,899,999,999,
// which no other sandbox is likely to share (one in 900 million for
// each pair) and no user of the host has. The kernel counts some limits
// per user (inotify instances, message queue bytes, pipe buffers): with a
// user of its own, a sandbox cannot use up another's or the host's.
func WithUser(user string) Option {
	return func(c *config) error {
		if _, err := ident.Parse(user); err != nil {
			return fmt.Errorf("sandbox: WithUser: %w", err)
		}
		c.user = user
		return nil
	}
}

// WithRuntime selects the engine's OCI runtime, such as "runsc" for gVisor,
// for stronger isolation. The engine must have it configured.
func WithRuntime(name string) Option {
	return func(c *config) error { c.runtime = name; return nil }
}

// WithLabels adds labels to the sandbox's container. Keys under
// "dev.agentsandbox." are the library's own and cannot be set.
func WithLabels(kv map[string]string) Option {
	return func(c *config) error {
		for k := range kv {
			if strings.HasPrefix(k, "dev.agentsandbox.") {
				return fmt.Errorf("sandbox: WithLabels: %q is a reserved label", k)
			}
		}
		if c.labels == nil {
			c.labels = map[string]string{}
		}
		maps.Copy(c.labels, kv)
		return nil
	}
}

// WithLogger sets the audit log: one structured record per action (create,
// exec with its arguments, exit code, duration and output sizes, file
// operations with byte counts, close). The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.logger = l
		return nil
	}
}

// WithHost selects the Docker engine ("unix:///var/run/docker.sock",
// "tcp://host:2376"); TLS material comes from DOCKER_CERT_PATH as with the
// docker CLI. The default is DOCKER_HOST, else the local socket.
func WithHost(dockerHost string) Option {
	return func(c *config) error { c.host = dockerHost; return nil }
}

// ownUser returns a user of a sandbox's own (see WithUser).
func ownUser() string {
	var b [8]byte
	rand.Read(b[:])
	uid := 1_000_000_000 + binary.BigEndian.Uint64(b[:])%900_000_000
	return fmt.Sprintf("%d:%d", uid, uid)
}

func newConfig(opts []Option) (config, error) {
	c := config{
		image:   DefaultImage,
		workdir: "/workspace",
		logger:  slog.New(slog.DiscardHandler),
		timeout: DefaultTimeout,
		pull:    defaultPull(),
	}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return c, err
		}
	}
	c.diskSet = c.limits.Disk != 0
	c.tmpSet = c.limits.TmpSize != 0
	c.limits = c.limits.merge(DefaultLimits())
	return c, c.limits.validate()
}

// New creates and starts a sandbox. It is hardened without any option: a
// non-root user of its own (see WithUser) with no capabilities,
// no-new-privileges, the library's seccomp profile (Docker's default and
// stricter) and masked /proc paths, a read-only root filesystem, no network,
// no host mounts or environment, an init process reaping zombies, and the
// limits of DefaultLimits. Close it when done; it also ends on its own when
// the calling process exits or Limits.Lifetime passes.
func New(ctx context.Context, opts ...Option) (*Sandbox, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return create(ctx, cfg)
}

// connect returns a client whose every request must start to be answered
// within answer.
func connect(ctx context.Context, host string, answer time.Duration) (engine.API, error) {
	cli, err := engine.Connect(ctx, host, answer)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: is dockerd running, and may this user use it? (%v)",
			ErrEngineUnavailable, engine.Host(host), err)
	}
	return cli, nil
}

// create makes the sandbox; on failure it removes what it made.
func create(ctx context.Context, cfg config) (_ *Sandbox, err error) {
	start := time.Now()
	s := &Sandbox{cfg: cfg, log: cfg.logger, base: cfg.image, snap: cfg.restore, created: start}
	if cfg.restore != nil {
		s.base = cfg.restore.base
	}
	defer func() {
		if err != nil {
			s.teardown()
			s.log.LogAttrs(ctx, slog.LevelError, "sandbox.create", slog.String("image", cfg.image), slog.String("error", err.Error()))
		}
	}()
	if s.cli, err = connect(ctx, cfg.host, cfg.timeout); err != nil {
		return nil, err
	}
	s.user = s.cfg.user
	if s.user == "" {
		s.user = ownUser() // a restored sandbox gets one of its own too
	}
	if err := s.ensureImage(ctx); err != nil {
		return nil, err
	}
	if err := s.createVolume(ctx); err != nil {
		return nil, err
	}
	var netEnv []string
	if !cfg.network.none() {
		if netEnv, err = s.createNetwork(ctx); err != nil {
			return nil, err
		}
	}
	err = s.createContainer(ctx, netEnv)
	if errors.Is(err, errAgentMissing) {
		// The agent's volume was removed or emptied behind the library:
		// fill it again, once.
		s.discardContainer()
		err = s.createContainer(ctx, netEnv)
	}
	if err != nil {
		return nil, err
	}
	if s.net != nil && s.net.proxy != nil {
		s.serveProxy()
		if s.net.ca != nil {
			if err := s.installCA(ctx); err != nil {
				return nil, fmt.Errorf("sandbox: installing the egress CA: %w", err)
			}
		}
	}
	if cfg.restore != nil {
		if err := s.restoreWorkdir(ctx); err != nil {
			return nil, err
		}
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.create",
		slog.String("sandbox", s.ID()), slog.String("image", cfg.image),
		slog.String("user", s.userIDs()), slog.String("workdir", cfg.workdir),
		slog.String("runtime", cfg.runtime), slog.String("disk", s.diskKind()), slog.Duration("duration", time.Since(start)))
	return s, nil
}

func (s *Sandbox) ensureImage(ctx context.Context) error {
	_, err := s.cli.ImageInspect(ctx, s.cfg.image)
	if err == nil {
		return nil
	}
	if !engine.IsNotFound(err) {
		return s.engineErr("inspect image", err)
	}
	if s.cfg.pull == PullNever {
		return fmt.Errorf("%w: %q is not on the engine at %s, and the pull policy is PullNever: build it (docker build -t %s ...) or pull it (docker pull %s)",
			ErrImageNotFound, s.cfg.image, engine.Host(s.cfg.host), s.cfg.image, s.cfg.image)
	}
	start := time.Now()
	rc, err := s.cli.ImagePull(ctx, s.cfg.image, image.PullOptions{})
	if err == nil {
		rc = engine.IdleBounded(rc, s.cfg.timeout)
		err = readJSONStream(rc, func(id, status string) {
			s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.pull.progress", slog.String("image", s.cfg.image),
				slog.String("layer", id), slog.String("status", status))
		})
		rc.Close()
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.pull", slog.String("image", s.cfg.image),
		slog.Duration("duration", time.Since(start)), errAttr(err))
	if err != nil {
		return fmt.Errorf("%w: %q is not on the engine and pulling it failed: %v (build it, or pull it with docker pull %s)",
			ErrImageNotFound, s.cfg.image, err, s.cfg.image)
	}
	return nil
}

// createVolume makes the volume the working directory lives on: an ext4
// image of Limits.Disk bytes, or a plain volume when Disk is unlimited.
func (s *Sandbox) createVolume(ctx context.Context) error {
	// The name is chosen here, not by the engine, so that teardown can
	// remove a volume whose create timed out but happened.
	info, err := s.engineInfo(ctx)
	if err != nil {
		return err
	}
	s.volume = objectName("workdir")
	opts := volume.CreateOptions{Name: s.volume, Driver: "local", Labels: engine.Labels("workdir", nil)}
	switch {
	case s.cfg.limits.Disk > 0 && s.diskBacking() != nil:
		// No loop devices here (not root, or the engine is elsewhere): a
		// tmpfs of Disk bytes, which the engine mounts. Writes past it
		// fail with ENOSPC all the same; its files count towards Memory,
		// so it must fit there beside /tmp, /dev/shm and the processes.
		fit, err := tmpfsDisk(s.cfg.limits, s.cfg.diskSet, s.cfg.tmpSet)
		if err != nil {
			return err
		}
		if fit != s.cfg.limits {
			s.log.LogAttrs(ctx, slog.LevelWarn, "sandbox.limits", slog.Int64("disk", fit.Disk), slog.Int64("tmp_size", fit.TmpSize),
				slog.String("note", fmt.Sprintf("the working directory is a tmpfs here (RAM, counted towards Limits.Memory): "+
					"the default Limits.Disk of %s (and /tmp and /dev/shm of %s each) made to fit in Limits.Memory of %s; raise Memory for more",
					mib(s.cfg.limits.Disk), mib(s.cfg.limits.TmpSize), mib(s.cfg.limits.Memory))))
			s.cfg.limits = fit
		}
		if info.Podman {
			// Podman takes a local volume's size option for a quota
			// its file system lacks: the container gets a tmpfs mount
			// of its own instead (see workdirMount).
			s.volume = ""
			return nil
		}
		opts.DriverOpts = map[string]string{"type": "tmpfs", "device": "tmpfs",
			"o": fmt.Sprintf("size=%d,mode=0755", s.cfg.limits.Disk)}
	case s.cfg.limits.Disk > 0:
		dev, err := disk.Create(ctx, s.cfg.limits.Disk, 0, 0)
		if err != nil {
			return fmt.Errorf("sandbox: creating the %s disk: %w", fmt.Sprintf("%d-byte", s.cfg.limits.Disk), err)
		}
		s.dev = dev
		opts.DriverOpts = map[string]string{"type": "ext4", "device": dev.Path()}
	default:
		// No disk limit: a tmpfs volume (RAM, charged to the sandbox's
		// memory).
		opts.DriverOpts = map[string]string{"type": "tmpfs", "device": "tmpfs", "o": "mode=0755"}
	}
	dctx, cancel := detached(ctx)
	v, err := s.cli.VolumeCreate(dctx, opts)
	cancel()
	if err != nil {
		return s.engineErr("create volume", err)
	}
	s.volume = v.Name
	return ctxErr(ctx, "create volume")
}

// workdirMount is the working directory's mount: its volume, or a tmpfs
// of Limits.Disk where no volume could be made (Podman without a loop
// device).
func (s *Sandbox) workdirMount() mount.Mount {
	if s.volume == "" {
		return mount.Mount{Type: mount.TypeTmpfs, Target: s.cfg.workdir,
			TmpfsOptions: &mount.TmpfsOptions{SizeBytes: s.cfg.limits.Disk, Mode: 0o755}}
	}
	return mount.Mount{Type: mount.TypeVolume, Source: s.volume, Target: s.cfg.workdir,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true}}
}

// diskKind names what the working directory is: "ext4" (a loop-mounted
// image), "tmpfs" (sized by Limits.Disk, or unsized when it is negative).
func (s *Sandbox) diskKind() string {
	if s.dev != nil {
		return "ext4"
	}
	return "tmpfs"
}

// diskBacking says why the working directory cannot be a loop-mounted
// ext4 image here (nil if it can): that needs root (CAP_SYS_ADMIN) and
// e2fsprogs on this host, and an engine on this host (a unix socket).
func (s *Sandbox) diskBacking() error {
	if err := diskSupported(); err != nil {
		return err
	}
	if h := engine.Host(s.cfg.host); !strings.HasPrefix(h, "unix://") {
		return fmt.Errorf("the engine at %s may not share this host's loop devices", h)
	}
	return nil
}

// diskSupported is disk.Supported; tests replace it.
var diskSupported = disk.Supported

// objectName returns a fresh, unique name for an engine object of the given
// kind. Objects are named by the library, not the engine, so that one whose
// create request timed out (it may have happened all the same) can still be
// found and removed.
func objectName(kind string) string {
	var b [8]byte
	rand.Read(b[:])
	return "agentsandbox-" + kind + "-" + hex.EncodeToString(b[:])
}

// commitTimeout bounds the wait for a snapshot's commit: the engine answers
// only once the layer is written.
const commitTimeout = 5 * time.Minute

// detached returns a context for a call that makes an engine object. It is
// not cancelled with ctx: a request cancelled in flight may still have been
// carried out, and the object would be left behind, unknown to the
// teardown. Callers check ctx (ctxErr) once they hold the object's ID. The
// bound is generous: a commit's time grows with the files committed.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
}

// ctxErr returns ctx's error, if any, as the failure of op.
func ctxErr(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: %s: %w", op, err)
	}
	return nil
}

func (s *Sandbox) baseEnv() []string {
	env := []string{"HOME=" + s.cfg.workdir, "PYTHONUNBUFFERED=1", "LANG=C.UTF-8"}
	return append(env, s.cfg.env...) // later entries win
}

func (s *Sandbox) createContainer(ctx context.Context, netEnv []string) error {
	l := s.cfg.limits
	lifetime := int64(0)
	if l.Lifetime > 0 {
		lifetime = int64((l.Lifetime + time.Second - 1) / time.Second)
	}
	agentVol, err := s.agentVolume(ctx)
	if err != nil {
		return err
	}
	info, err := s.engineInfo(ctx)
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
	entry := []string{agentDir + "/agent", fmt.Sprintf("-lifetime=%ds", lifetime), "-user=" + s.user}
	if s.cfg.user == "" {
		entry = append(entry, "-drawn") // the agent may move it into a rootless engine's IDs
	}
	if s.net != nil && s.net.relayPort != 0 {
		entry = append(entry, fmt.Sprintf("-relay=%d", s.net.relayPort))
	}
	cc := &container.Config{
		Image:        s.cfg.image,
		Entrypoint:   entry,
		Cmd:          nil,
		User:         "0:0", // the agent; commands run as s.user
		WorkingDir:   s.cfg.workdir,
		Env:          append(s.baseEnv(), netEnv...),
		Labels:       engine.Labels("sandbox", s.cfg.labels),
		Hostname:     "sandbox",
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		OpenStdin:    true,
		StdinOnce:    true,
	}
	hc := &container.HostConfig{
		AutoRemove:     true,
		NetworkMode:    "none",
		CapDrop:        []string{"ALL"},
		CapAdd:         agentCaps,
		SecurityOpt:    []string{"no-new-privileges:true", secOpt},
		ReadonlyRootfs: true,
		LogConfig:      container.LogConfig{Type: "none"},
		Runtime:        s.cfg.runtime,
		ShmSize:        l.TmpSize, // /dev/shm: like /tmp, RAM counted towards Memory
		Tmpfs:          map[string]string{"/tmp": fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", l.TmpSize)},
		Mounts: []mount.Mount{s.workdirMount(), {
			Type: mount.TypeVolume, Source: agentVol, Target: agentDir, ReadOnly: true,
			VolumeOptions: &mount.VolumeOptions{NoCopy: true},
		}},
	}
	if s.net != nil && s.net.name != "" {
		hc.NetworkMode = container.NetworkMode(s.net.name)
	}
	r := &hc.Resources
	if l.CPUs > 0 {
		r.NanoCPUs = int64(l.CPUs * 1e9)
	}
	if l.Memory > 0 {
		r.Memory, r.MemorySwap = l.Memory, l.Memory
	}
	if l.PIDs > 0 {
		r.PidsLimit = &l.PIDs
	}
	if l.FileSize > 0 {
		r.Ulimits = append(r.Ulimits, &container.Ulimit{Name: "fsize", Soft: l.FileSize, Hard: l.FileSize})
	}
	if l.OpenFiles > 0 {
		r.Ulimits = append(r.Ulimits, &container.Ulimit{Name: "nofile", Soft: l.OpenFiles, Hard: l.OpenFiles})
	}
	// POSIX message queues: the kernel's default per-user bound, set here
	// so that the engine's own limits do not change it.
	r.Ulimits = append(r.Ulimits, &container.Ulimit{Name: "msgqueue", Soft: msgQueueBytes, Hard: msgQueueBytes})
	if info.Podman {
		r.Ulimits = append(r.Ulimits, podmanUlimits()...)
	}
	hc.Sysctls = ipcSysctls(l)
	s.name = objectName("sandbox")
	dctx, cancel := detached(ctx)
	created, err := s.cli.ContainerCreate(dctx, cc, hc, nil, nil, s.name)
	cancel()
	if err != nil {
		return s.engineErr("create container", err)
	}
	s.id = created.ID
	if err := ctxErr(ctx, "create container"); err != nil {
		return err
	}
	if s.attach, err = engine.Attach(ctx, s.cfg.timeout, func(ctx context.Context) (types.HijackedResponse, error) {
		return s.cli.ContainerAttach(ctx, s.id, container.AttachOptions{
			Stream: true, Stdin: true, Stdout: true, Stderr: true,
		})
	}); err != nil {
		return s.engineErr("attach", err)
	}
	// The attach stream multiplexes the agent's stdout (frames) and
	// stderr (its complaints, kept for errors).
	s.stderr = &tail{}
	s.agent = agentconn.Start(agentStream{s.attach}, engine.Demux(s.attach.Reader, s.stderr), s.cfg.timeout)
	if err := s.cli.ContainerStart(ctx, s.id, container.StartOptions{}); err != nil {
		if engine.IsMissingEntrypoint(err, agentDir+"/agent") {
			s.forgetAgentVolume(agentVol)
			return fmt.Errorf("%w: %v", errAgentMissing, err)
		}
		return s.engineErr("start container", err)
	}
	hello, err := s.agent.Ready(ctx)
	if said := s.stderr.String(); errors.Is(err, agentconn.ErrGone) && said != "" {
		// It said why it stopped: a user the image does not have, say.
		return fmt.Errorf("sandbox: the sandbox's agent did not start: %s", said)
	}
	if err != nil {
		return s.initErr("the sandbox's agent did not start"+s.stderr.say(), err)
	}
	// The agent resolved the user in the image and gave it the workdir.
	s.uid, s.gid = int(hello.UID), int(hello.GID)
	if err := checkSeen(s.cfg.limits, hello.Limits); err != nil {
		return err
	}
	n, err := s.agent.OOMKills(ctx)
	if err != nil {
		return s.initErr("the sandbox's agent did not answer", err)
	}
	s.oomSeen = int64(n)
	return nil
}

// errAgentMissing is a container that did not start because the agent's
// volume no longer holds the agent.
var errAgentMissing = errors.New("sandbox: the agent's volume does not hold the agent")

// discardContainer removes a container that createContainer made but that
// did not start, so that it can be made again.
func (s *Sandbox) discardContainer() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	defer cancel()
	if s.agent != nil {
		s.agent.Close()
	}
	s.cli.ContainerRemove(ctx, s.id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if s.attach.Conn != nil {
		s.attach.Close()
		<-s.agent.Done()
	}
	s.id, s.agent, s.attach = "", nil, types.HijackedResponse{}
}

// copyTo streams the tar archive r into directory dir of container id. The
// upload is bounded by progress: it fails when the engine has taken nothing
// for the sandbox's timeout (a frozen engine stops reading).
func (s *Sandbox) copyTo(ctx context.Context, id, dir string, r io.Reader) error {
	wctx, kick, stop := engine.Watch(ctx, s.cfg.timeout)
	defer stop()
	err := s.cli.CopyToContainer(wctx, id, dir, engine.Kicking(r, kick), container.CopyToContainerOptions{})
	return engine.Cause(wctx, err)
}

// copyFrom returns a tar archive of path p in container id. Every read of it
// is bounded: it fails when the engine sent nothing for the sandbox's
// timeout.
func (s *Sandbox) copyFrom(ctx context.Context, id, p string) (io.ReadCloser, error) {
	rc, _, err := s.cli.CopyFromContainer(ctx, id, p)
	if err != nil {
		return nil, err
	}
	return engine.IdleBounded(rc, s.cfg.timeout), nil
}

// agentStream is the write side of the attach stream, to the agent.
type agentStream struct{ h types.HijackedResponse }

func (w agentStream) Write(p []byte) (int, error)        { return w.h.Conn.Write(p) }
func (w agentStream) SetWriteDeadline(t time.Time) error { return w.h.Conn.SetWriteDeadline(t) }
func (w agentStream) CloseWrite() error                  { return w.h.CloseWrite() }

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-4096:]...)
	}
	return len(p), nil
}

// String returns what was written, without surrounding space.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// say returns ` (it said: "...")` with what was written, or "".
func (t *tail) say() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.buf) == 0 {
		return ""
	}
	return fmt.Sprintf(" (it said: %q)", bytes.TrimSpace(t.buf))
}

// userIDs is the sandbox user as "uid:gid", how commands get it by
// default.
func (s *Sandbox) userIDs() string { return fmt.Sprintf("%d:%d", s.uid, s.gid) }

// ID returns the sandbox's container ID.
func (s *Sandbox) ID() string {
	if s == nil {
		return ""
	}
	return s.id
}

// check returns ErrClosed or ErrSandboxGone if the sandbox cannot be used.
func (s *Sandbox) check() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	select {
	case <-s.agent.Done():
		return s.goneErr("", nil)
	default:
		return nil
	}
}

// goneErr is the error of operation op (if not "") on a sandbox whose
// container has stopped, with what the engine says of why.
func (s *Sandbox) goneErr(op string, detail error) error {
	msg := shortID(s.id) + " stopped " + s.goneWhy()
	if op != "" {
		msg = op + ": " + msg
	}
	if detail != nil {
		msg += ": " + detail.Error()
	}
	return fmt.Errorf("%w: %s", ErrSandboxGone, msg)
}

// goneWhy says why the container stopped, asking the engine once: out of
// memory if the kernel's OOM killer acted in it within a second of its
// end (the agent is the OOM killer's last choice, taken only when no
// command is left to kill), else removed or killed from outside, or its
// Lifetime over.
func (s *Sandbox) goneWhy() string {
	s.whyOnce.Do(func() {
		s.why = "(removed or killed outside the library, or its Lifetime ended)"
		if s.id == "" || s.cli == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(2*time.Second, s.cfg.timeout))
		defer cancel()
		if engine.DiedOfOOM(ctx, s.cli, s.id, s.created) {
			s.why = "out of memory (OOMKilled: the kernel's OOM killer ended the sandbox's agent, which it takes only when no command is left to kill: raise Limits.Memory)"
		}
	})
	return s.why
}

// engineErr turns an engine error into one the caller can act on.
func (s *Sandbox) engineErr(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sandbox: %s: %w", op, err)
	case engine.IsTimeout(err):
		// The engine's error repeats the same in more words.
		return fmt.Errorf("%w at %s: %s: %w (none within %v: is dockerd stopped or overloaded?)",
			ErrEngineUnavailable, engine.Host(s.cfg.host), op, ErrUnresponsive, s.cfg.timeout)
	case engine.IsUnreachable(err):
		return fmt.Errorf("%w at %s: %s: is dockerd running? (%v)",
			ErrEngineUnavailable, engine.Host(s.cfg.host), op, err)
	case s.id != "" && engine.MayBeState(err):
		switch s.stateAfterFailure() {
		case stateGone:
			return s.goneErr(op, err)
		case statePaused:
			return s.pausedErr(op)
		}
	}
	return fmt.Errorf("sandbox: %s: %w", op, err)
}

// stateAfterFailure says what state the container is in after the engine
// refused a request about it. The engine's view can lag behind: a
// container killed a moment ago may still be "running" to it, and its
// refusal then names no state. The end of the agent's stream is the
// sandbox's own sign of its end, so it is asked first, and waited for a
// moment if the engine sees the container running.
func (s *Sandbox) stateAfterFailure() containerState {
	if s.agentEnded(0) {
		return stateGone
	}
	st := s.stateNow()
	if (st == stateRunning || st == stateUnknown) && s.agentEnded(time.Second) {
		return stateGone
	}
	return st
}

// agentEnded reports whether the stream from the sandbox's agent has
// ended, or ends within wait.
func (s *Sandbox) agentEnded(wait time.Duration) bool {
	if s.agent == nil {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-s.agent.Done():
		return true
	case <-t.C:
		return false
	}
}

// initErr is the error for a request to the sandbox's init process that
// failed: the container is gone, paused, or its init does not answer.
func (s *Sandbox) initErr(op string, err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sandbox: %s: %w", op, err)
	case errors.Is(err, agentconn.ErrGone):
		return s.goneErr(op, nil)
	case errors.Is(err, agentconn.ErrNoAnswer):
		switch s.stateNow() {
		case stateGone:
			return s.goneErr(op, err)
		case statePaused:
			return s.pausedErr(op)
		}
		return fmt.Errorf("%w: %s: %s: %v", ErrUnresponsive, op, shortID(s.id), err)
	}
	return fmt.Errorf("sandbox: %s: %w", op, err)
}

func (s *Sandbox) pausedErr(op string) error {
	return fmt.Errorf("%w: %s: %s is paused (docker pause from outside the library); unpause it to use it again",
		ErrUnresponsive, op, shortID(s.id))
}

type containerState int

const (
	stateRunning containerState = iota
	statePaused
	stateGone    // removed, exited, or being removed
	stateUnknown // the engine did not say
)

// stateNow asks the engine what state the container is in.
func (s *Sandbox) stateNow() containerState {
	ctx, cancel := context.WithTimeout(context.Background(), min(5*time.Second, s.cfg.timeout))
	defer cancel()
	info, err := s.cli.ContainerInspect(ctx, s.id)
	switch {
	case engine.IsNotFound(err):
		return stateGone
	case err != nil:
		return stateUnknown
	case info.State == nil || !info.State.Running || info.State.Dead || info.State.Restarting:
		return stateGone
	case info.State.Paused:
		return statePaused
	}
	return stateRunning
}

// goneNow asks the engine whether the container has stopped or gone.
func (s *Sandbox) goneNow() bool { return s.stateNow() == stateGone }

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Close stops the sandbox and removes its container, its volume and disk,
// and everything else it made. Commands still running are killed. Close is
// idempotent and safe to call on a nil Sandbox; later calls return the
// first call's result.
func (s *Sandbox) Close() error {
	if s == nil {
		return nil
	}
	s.closing.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		start := time.Now()
		s.closeErr = s.teardown()
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "sandbox.close",
			slog.String("sandbox", s.id), slog.Duration("duration", time.Since(start)), errAttr(s.closeErr))
	})
	return s.closeErr
}

// teardown removes whatever create made so far.
func (s *Sandbox) teardown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if s.agent != nil {
		s.agent.Close()
	}
	// Without an ID the create may still have happened: remove by name.
	if target := cmp.Or(s.id, s.name); target != "" {
		err := engine.RetryBusy(ctx, func() error {
			return s.cli.ContainerRemove(ctx, target, container.RemoveOptions{Force: true, RemoveVolumes: true})
		}, engine.IsStopping)
		if err != nil && !engine.IsGone(err) {
			s.remember(leftover.Container, target, err)
			errs = append(errs, fmt.Errorf("sandbox: remove container %s: %w", shortID(target), err))
		}
	}
	if s.attach.Conn != nil {
		s.attach.Close()
		<-s.agent.Done()
	}
	if err := s.closeNetwork(ctx); err != nil {
		errs = append(errs, err)
	}
	if s.volume != "" {
		if err := removeVolume(ctx, s.cli, s.volume); err != nil {
			s.remember(leftover.Volume, s.volume, err)
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && s.cli != nil {
		// The engine answers: remove what earlier teardowns on it could
		// not. Not the caller's failure if that fails again.
		sctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
		if n, err := sweep(sctx, s.cli, engine.Host(s.cfg.host)); n > 0 || err != nil {
			s.log.LogAttrs(sctx, slog.LevelInfo, "sandbox.leftovers", slog.String("sandbox", s.id),
				slog.Int("removed", n), errAttr(err))
		}
		cancel()
	}
	if s.dev != nil {
		if err := s.dev.Release(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.cli != nil {
		s.cli.Close()
	}
	if s.snap != nil {
		s.snap.release()
	}
	return errors.Join(errs...)
}

// remember records an object whose removal failed because the engine did
// not answer, for a later teardown on the same engine or Prune to remove
// (the engine may still carry out a create it did not answer).
func (s *Sandbox) remember(kind, name string, err error) {
	if engine.IsUnreachable(err) || errors.Is(err, context.DeadlineExceeded) {
		leftover.Add(leftover.Object{Host: engine.Host(s.cfg.host), Kind: kind, Name: name})
	}
}

// sweep removes the objects remembered on host (see remember), and
// remembers again those the engine still does not remove. It returns how
// many it removed.
func sweep(ctx context.Context, cli engine.API, host string) (int, error) {
	var n int
	var errs []error
	for _, o := range leftover.Take(host) {
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
			leftover.Add(o)
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

// Prune removes sandboxes, volumes and snapshots that processes on this
// host left behind when they died without closing them. It never touches
// objects whose owner still runs (such as another test run beside this one)
// or that were made on another host. It also removes this process's own
// objects whose removal failed because the engine did not answer (Close
// retries those too, on the same engine, once it answers). It returns how
// many objects it removed. It uses the engine from DOCKER_HOST or the
// default socket (and, for this process's leftovers, the engine each was
// made on).
func Prune(ctx context.Context) (int, error) {
	cli, err := connect(ctx, "", DefaultTimeout)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	return prune(ctx, cli, connect, firewall.Prune)
}

// prune is Prune on the engine cli, connecting to other engines (for this
// process's leftovers) with dial and removing orphaned firewall rules with
// fw: the seams its unit tests replace.
func prune(ctx context.Context, cli engine.API,
	dial func(ctx context.Context, host string, answer time.Duration) (engine.API, error),
	fw func(ctx context.Context, exists func(tag string) bool) (int, error)) (int, error) {
	f := filters.NewArgs(filters.Arg("label", engine.LabelManaged+"=true"))
	var n int
	var errs []error
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, c := range cs {
		if engine.OwnerDead(c.Labels[engine.LabelOwner]) {
			err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
			if err == nil {
				n++
			} else if !engine.IsGone(err) {
				errs = append(errs, err)
			}
		}
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, v := range vs.Volumes {
		if engine.OwnerDead(v.Labels[engine.LabelOwner]) {
			if err := removeVolume(ctx, cli, v.Name); err != nil {
				errs = append(errs, err)
			} else {
				n++
			}
		}
	}
	nets, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, nw := range nets {
		if engine.OwnerDead(nw.Labels[engine.LabelOwner]) {
			if err := cli.NetworkRemove(ctx, nw.ID); err == nil {
				n++
			} else if !engine.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	// Firewall rules of networks that no longer exist. Each network is
	// looked up after its rules were listed: a sandbox being created now
	// makes its network before its rules, so they are never taken for
	// orphans (as they would be against a network list taken earlier).
	k, _ := fw(ctx, func(tag string) bool {
		_, err := cli.NetworkInspect(ctx, tag, network.InspectOptions{})
		return !engine.IsNotFound(err)
	})
	n += k
	// This process's own objects whose removal the engine did not answer.
	// An engine that still does not answer keeps them for a later try; that
	// is not this Prune's failure.
	for _, host := range leftover.Hosts() {
		hcli := cli
		if host != engine.Host("") {
			var err error
			if hcli, err = dial(ctx, host, DefaultTimeout); err != nil {
				continue
			}
		}
		k, err := sweep(ctx, hcli, host)
		n += k
		if err != nil && !engine.IsUnreachable(err) {
			errs = append(errs, err)
		}
		if hcli != cli {
			hcli.Close()
		}
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, im := range is {
		if engine.OwnerDead(im.Labels[engine.LabelOwner]) {
			_, err := cli.ImageRemove(ctx, im.ID, image.RemoveOptions{PruneChildren: true})
			if err == nil {
				n++
			} else if !engine.IsGone(err) {
				errs = append(errs, err)
			}
		}
	}
	return n, errors.Join(errs...)
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

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
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
