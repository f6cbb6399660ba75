package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/egress"
)

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

// create makes the sandbox from cfg, step by step: its backend and user,
// the limits its backend's disk allows, the egress proxy its policy needs,
// its instance, its agent's greeting, then the proxy served and the CA
// installed. On failure it removes what it made.
func create(ctx context.Context, cfg config) (_ *Sandbox, err error) {
	start := time.Now()
	s := &Sandbox{cfg: cfg, log: cfg.logger, base: cfg.image, stderr: &tail{}}
	if cfg.base != "" {
		s.base = cfg.base // restored: the snapshot's own image
	}
	defer func() {
		if err != nil {
			s.teardown()
			s.log.LogAttrs(ctx, slog.LevelError, "sandbox.create", slog.String("image", cfg.image), slog.String("error", err.Error()))
		}
	}()
	if s.drv, s.ownDrv, err = cfg.backend(); err != nil {
		return nil, err
	}
	s.user = s.cfg.user
	if s.user == "" {
		s.user = ownUser() // a restored sandbox gets one of its own too
	}
	disk, err := s.fitDisk(ctx)
	if err != nil {
		return nil, err
	}
	if !cfg.network.none() && !cfg.network.Open { // Open is the backend's (driver.NetworkOpen)
		if s.proxy, err = s.newProxy(cfg.network, cfg.rules, 0); err != nil {
			return nil, err
		}
	}
	s.lease = cfg.lease
	spec, err := s.spec()
	if err != nil {
		return nil, err
	}
	if s.inst, err = s.drv.Create(ctx, spec); err != nil {
		return nil, err
	}
	s.id = s.inst.ID()
	if err := s.startAgent(ctx); err != nil {
		return nil, err
	}
	if err := s.startSession(ctx); err != nil {
		return nil, err
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.create",
		slog.String("sandbox", s.ID()), slog.String("image", cfg.image),
		slog.String("user", s.userIDs()), slog.String("workdir", cfg.workdir),
		slog.String("runtime", cfg.runtime), slog.String("disk", disk), slog.Duration("duration", time.Since(start)))
	return s, nil
}

// ownUser returns a user of a sandbox's own (see WithUser).
func ownUser() string {
	var b [8]byte
	rand.Read(b[:])
	uid := 1_000_000_000 + binary.BigEndian.Uint64(b[:])%900_000_000
	return fmt.Sprintf("%d:%d", uid, uid)
}

// fitDisk makes the limits fit a working directory that the backend keeps
// in memory (see tmpfsDisk), and returns its file system.
func (s *Sandbox) fitDisk(ctx context.Context) (string, error) {
	if s.cfg.limits.Disk <= 0 {
		return driver.DiskMemory.String(), nil // unsized
	}
	caps, err := s.drv.Caps(ctx)
	if err != nil || !caps.Disk.InMemory() {
		return caps.Disk.String(), err
	}
	fit, err := tmpfsDisk(s.cfg.limits, s.cfg.diskSet, s.cfg.tmpSet)
	if err != nil {
		if caps.DiskWhy != "" {
			err = fmt.Errorf("%w (the backend keeps it in memory: %s)", err, caps.DiskWhy)
		}
		return "", err
	}
	if fit != s.cfg.limits {
		s.log.LogAttrs(ctx, slog.LevelWarn, "sandbox.limits", slog.Int64("disk", fit.Disk), slog.Int64("tmp_size", fit.TmpSize),
			slog.String("note", fmt.Sprintf("the working directory is a tmpfs on this backend (RAM, counted towards Limits.Memory): "+
				"the default Limits.Disk of %s (and /tmp and /dev/shm of %s each) made to fit in Limits.Memory of %s; raise Memory for more",
				mib(s.cfg.limits.Disk), mib(s.cfg.limits.TmpSize), mib(s.cfg.limits.Memory))),
			slog.String("why", caps.DiskWhy))
		s.cfg.limits = fit
	}
	return caps.Disk.String(), nil
}

