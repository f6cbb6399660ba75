package sandbox

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/driverof"
	"github.com/agentsandbox/sandbox/internal/ident"
	"github.com/agentsandbox/sandbox/internal/pseudofs"
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

// Sandbox is a running, hardened sandbox that commands and files can be
// sent to: an instance on its backend (a container on Docker and Podman, a
// pod on Kubernetes) whose main process is the library's agent. Create
// one with New and end it with Close. A Sandbox is safe for concurrent use
// by multiple goroutines.
type Sandbox struct {
	cfg     config
	drv     driver.Driver   // the backend
	ownDrv  bool            // drv was made for this sandbox alone (WithHost): closed with it
	inst    driver.Instance // the sandbox's instance on the backend
	id      string
	user    string // the user as given (WithUser) or drawn (ownUser)
	uid     int    // the user's IDs, as the agent resolved them
	gid     int
	log     *slog.Logger
	agent   *agentconn.Conn // the agent, the instance's main process
	stderr  *tail           // the last of the agent's stderr, for errors
	base    string          // the image the sandbox (or the snapshot it came from) was made from
	proxy   *proxy          // the egress proxy, for an allow-list or credentials
	proxied proxied         // its decisions for commands' activity records
	exposed exposures
	lease   time.Duration // > 0: leased (WithLease, Open)
	noActs  bool          // the agent keeps no activity record (its greeting says so)

	renewStop chan struct{} // closed when this process lets go (Detach, Close)

	mu       sync.Mutex
	closed   bool
	oomSeen  int64
	closeErr error
	closing  sync.Once
	whyOnce  sync.Once
	why      string // why the instance stopped, once asked
}

// LabelSnapshot is the label a sandbox restored from a snapshot (not
// from a Pool) carries on the engine: the snapshot's ID.
const LabelSnapshot = "dev.agentsandbox.snapshot"

// Option configures a sandbox in New.
type Option func(*config) error

