package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
)

// MinLease is the shortest lease WithLease takes: a renewal must fit in a
// third of it, however busy the engine.
const MinLease = 5 * time.Second

// listQueries bounds List's lease queries at once.
const listQueries = 8

// WithLease makes the sandbox leased: not tied to this process. It lives
// while its lease is renewed — automatically, at least every d/3, by every
// process that has it open (New, Open) — and ends by itself (every process
// in it killed, its instance stopped) once no renewal arrived for d, even if
// every process that knew it was killed with SIGKILL. Limits.Lifetime still
// bounds it. Another process reaches it with Open; this one lets go of it
// with Detach or ends it for everyone with Close. Leases shorter than
// MinLease are refused.
//
// Without WithLease, a sandbox is tied to the process that made it (the
// default): it ends when that process ends, and no other process can open
// it.
func WithLease(d time.Duration) Option {
	return func(c *config) error {
		if d < MinLease {
			return fmt.Errorf("sandbox: WithLease: %v is shorter than the shortest lease, %v", d, MinLease)
		}
		c.lease = d
		return nil
	}
}

// Info describes a sandbox the library made, as List finds it.
type Info struct {
	ID      string            // as Sandbox.ID
	Image   string            // the image given to WithImage
	Labels  map[string]string // the labels given to WithLabels
	Created time.Time
	Leased  bool      // false: tied to the process that made it
	Expires time.Time // the lease's end as last renewed; zero when not leased or ended
	Running bool      // false: it has ended (Prune removes what remains of it)
	Lease   time.Duration
}

// record is what a sandbox keeps with its instance (driver.Spec.Record) for
// the processes that open it: its settings, never a credential's value.
type record struct {
	V         int      `json:"v"`
	Image     string   `json:"image"`
	Base      string   `json:"base,omitempty"` // the image of the snapshot it was restored from, if not Image
	User      string   `json:"user"`
	Workdir   string   `json:"workdir"`
	Limits    Limits   `json:"limits"`
	Runtime   string   `json:"runtime,omitempty"`
	Proxy     bool     `json:"proxy,omitempty"` // an allow-list (Allow may be empty)
	Allow     []string `json:"allow,omitempty"`
	Open      bool     `json:"open,omitempty"`
	CA        bool     `json:"ca,omitempty"`        // made with credentials: it trusts the proxy's CA
	RelayPort int      `json:"relayPort,omitempty"` // where the proxy is reached inside
}

// recordVersion is record.V as this library writes it.
const recordVersion = 1

// record returns what the sandbox keeps with its instance.
func (s *Sandbox) record() ([]byte, error) {
	r := record{V: recordVersion, Image: s.cfg.image, User: s.user, Workdir: s.cfg.workdir,
		Limits: s.cfg.limits, Runtime: s.cfg.runtime, Open: s.cfg.network.Open}
	if s.base != s.cfg.image {
		r.Base = s.base
	}
	if p := s.cfg.network; p.Allow != nil {
		r.Proxy, r.Allow = true, p.Allow
	}
	if s.proxy != nil {
		r.RelayPort, r.CA = s.proxy.relayPort, s.proxy.ca != nil
	}
	b, err := json.Marshal(r)
	if err == nil && len(b) > driver.RecordMax {
		err = fmt.Errorf("sandbox: the sandbox's settings take %d bytes, more than a leased sandbox keeps (%d): shorten the allow-list", len(b), driver.RecordMax)
	}
	return b, err
}

