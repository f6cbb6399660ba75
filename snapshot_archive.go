package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"time"

	"github.com/agentsandbox/sandbox/internal/blob"
	"github.com/agentsandbox/sandbox/internal/snapfile"
)

// SnapshotFormat is the version of the archive format WriteTo writes and
// ReadSnapshot reads (see Snapshot.WriteTo).
const SnapshotFormat = snapfile.Version

// WriteTo writes the snapshot to w as an archive that ReadSnapshot reads
// back, in this or any other process or machine, and returns the number
// of bytes written. It implements io.WriterTo. The snapshot stays usable;
// WriteTo after Remove fails.
//
// The archive, format version 1 (SnapshotFormat; docs/snapshot-format.md
// in the module), is:
//
//	magic     8 bytes   89 53 4E 41 50 0D 0A 1A ("\x89SNAP\r\n\x1a")
//	version   4 bytes   big-endian, 1
//	length    4 bytes   big-endian, the manifest's length (at most 1 MiB)
//	manifest  JSON: format, digest, size, base_image, source, user,
//	          workdir, limits, env, labels, runtime, network
//	content   size bytes: a tar (PAX) of the working directory, whose
//	          SHA-256 is the manifest's digest and the snapshot's ID
//
// and nothing after it, so archives can follow one another on a stream.
// The manifest holds what a restore needs: the base image, the user as
// given to WithUser ("" for a user of the sandbox's own, drawn again at
// each restore), the working directory, the limits in force, the
// environment given with WithEnv, labels, runtime and the network
// policy's rules (Allow and Open). It never holds a credential of the
// network policy (NetworkPolicy.Credentials): give them again with
// WithNetwork to ReadSnapshot or New. The environment is written as it
// was given: do not put secrets there. A change that a reader of version
// 1 could misread takes a new version; ReadSnapshot refuses versions it
// does not know.
func (sn *Snapshot) WriteTo(w io.Writer) (n int64, err error) {
	start := time.Now()
	defer func() {
		sn.cfg.logger.LogAttrs(context.Background(), slog.LevelInfo, "sandbox.snapshot.write", slog.String("snapshot", sn.ID()),
			slog.Int64("bytes", n), slog.Duration("duration", time.Since(start)), errAttr(err))
	}()
	if err := sn.acquire(); err != nil {
		return 0, fmt.Errorf("sandbox: snapshot WriteTo: %w", err)
	}
	defer sn.release()
	n, err = snapfile.WriteHeader(w, sn.manifest())
	if err != nil {
		return n, fmt.Errorf("sandbox: snapshot WriteTo: %w", err)
	}
	c, err := sn.content.WriteTo(w) // to a file: in the kernel, as cat copies
	n += c
	if err != nil {
		return n, fmt.Errorf("sandbox: snapshot WriteTo: %w", err)
	}
	return n, nil
}

// manifest describes the snapshot: its content and the settings a restore
// needs, the network policy's rules without its credentials.
func (sn *Snapshot) manifest() *snapfile.Manifest {
	c := &sn.cfg
	l := c.limits
	m := &snapfile.Manifest{
		Digest: sn.ID(), Size: sn.Size(), Base: sn.base, Source: sn.source,
		User: c.user, Workdir: c.workdir, Env: c.env, Labels: c.labels, Runtime: c.runtime,
		Limits: snapfile.Limits{
			CPUs: l.CPUs, Memory: l.Memory, PIDs: l.PIDs, Disk: l.Disk, FileSize: l.FileSize, OpenFiles: l.OpenFiles,
			ExecTimeoutNS: int64(l.ExecTimeout), OutputBytes: l.OutputBytes, LifetimeNS: int64(l.Lifetime), TmpSize: l.TmpSize,
			DiskGiven: c.diskSet, TmpSizeGiven: c.tmpSet,
		},
	}
	if p := c.network; !p.none() {
		// The rules alone: never Credentials.
		m.Network = &snapfile.Network{Allow: p.Allow, Open: p.Open}
		if m.Network.Allow == nil && !p.Open {
			m.Network.Allow = []string{}
		}
	}
	return m
}