type config struct {
	image    string
	pull     PullPolicy
	limits   Limits
	env      []string
	workdir  string
	user     string
	runtime  string
	labels   map[string]string
	logger   *slog.Logger
	host     string
	driver   driver.Driver
	snapshot string                                           // set by Snapshot.New: the snapshot's ID
	base     string                                           // set by Snapshot.New: the image the snapshot was made from
	take     func(context.Context, *config) (*Sandbox, error) // WithPool: where Snapshot.New gets a started sandbox
	network  NetworkPolicy
	// activity turns the activity record on (WithActivity).
	activity    bool
	activityMax int  // events per command (WithActivityLimit); 0: the agent's default
	diskSet     bool // Limits.Disk was given, not the default
	tmpSet      bool // Limits.TmpSize was given, not the default

	timeout       time.Duration  // bound on each wait the caller's context does not bound (DefaultTimeout; a test hook can shorten it)
	resolve       resolveFunc    // test hook: the proxy's resolver
	upstreamRoots *x509.CertPool // test hook: roots for intercepted upstreams
	expose        *exposeBounds  // test hook: Expose's bounds (nil: the defaults)

	rules netRules      // network.Allow, parsed once (WithNetwork)
	lease time.Duration // WithLease; 0: tied to this process
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
// docker CLI. The default is DOCKER_HOST, else the local socket. The
// sandbox gets a connection of its own, closed with it: for many
// sandboxes on one engine, make one driver with docker.New and give it
// with WithDriver instead, so that they share it. In a program built
// with the agentsandbox_nodocker tag, which leaves the Docker backend out,
// it fails with ErrNoDriver.
func WithHost(dockerHost string) Option {
	return func(c *config) error {
		if err := withoutDocker(dockerHost); err != nil {
			return err
		}
		c.host = dockerHost
		return nil
	}
}

// WithNetwork sets the sandbox's network policy (default: none).
func WithNetwork(p NetworkPolicy) Option {
	return func(c *config) error {
		p, rules, err := p.parse()
		if err != nil {
			return err
		}
		c.network, c.rules = p, rules
		return nil
	}
}

// WithDriver selects the backend the sandbox runs on: a Docker or Podman
// engine (package docker), or another implementation of driver.Driver. The
// default is DefaultDriver, shared by all sandboxes given neither
// WithDriver nor WithHost. WithDriver takes precedence over WithHost. The
// caller closes the driver, after the sandboxes made with it.
func WithDriver(d driver.Driver) Option {
	return func(c *config) error {
		if d == nil {
			return errors.New("sandbox: WithDriver: nil driver")
		}
		c.driver = d
		return nil
	}
}

// DefaultDriver is the backend of sandboxes given neither WithDriver nor
// WithHost, and of Prune: the Docker engine DOCKER_HOST names when it first
// connects, else the local socket. Its connection is shared by all those
// sandboxes, as net/http's DefaultClient is.
//
// A program built with the agentsandbox_nodocker tag links no Docker
// backend (nor the Docker SDK and OpenTelemetry packages it brings): there
// DefaultDriver is nil, and a sandbox given no WithDriver fails with
// ErrNoDriver, as does Prune.
var DefaultDriver driver.Driver = defaultDriver()

// driverOf is driverof.Func: the driver opts select, for sandboxtest.
func driverOf(opts any) (driver.Driver, func() error, error) {
	list, _ := opts.([]Option)
	c, err := newConfig(list)
	if err != nil {
		return nil, nil, err
	}
	d, own, err := c.backend()
	if err != nil || !own {
		return d, nil, err
	}
	return d, d.Close, nil
}

func init() { driverof.Func = driverOf }

// backend returns the driver for c, and whether it was made for one
// sandbox alone (the caller closes it).
func (c *config) backend() (driver.Driver, bool, error) {
	switch {
	case c.driver != nil:
		return c.driver, false, nil
	case c.host != "":
		d, err := hostDriver(c.host, c.timeout)
		return d, err == nil, err
	case DefaultDriver == nil:
		return nil, false, errNoDefault
	}
	return DefaultDriver, false, nil
}

// errNoDefault is the error of a sandbox given no backend where there is
// no DefaultDriver.
var errNoDefault = fmt.Errorf("%w: DefaultDriver is nil (the program was built with the agentsandbox_nodocker tag, "+
	"which leaves the Docker backend out, or DefaultDriver was set to nil): give one with WithDriver", ErrNoDriver)

// defaults is the configuration of a sandbox given no option.
func defaults() config {
	return config{
		image:   DefaultImage,
		workdir: "/workspace",
		logger:  slog.New(slog.DiscardHandler),
		timeout: DefaultTimeout,
		pull:    defaultPull(),
		limits:  DefaultLimits(),
	}
}

// newConfig is the configuration New makes a sandbox from: opts on the
// defaults.
func newConfig(opts []Option) (config, error) { return defaults().with(opts) }

// with is the one assembly of a sandbox's configuration: opts applied on
// top of c, the defaults (New) or a snapshot's settings (Snapshot.New).
// Limits that opts leave zero keep c's; c's slices and maps are copied
// before options add to them.
func (c config) with(opts []Option) (config, error) {
	out := c
	out.env = slices.Clone(c.env)
	out.labels = maps.Clone(c.labels)
	out.limits = Limits{}
	for _, o := range opts {
		if err := o(&out); err != nil {
			return out, err
		}
	}
	out.diskSet = c.diskSet || out.limits.Disk != 0
	out.tmpSet = c.tmpSet || out.limits.TmpSize != 0
	out.limits = out.limits.merge(c.limits)
	if err := out.limits.validate(); err != nil {
		return out, err
	}
	if p := out.limits.PIDs; out.activity && p > 0 && p < minActivityPIDs {
		return out, fmt.Errorf("sandbox: Limits.PIDs %d is too few for the activity record (WithActivity): its monitor keeps two of the agent's threads (minimum %d)", p, minActivityPIDs)
	}
	return out, nil
}

// minActivityPIDs is the smallest PIDs limit with the activity record on:
// the minimum, 16, plus the monitor's two threads and room for commands.
const minActivityPIDs = 24

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

// ID returns the sandbox's ID on its backend: on Docker and Podman, its
// container's ID.
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
// instance has stopped, with what the backend says of why.
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

// oomAskTimeout bounds one question about the OOM killer (to the agent, or
// to the engine about an ended instance): a short bound, because it is
// asked on the way to reporting a failure that is already known.
const oomAskTimeout = 2 * time.Second

// goneWhy says why the instance stopped, asking the backend once: out of
// memory if the kernel's OOM killer acted in it within a second of its
// end (the agent is the OOM killer's last choice, taken only when no
// command is left to kill), else removed or killed from outside, or its
// Lifetime over.
func (s *Sandbox) goneWhy() string {
	s.whyOnce.Do(func() {
		s.why = "(removed or killed outside the library, or its Lifetime ended)"
		r, ok := s.inst.(driver.OOMReporter)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(oomAskTimeout, s.cfg.timeout))
		defer cancel()
		if r.OOMKilled(ctx) {
			s.why = "out of memory (OOMKilled: the kernel's OOM killer ended the sandbox's agent, which it takes only when no command is left to kill: raise Limits.Memory)"
		}
	})
	return s.why
}