// Open attaches to a running leased sandbox (see WithLease) by its ID, from
// this or any other process, on this machine or another, that reaches the
// same engine or cluster (the driver given with WithDriver, else
// DefaultDriver). Reaching it needs what creating one needs: the engine's
// socket, or on Kubernetes the RBAC documented there (pods/exec).
//
// The Sandbox has every method; its Close ends the sandbox for everyone,
// its Detach lets go of it. Several processes may have one sandbox open at
// once; each renews its lease while it has it open. Its image, user,
// working directory, limits and network rules are those it was made with:
// the options given here choose the driver, the logger and credentials.
// Credentials are never kept with a sandbox: give WithNetwork with the
// sandbox's own rules and the credentials this process's proxy adds. The
// egress proxy runs in the process that opened the sandbox last (or its
// creator, until another opens it) and that gave an allow-list; when that
// process lets go, the sandbox's connections to the proxy are refused until
// another process opens it.
//
// An unknown ID is an error matching fs.ErrNotExist (ErrNotFound); a
// sandbox that has ended ErrSandboxGone; one tied to the process that made
// it ErrNotLeased, and that sandbox is unharmed.
func Open(ctx context.Context, id string, opts ...Option) (_ *Sandbox, err error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	s := &Sandbox{cfg: cfg, log: cfg.logger, stderr: &tail{}}
	if s.drv, s.ownDrv, err = cfg.backend(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.let()
			s.log.LogAttrs(ctx, slog.LevelError, "sandbox.open", slog.String("sandbox", id), slog.String("error", err.Error()))
		}
	}()
	op, ok := s.drv.(driver.Opener)
	if !ok {
		return nil, fmt.Errorf("%w: Open: the backend (%T) cannot open a sandbox made by another process", ErrUnsupported, s.drv)
	}
	inst, info, err := op.Open(ctx, id, driver.OpenOptions{Stderr: s.stderr, Log: s.log, Timeout: cfg.timeout})
	if err != nil {
		return nil, fmt.Errorf("sandbox: Open: %w", err)
	}
	s.inst, s.id, s.lease = inst, inst.ID(), info.Lease
	if err := s.applyRecord(info); err != nil {
		return nil, err
	}
	if err := s.startAgent(ctx); err != nil {
		return nil, err
	}
	if err := s.startSession(ctx); err != nil {
		return nil, err
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.open",
		slog.String("sandbox", s.ID()), slog.String("image", s.cfg.image), slog.Duration("lease", s.lease),
		slog.Bool("egress", s.proxy != nil), slog.Duration("duration", time.Since(start)))
	return s, nil
}

// applyRecord takes the sandbox's settings from its record, and checks the
// network policy given to Open against them.
func (s *Sandbox) applyRecord(info driver.InstanceInfo) error {
	var r record
	if err := json.Unmarshal(info.Record, &r); err != nil || r.V != recordVersion {
		return fmt.Errorf("sandbox: Open: %s has no settings this library reads (version %d, %v): made by another version of the library?", shortID(s.id), r.V, err)
	}
	given := s.cfg.network
	s.cfg.image, s.base = r.Image, cmp.Or(r.Base, r.Image)
	s.cfg.workdir, s.cfg.limits, s.cfg.runtime, s.cfg.labels = r.Workdir, r.Limits, r.Runtime, info.Labels
	s.user = r.User
	if r.Open {
		s.cfg.network = NetworkPolicy{Open: true}
	} else if r.Proxy {
		s.cfg.network = NetworkPolicy{Allow: append([]string{}, r.Allow...)}
	} else {
		s.cfg.network = NetworkPolicy{}
	}
	if !given.none() {
		if given.Open != r.Open || given.Allow == nil != !r.Proxy || !slices.Equal(given.Allow, r.Allow) {
			return fmt.Errorf("sandbox: Open: WithNetwork's rules differ from those %s was made with (Allow %q, Open %v): give the same rules, with the credentials this process adds",
				shortID(s.id), r.Allow, r.Open)
		}
		if len(given.Credentials) > 0 && !r.CA {
			return fmt.Errorf("sandbox: Open: %s was made without credentials, so it does not trust a proxy that adds them: give credentials when making it", shortID(s.id))
		}
		s.cfg.network.Credentials = given.Credentials
	}
	pol, rules, err := s.cfg.network.parse()
	if err != nil {
		return fmt.Errorf("sandbox: Open: the recorded rules: %w", err)
	}
	s.cfg.network, s.cfg.rules = pol, rules
	if r.RelayPort > 0 {
		if s.proxy, err = s.newProxy(pol, rules, r.RelayPort); err != nil {
			return err
		}
	}
	return nil
}

// renew renews the lease every period (a quarter of it: well inside a
// third) until the session ends.
func (s *Sandbox) renew(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.agent.Done():
			return
		case <-s.renewStop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), min(s.cfg.timeout, every))
			_, err := s.agent.Lease(ctx, true)
			cancel()
			if err != nil {
				s.log.LogAttrs(context.Background(), slog.LevelWarn, "sandbox.lease",
					slog.String("sandbox", s.id), slog.String("error", err.Error()))
			}
		}
	}
}