// spec is what the backend makes the sandbox's instance from.
func (s *Sandbox) spec() (*driver.Spec, error) {
	l := s.cfg.limits
	args := agentargs.Args{
		User:     s.user,
		Drawn:    s.cfg.user == "", // the agent may move it into a rootless engine's IDs
		Lease:    s.lease,
		Activity: s.cfg.activity,
	}
	if l.Lifetime > 0 {
		args.Lifetime = ((l.Lifetime-1)/time.Second + 1) * time.Second // whole seconds, rounded up
	}
	env := s.baseEnv()
	if s.proxy != nil {
		args.RelayPort = s.proxy.relayPort
		env = append(env, s.proxy.env()...)
	}
	spec := &driver.Spec{
		Image:   s.cfg.image,
		Pull:    s.cfg.pull == PullMissing,
		Agent:   args,
		Stderr:  s.stderr,
		Workdir: s.cfg.workdir,
		Env:     env,
		Labels:  s.cfg.labels,
		Runtime: s.cfg.runtime,
		Resources: driver.Resources{CPUs: l.CPUs, Memory: l.Memory, PIDs: l.PIDs, Disk: l.Disk, TmpSize: l.TmpSize,
			FileSize: l.FileSize, OpenFiles: l.OpenFiles, Lifetime: l.Lifetime},
		Log:     s.log,
		Timeout: s.cfg.timeout,
	}
	if s.cfg.snapshot != "" {
		spec.Pull = false // the snapshot's image was there
		spec.Labels = maps.Clone(spec.Labels)
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[LabelSnapshot] = s.cfg.snapshot
	}
	if s.cfg.network.Open {
		spec.Network = driver.NetworkOpen
	}
	rec, err := s.record()
	spec.Record = rec
	return spec, err
}

// startSession starts what this process runs beside the agent's stream:
// keepalives, the egress proxy (and the CA the sandbox trusts), the
// lease's renewals.
func (s *Sandbox) startSession(ctx context.Context) error {
	if caps, err := s.drv.Caps(ctx); err == nil && caps.KeepAlive > 0 {
		go s.keepAlive(caps.KeepAlive)
	}
	if s.proxy != nil {
		s.proxy.start(s.agent)
		if s.proxy.ca != nil {
			if err := s.installCA(ctx, s.proxy.ca.CertPEM()); err != nil {
				return fmt.Errorf("sandbox: installing the egress CA: %w", err)
			}
		}
	}
	if s.lease > 0 {
		s.renewStop = make(chan struct{})
		go s.renew(s.lease / 4)
	}
	return nil
}

func (s *Sandbox) baseEnv() []string {
	env := []string{"HOME=" + s.cfg.workdir, "PYTHONUNBUFFERED=1", "LANG=C.UTF-8"}
	return append(env, s.cfg.env...) // later entries win
}

// startAgent talks to the agent over the instance's stream until it has
// said hello: it resolved the user in the image, gave it the working
// directory, and found the limits in force.
func (s *Sandbox) startAgent(ctx context.Context) error {
	st := s.inst.Stream()
	s.agent = agentconn.Start(st, st, s.cfg.timeout)
	hello, err := s.agent.Ready(ctx)
	if said := s.stderr.String(); errors.Is(err, agentconn.ErrGone) && said != "" {
		// It said why it stopped: a user the image does not have, say.
		return fmt.Errorf("sandbox: the sandbox's agent did not start: %s", said)
	}
	if err != nil {
		return s.initErr("the sandbox's agent did not start"+s.stderr.say(), err)
	}
	s.uid, s.gid, s.noActs = int(hello.UID), int(hello.GID), hello.NoActivity
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

// keepAlive pings the agent every period until its stream ends, for a
// backend whose idle streams are cut (driver.Caps.KeepAlive).
func (s *Sandbox) keepAlive(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.agent.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
			s.agent.Ping(ctx) // a failure shows in the next request
			cancel()
		}
	}
}

// installCA writes the sandbox's CA (PEM), alone and appended to the
// image's system bundle, where the proxy's environment points (see
// proxy.env).
func (s *Sandbox) installCA(ctx context.Context, ca []byte) error {
	bundle := append([]byte(nil), ca...)
	for _, p := range systemBundles {
		if sys, err := s.ReadFile(ctx, p); err == nil {
			bundle = append(append(sys, '\n'), ca...)
			break
		}
	}
	if err := s.WriteFile(ctx, caPath, ca, 0o644); err != nil {
		return err
	}
	return s.WriteFile(ctx, caBundlePath, bundle, 0o644)
}

// logDecision records one of the egress proxy's decisions in the audit log.
func (s *Sandbox) logDecision(d egress.Decision) {
	attrs := []slog.Attr{slog.String("sandbox", s.id), slog.Bool("allowed", d.Allowed),
		slog.String("method", d.Method), slog.String("host", d.Host), slog.Int("port", d.Port)}
	if d.Addr != "" {
		attrs = append(attrs, slog.String("addr", d.Addr))
	}
	if d.Reason != "" {
		attrs = append(attrs, slog.String("reason", d.Reason))
	}
	if d.Credential != "" {
		attrs = append(attrs, slog.String("credential_header", d.Credential))
	}
	attrs = append(attrs, slog.Int64("bytes_up", d.BytesUp), slog.Int64("bytes_down", d.BytesDown))
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "sandbox.network", attrs...)
}