// ReadSnapshot reads a snapshot that Snapshot.WriteTo wrote, in this or
// any other process, and returns it with the same ID. The content goes to
// a temporary file without a name, as a Snapshot's does, and is checked as
// it streams in; ReadSnapshot returns only once its digest matches the
// manifest's, and reads nothing past the archive's end. ctx is checked
// between reads of r (a read that blocks is not interrupted).
//
// The snapshot's settings are the manifest's (see WriteTo), with opts
// applied on top as Snapshot.New applies its own: WithDriver, WithHost,
// WithLogger (the audit log of the read and of restored sandboxes),
// WithLimits (fields given replace the manifest's), WithEnv (added),
// WithNetwork (replaces the rules; give credentials here, the archive has
// none), WithImage (the base image under another name, such as a
// registry mirror's), WithPool (every restore takes a pool's sandbox).
// New, Fork and WithPool restores then work as from a snapshot taken in
// this process, on any backend whose engine has the base image (a pool
// for them is made with the source's options, its credentials only if
// given here too). An
// archive from someone you do not trust chooses those settings: its
// limits, its user and its network rules among them; give WithLimits and
// WithNetwork to decide them yourself.
//
// An archive is refused, before anything is returned, with an error
// wrapping:
//   - ErrSnapshotCorrupt: not a snapshot archive (another magic), a
//     manifest over 1 MiB (also ErrTooLarge) or not valid (bad JSON, a
//     digest that is not sha256, settings an Option refuses, such as a
//     reserved label or a working directory under /proc), content that is
//     not a snapshot's tar (entries other than directories, files and
//     links; data after the tar's end), an archive that ends early (also
//     io.ErrUnexpectedEOF), or content whose digest is not the manifest's;
//   - ErrSnapshotCorrupt and ErrUnsafePath: an entry that would land
//     outside the working directory: an absolute name, one climbing out
//     with "..", a hard link to such a name, or an entry whose path runs
//     through a symbolic link of the archive (symbolic links themselves
//     may point anywhere, as in the sandbox they were taken from);
//   - ErrTooLarge: content over the bound a capture of the snapshot's
//     sandbox has: file contents over its Limits.Disk (or Memory, for an
//     unsized working directory), or a content size over that plus the
//     bound on entries' headers (see Sandbox.Snapshot); neither bound
//     applies when the limits bound neither;
//   - ErrUnsupported: an archive of a format version this library does
//     not read.
//
// Errors of r and of ctx are returned wrapped.
func ReadSnapshot(ctx context.Context, r io.Reader, opts ...Option) (_ *Snapshot, err error) {
	start := time.Now()
	log := loggerOf(opts)
	var m *snapfile.Manifest
	defer func() {
		attrs := []slog.Attr{slog.Duration("duration", time.Since(start)), errAttr(err)}
		if m != nil {
			attrs = append(attrs, slog.String("snapshot", m.Digest), slog.Int64("bytes", m.Size), slog.String("source", m.Source))
		}
		level := slog.LevelInfo
		if err != nil {
			level = slog.LevelError
		}
		log.LogAttrs(ctx, level, "sandbox.snapshot.read", attrs...)
	}()
	rd := ctxReader{ctx: ctx, r: r}
	m, err = snapfile.ReadHeader(rd)
	if err != nil {
		return nil, readErr(err, 0)
	}
	cfg, err := snapshotConfig(m, opts)
	if err != nil {
		return nil, err
	}
	bound := contentBound(cfg.limits)
	if ab := archiveBound(bound); ab > 0 && m.Size > ab {
		return nil, fmt.Errorf("%w: sandbox: ReadSnapshot: the content would take %d bytes, more than the %d a capture of its sandbox may (%d of file contents, the disk limit, and %d of entries' headers); give WithLimits with a larger Disk to read it",
			ErrTooLarge, m.Size, ab, bound, ab-bound)
	}
	w, err := blob.NewWriter("", 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox: ReadSnapshot: %w", err)
	}
	if err := snapfile.CopyContent(w, rd, m.Size, bound); err != nil {
		w.Abort()
		return nil, readErr(err, bound)
	}
	content, err := w.Finish()
	if err != nil {
		return nil, fmt.Errorf("sandbox: ReadSnapshot: %w", err)
	}
	if got := content.Digest(); got != m.Digest {
		content.Close()
		return nil, fmt.Errorf("%w: sandbox: ReadSnapshot: the content's digest is %s, the manifest says %s: the archive was damaged or altered",
			ErrSnapshotCorrupt, got, m.Digest)
	}
	sn := &Snapshot{content: content, cfg: cfg, base: cfg.image, source: m.Source}
	// Forgotten without Remove: its file is closed with it.
	runtime.AddCleanup(sn, func(b *blob.Blob) { b.Close() }, content)
	return sn, nil
}