// Detach lets go of a leased sandbox without ending it: this process's
// streams, proxy and renewals end, commands it started that still run go
// on, detached (see Sessions and AttachCommand; those that ended are
// killed with what they left running), and the
// Sandbox is closed (its methods return ErrClosed); the sandbox runs on
// until its lease ends or another process opens it (Open). A sandbox made
// without WithLease cannot be detached: Detach returns an error matching
// ErrNotLeased and the sandbox stays usable.
func (s *Sandbox) Detach() error {
	if s == nil {
		return ErrClosed
	}
	if s.lease <= 0 {
		return fmt.Errorf("%w: Detach: %s is tied to this process; Close ends it", ErrNotLeased, shortID(s.id))
	}
	done := false
	s.closing.Do(func() {
		done = true
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.let()
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "sandbox.detach", slog.String("sandbox", s.id))
	})
	if !done {
		return ErrClosed
	}
	return nil
}

// let releases what this process holds of the sandbox without ending it.
func (s *Sandbox) let() {
	if s.renewStop != nil {
		close(s.renewStop)
	}
	if s.agent != nil {
		s.agent.Close()
	}
	if s.inst != nil {
		if d, ok := s.inst.(driver.Detacher); ok {
			d.Detach()
		} else {
			s.inst.Stream().Close()
		}
		if s.agent != nil {
			<-s.agent.Done()
		}
	}
	s.exposed.closeAll()
	if s.proxy != nil {
		s.proxy.close()
	}
	if s.ownDrv {
		s.drv.Close()
	}
}

// List returns the sandboxes the library made that the driver (WithDriver,
// else DefaultDriver) can see — every process's, leased and tied to their
// process, running and ended — that carry every label given with
// WithLabels, oldest first. A running leased sandbox's Expires is asked of
// its agent (a short session each, a few at a time); other options are
// ignored.
func List(ctx context.Context, opts ...Option) ([]Info, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	drv, own, err := cfg.backend()
	if err != nil {
		return nil, err
	}
	if own {
		defer drv.Close()
	}
	op, ok := drv.(driver.Opener)
	if !ok {
		return nil, fmt.Errorf("%w: List: the backend (%T) cannot list sandboxes", ErrUnsupported, drv)
	}
	found, err := op.List(ctx, cfg.labels)
	if err != nil {
		return nil, fmt.Errorf("sandbox: List: %w", err)
	}
	infos := make([]Info, len(found))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listQueries)
	for i, f := range found {
		infos[i] = Info{ID: f.ID, Image: f.Image, Labels: f.Labels, Created: f.Created,
			Leased: f.Lease > 0, Running: f.Running, Lease: f.Lease}
		if f.Lease > 0 && f.Running {
			g.Go(func() error {
				infos[i].Expires = leaseEnd(gctx, op, f.ID, cfg.timeout)
				return nil
			})
		}
	}
	g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: List: %w", err)
	}
	slices.SortStableFunc(infos, func(a, b Info) int { return a.Created.Compare(b.Created) })
	return infos, nil
}

// leaseEnd asks a running leased sandbox's agent when its lease ends, in a
// session of its own that renews nothing; zero if it does not answer (it
// may have ended meanwhile).
func leaseEnd(ctx context.Context, op driver.Opener, id string, timeout time.Duration) time.Time {
	inst, _, err := op.Open(ctx, id, driver.OpenOptions{Timeout: timeout})
	if err != nil {
		return time.Time{}
	}
	defer func() {
		if d, ok := inst.(driver.Detacher); ok {
			d.Detach()
		} else {
			inst.Stream().Close()
		}
	}()
	st := inst.Stream()
	conn := agentconn.Start(st, st, timeout)
	defer conn.Close()
	if _, err := conn.Ready(ctx); err != nil {
		return time.Time{}
	}
	asked := time.Now()
	li, err := conn.Lease(ctx, false)
	if err != nil || !li.Leased {
		return time.Time{}
	}
	return asked.Add(li.Left)
}