// initErr is the error for a request to the sandbox's agent that failed:
// the instance is gone, paused, or its agent does not answer.
func (s *Sandbox) initErr(op string, err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("sandbox: %s: %w", op, err)
	case errors.Is(err, agentconn.ErrGone):
		return s.goneErr(op, nil)
	case errors.Is(err, agentconn.ErrNoAnswer):
		switch s.stateNow() {
		case driver.StateGone:
			return s.goneErr(op, err)
		case driver.StatePaused:
			return s.pausedErr(op)
		}
		return fmt.Errorf("%w: %s: %s: %v", ErrUnresponsive, op, shortID(s.id), err)
	}
	return fmt.Errorf("sandbox: %s: %w", op, err)
}

func (s *Sandbox) pausedErr(op string) error {
	return fmt.Errorf("%w: %s: %s is paused from outside the library (docker pause / podman pause); unpause it to use it again",
		ErrUnresponsive, op, shortID(s.id))
}

// stateNow asks the backend what state the instance is in.
func (s *Sandbox) stateNow() driver.State { return s.inst.State(context.Background()) }

// goneNow asks the backend whether the instance has stopped or gone.
func (s *Sandbox) goneNow() bool { return s.stateNow() == driver.StateGone }

// Close stops the sandbox and removes its instance and everything made
// for it (on Docker and Podman: its container, volume and disk). Commands
// still running are killed. Close is idempotent and safe to call on a nil
// Sandbox; later calls return the first call's result.
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
	var errs []error
	if s.renewStop != nil {
		close(s.renewStop)
	}
	if s.agent != nil {
		s.agent.Close()
	}
	if s.inst != nil {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
		if err := s.inst.Remove(ctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
		if s.agent != nil {
			<-s.agent.Done() // Remove closed the stream
		}
	}
	s.exposed.closeAll()
	if s.proxy != nil {
		s.proxy.close()
	}
	if s.ownDrv {
		s.drv.Close()
	}
	return errors.Join(errs...)
}

// Prune removes sandboxes, volumes and snapshots that processes on this
// host left behind when they died without closing them, on the default
// driver's engine (DOCKER_HOST or the default socket). It never touches
// objects whose owner still runs (such as another test run beside this
// one) or that were made on another host. It also removes this process's
// own objects whose removal failed because the engine did not answer
// (Close retries those too, once it answers). It returns how many objects
// it removed. For a driver of your own, call its Prune.
func Prune(ctx context.Context) (int, error) {
	if DefaultDriver == nil {
		return 0, errNoDefault
	}
	return DefaultDriver.Prune(ctx)
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

// testing hooks, set through export_test.go.

func withResolver(f resolveFunc) Option {
	return func(c *config) error { c.resolve = f; return nil }
}

func withTimeout(d time.Duration) Option {
	return func(c *config) error { c.timeout = d; return nil }
}

// withExposeBounds replaces Expose's bounds for one sandbox.
func withExposeBounds(idle, afterEOF time.Duration, maxConns int) Option {
	return func(c *config) error {
		c.expose = &exposeBounds{idle: idle, afterEOF: afterEOF, max: maxConns}
		return nil
	}
}

func withUpstreamRoots(p *x509.CertPool) Option {
	return func(c *config) error { c.upstreamRoots = p; return nil }
}