// readErr is ReadSnapshot's error for err, an error of package snapfile
// (or of the reader) with content bound bound.
func readErr(err error, bound int64) error {
	switch {
	case errors.Is(err, snapfile.ErrVersion):
		return fmt.Errorf("%w: sandbox: ReadSnapshot: %w", ErrUnsupported, err)
	case errors.Is(err, snapfile.ErrUnsafePath):
		return fmt.Errorf("%w: %w: %w", ErrSnapshotCorrupt, ErrUnsafePath, err)
	case errors.Is(err, snapfile.ErrFormat) && errors.Is(err, snapfile.ErrTooLarge):
		return fmt.Errorf("%w: %w: %w", ErrSnapshotCorrupt, ErrTooLarge, err)
	case errors.Is(err, snapfile.ErrFormat), errors.Is(err, snapfile.ErrTruncated):
		return fmt.Errorf("%w: %w", ErrSnapshotCorrupt, err)
	case errors.Is(err, snapfile.ErrTooLarge):
		return fmt.Errorf("%w: sandbox: ReadSnapshot: %w (the disk limit's %d bytes); give WithLimits with a larger Disk to read it", ErrTooLarge, err, bound)
	}
	return fmt.Errorf("sandbox: ReadSnapshot: %w", err)
}

// snapshotConfig is the configuration of a snapshot read with manifest m:
// the manifest's settings, each checked by the Option that sets it, then
// opts on top, as Snapshot.New applies its own.
func snapshotConfig(m *snapfile.Manifest, opts []Option) (config, error) {
	c := config{
		workdir: "/workspace",
		logger:  slog.New(slog.DiscardHandler),
		timeout: DefaultTimeout,
		pull:    defaultPull(),
	}
	from := []Option{WithImage(m.Base), WithWorkdir(m.Workdir)}
	if m.User != "" {
		from = append(from, WithUser(m.User))
	}
	if len(m.Env) > 0 {
		from = append(from, WithEnv(m.Env...))
	}
	if len(m.Labels) > 0 {
		from = append(from, WithLabels(m.Labels))
	}
	if m.Runtime != "" {
		from = append(from, WithRuntime(m.Runtime))
	}
	if n := m.Network; n != nil {
		from = append(from, WithNetwork(NetworkPolicy{Allow: n.Allow, Open: n.Open}))
	}
	for _, o := range from {
		if err := o(&c); err != nil {
			return c, fmt.Errorf("%w: sandbox: ReadSnapshot: the manifest's settings: %v", ErrSnapshotCorrupt, err)
		}
	}
	ml := m.Limits
	limits := Limits{
		CPUs: ml.CPUs, Memory: ml.Memory, PIDs: ml.PIDs, Disk: ml.Disk, FileSize: ml.FileSize, OpenFiles: ml.OpenFiles,
		ExecTimeout: time.Duration(ml.ExecTimeoutNS), OutputBytes: ml.OutputBytes, Lifetime: time.Duration(ml.LifetimeNS), TmpSize: ml.TmpSize,
	}.merge(DefaultLimits()) // a field a later writer left out: the default
	if err := limits.validate(); err != nil {
		return c, fmt.Errorf("%w: sandbox: ReadSnapshot: the manifest's limits: %v", ErrSnapshotCorrupt, err)
	}
	c.diskSet, c.tmpSet = ml.DiskGiven, ml.TmpSizeGiven
	c.limits = Limits{}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return c, err
		}
	}
	c.limits = c.limits.merge(limits)
	if err := c.limits.validate(); err != nil {
		return c, err
	}
	c.snapshot, c.base = "", ""
	return c, nil
}

// loggerOf is the logger opts set, for records made before they are
// applied in earnest.
func loggerOf(opts []Option) *slog.Logger {
	c := config{logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&c)
	}
	return c.logger
}

// ctxReader fails its reads once ctx has ended.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
