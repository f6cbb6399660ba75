package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/tarsafe"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// abs returns the absolute, clean path of name in the sandbox.
func (s *Sandbox) abs(name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(s.cfg.workdir, name)
}

// readLimit is the most bytes one read takes from the sandbox (0: no limit).
func (s *Sandbox) readLimit() int64 { return max(s.cfg.limits.FileSize, 0) }

// fileOp runs a file operation on the absolute path p in the agent. body,
// if not nil, sends the operation's input or takes its output; if it
// fails, the operation is aborted and body's error returned, unless the
// operation had failed first. The error is for a *fs.PathError.
func (s *Sandbox) fileOp(ctx context.Context, req wire.FileRequest, body func(*agentconn.FileOp) error) (wire.FileResult, error) {
	if err := s.check(); err != nil {
		return wire.FileResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return wire.FileResult{}, err
	}
	req.Uid, req.Gid = uint32(s.uid), uint32(s.gid)
	op, err := s.agent.File(ctx, req)
	if err != nil {
		return wire.FileResult{}, s.fileConnErr(string(req.Op), err)
	}
	defer op.Close()
	if body != nil {
		if err := body(op); err != nil {
			if !op.Finishing() {
				return wire.FileResult{}, s.fileConnErr(string(req.Op), err)
			}
			// The operation ended first (a cut archive, input refused):
			// its result says why, unless it succeeded.
			res, rerr := op.Result()
			if rerr == nil && res.Err != nil {
				return res, resultErr(res.Err, string(req.Path))
			}
			return res, s.fileConnErr(string(req.Op), err)
		}
	}
	res, err := op.Result()
	if err != nil {
		return res, s.fileConnErr(string(req.Op), err)
	}
	return res, resultErr(res.Err, string(req.Path))
}

// fileConnErr is the error for a file operation that did not get through
// to its end: the sandbox gone or silent, the context ended, or a failure
// on the library's side.
func (s *Sandbox) fileConnErr(op string, err error) error {
	if errors.Is(err, agentconn.ErrGone) || errors.Is(err, agentconn.ErrNoAnswer) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if c := s.check(); c != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return c
		}
		return s.initErr(op, err)
	}
	return err
}

// resultErr is the error a file operation's result reports.
func resultErr(fe *wire.FileError, p string) error {
	if fe == nil {
		return nil
	}
	var err error
	switch {
	case fe.Code == wire.CodeTooLarge:
		err = fmt.Errorf("%w: %s", ErrFileTooLarge, fe.Text)
	case fe.Code == wire.CodeNotRegular:
		err = fmt.Errorf("%w: %s", ErrNotRegular, fe.Text)
	case fe.Code == wire.CodeBadName:
		err = fmt.Errorf("%w: %s", ErrUnsafePath, fe.Text)
	case fe.Code == wire.CodeNotStill:
		err = fmt.Errorf("%w: %s", ErrNotStopped, fe.Text)
	case fe.Errno != 0:
		err = syscall.Errno(fe.Errno)
	default:
		err = errors.New(fe.Text)
	}
	if len(fe.Path) > 0 && string(fe.Path) != p && fe.Code != wire.CodeBadName {
		err = fmt.Errorf("%s: %w", fe.Path, err)
	}
	return err
}

// WriteFile writes data to the named file, creating or replacing it with
// permissions perm (exactly: the umask does not apply), owned by the
// sandbox user. The directory must exist. The file is replaced as a whole:
// a symbolic link or hard link at name is replaced, never written
// through, and readers in the sandbox see the old contents or the new.
func (s *Sandbox) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	p := s.abs(name)
	err := s.writeFile(ctx, p, data, perm)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.write", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int("bytes", len(data)), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "write", Path: name, Err: err}
	}
	return nil
}

func (s *Sandbox) writeFile(ctx context.Context, p string, data []byte, perm fs.FileMode) error {
	if p == "/" {
		return syscall.EISDIR
	}
	_, err := s.fileOp(ctx, wire.FileRequest{Op: wire.Write, Path: []byte(p), Perm: uint32(perm.Perm())},
		func(op *agentconn.FileOp) error {
			if _, err := op.Write(data); err != nil {
				return err
			}
			return op.CloseInput()
		})
	return err
}

// ReadFile reads the named regular file, following symbolic links. It
// refuses anything else (ErrNotRegular, or syscall.EISDIR for a directory)
// and files larger than Limits.FileSize (ErrFileTooLarge).
func (s *Sandbox) ReadFile(ctx context.Context, name string) ([]byte, error) {
	p := s.abs(name)
	data, err := s.readFile(ctx, p)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.read", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int("bytes", len(data)), errAttr(err))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return data, nil
}

func (s *Sandbox) readFile(ctx context.Context, p string) ([]byte, error) {
	data, err := s.readOutput(ctx, wire.FileRequest{Op: wire.Read, Path: []byte(p)})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// readOutput runs a file operation with output and returns the output, of
// at most readLimit bytes.
func (s *Sandbox) readOutput(ctx context.Context, req wire.FileRequest) ([]byte, error) {
	req.Limit = s.readLimit()
	var data []byte
	_, err := s.fileOp(ctx, req, func(op *agentconn.FileOp) error {
		var err error
		data, err = op.ReadAll(req.Limit)
		if errors.Is(err, agentconn.ErrTooMuch) {
			err = fmt.Errorf("%w: more than %d bytes", ErrFileTooLarge, req.Limit)
		}
		return err
	})
	return data, err
}

// Stat returns information about the named file, following symbolic links.
func (s *Sandbox) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	p := s.abs(name)
	fi, err := s.stat(ctx, p, true)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.stat", slog.String("sandbox", s.id),
		slog.String("path", p), errAttr(err))
	if err != nil {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	return fi, nil
}

func (s *Sandbox) stat(ctx context.Context, p string, follow bool) (fs.FileInfo, error) {
	op := wire.Stat
	if !follow {
		op = wire.Lstat
	}
	res, err := s.fileOp(ctx, wire.FileRequest{Op: op, Path: []byte(p)}, nil)
	if err != nil {
		return nil, err
	}
	if res.Info == nil {
		return nil, errors.New("sandbox: stat: no answer from the agent")
	}
	return newFileInfo(path.Base(p), *res.Info), nil
}

func newFileInfo(name string, fi wire.FileInfo) fileInfo {
	return fileInfo{name: name, size: fi.Size, mode: fs.FileMode(fi.Mode), mtime: time.Unix(0, fi.Mtime)}
}

// fileInfo describes a file of the sandbox.
type fileInfo struct {
	name  string
	size  int64
	mode  fs.FileMode
	mtime time.Time
}

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return fi.size }
func (fi fileInfo) Mode() fs.FileMode  { return fi.mode }
func (fi fileInfo) ModTime() time.Time { return fi.mtime }
func (fi fileInfo) IsDir() bool        { return fi.mode.IsDir() }
func (fi fileInfo) Sys() any           { return nil }
func (fi fileInfo) String() string     { return fs.FormatFileInfo(fi) }

// ReadDir reads the named directory and returns its entries sorted by name.
// Each entry's Info was taken with the listing and describes a symbolic
// link itself. A listing of more than Limits.FileSize bytes (about 20 bytes
// plus the name per entry) is refused with ErrFileTooLarge.
func (s *Sandbox) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	p := s.abs(name)
	ents, err := s.readDir(ctx, p)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.readdir", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int("entries", len(ents)), errAttr(err))
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
	}
	return ents, nil
}

func (s *Sandbox) readDir(ctx context.Context, p string) ([]fs.DirEntry, error) {
	list, err := s.readOutput(ctx, wire.FileRequest{Op: wire.ReadDir, Path: []byte(p)})
	if err != nil {
		return nil, err
	}
	var ents []fs.DirEntry
	for b := list; len(b) > 0; {
		name, fi, rest, ok := wire.ParseDirRecord(b)
		if !ok {
			return nil, errors.New("sandbox: readdir: malformed listing from the agent")
		}
		ents = append(ents, dirEntry{newFileInfo(string(name), fi)})
		b = rest
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

// dirEntry is an entry of a directory listing.
type dirEntry struct{ fi fileInfo }

func (d dirEntry) Name() string               { return d.fi.name }
func (d dirEntry) IsDir() bool                { return d.fi.IsDir() }
func (d dirEntry) Type() fs.FileMode          { return d.fi.mode.Type() }
func (d dirEntry) Info() (fs.FileInfo, error) { return d.fi, nil }
func (d dirEntry) String() string             { return fs.FormatDirEntry(d) }

// MkdirAll creates the named directory and any missing parents with
// permissions perm (before the sandbox's umask, 022), as the sandbox user.
// An existing directory is not an error; an existing file is
// (syscall.ENOTDIR).
func (s *Sandbox) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	p := s.abs(name)
	_, err := s.fileOp(ctx, wire.FileRequest{Op: wire.MkdirAll, Path: []byte(p), Perm: uint32(perm.Perm())}, nil)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.mkdir", slog.String("sandbox", s.id),
		slog.String("path", p), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	return nil
}

// Remove removes the named file or empty directory, as the sandbox user,
// like os.Remove: a symbolic link is removed, not what it points to; a
// missing name is an error satisfying errors.Is(err, fs.ErrNotExist), and
// a directory that is not empty one satisfying errors.Is(err,
// syscall.ENOTEMPTY). RemoveAll removes trees.
func (s *Sandbox) Remove(ctx context.Context, name string) error {
	return s.remove(ctx, name, wire.Remove)
}

// RemoveAll removes the named file or directory with everything in it, as
// the sandbox user, like os.RemoveAll: a missing name is not an error, and
// a symbolic link is removed, not what it points to.
func (s *Sandbox) RemoveAll(ctx context.Context, name string) error {
	return s.remove(ctx, name, wire.RemoveAll)
}

func (s *Sandbox) remove(ctx context.Context, name string, op wire.FileOp) error {
	p := s.abs(name)
	_, err := s.fileOp(ctx, wire.FileRequest{Op: op, Path: []byte(p)}, nil)
	if op == wire.RemoveAll && errors.Is(err, syscall.ENOENT) {
		err = nil
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.remove", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Bool("all", op == wire.RemoveAll), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	return nil
}

// CopyIn copies the tree of src (for example os.DirFS("./project")) into
// directory dst in the sandbox, creating dst if needed. Files are owned by
// the sandbox user and keep their permission bits and modification times;
// symbolic links are copied as they are when src implements
// fs.ReadLinkFS. What exists at a copied name is replaced.
func (s *Sandbox) CopyIn(ctx context.Context, dst string, src fs.FS) error {
	p := s.abs(dst)
	var sent int64
	_, err := s.fileOp(ctx, wire.FileRequest{Op: wire.MkdirAll, Path: []byte(p), Perm: 0o755}, nil)
	if err == nil {
		_, err = s.fileOp(ctx, wire.FileRequest{Op: wire.Untar, Path: []byte(p)}, func(op *agentconn.FileOp) error {
			cw := &countWriter{w: op, n: &counter{}}
			err := tarsafe.FromFS(cw, src, ".", tarsafe.Header{Uid: s.uid, Gid: s.gid})
			sent = cw.n.n
			if err != nil {
				return err
			}
			return op.CloseInput()
		})
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.copyin", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int64("tar_bytes", sent), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "copyin", Path: dst, Err: err}
	}
	return nil
}

// CopyOption configures CopyOut.
type CopyOption func(*copyOptions)

type copyOptions struct {
	maxBytes   int64
	maxEntries int
	strict     bool
	skipped    func(name, target string)
}

// DefaultCopyEntries is how many archive entries (files, directories,
// links) CopyOut takes at most unless CopyLimit says otherwise.
const DefaultCopyEntries = 1_000_000

// CopyLimit bounds what CopyOut writes on the host: at most maxBytes bytes
// of file contents, counted at each file's full size (a sparse file counts
// as if its holes were data, and is written in full), and at most
// maxEntries entries. Past either bound CopyOut stops with an error
// wrapping ErrTooLarge; the sandbox stops sending as soon as the next file
// would not fit. Zero keeps a default: maxBytes the larger of Limits.Disk
// and 1 GiB, maxEntries DefaultCopyEntries. Bounds cannot be removed.
func CopyLimit(maxBytes int64, maxEntries int) CopyOption {
	return func(o *copyOptions) {
		if maxBytes > 0 {
			o.maxBytes = maxBytes
		}
		if maxEntries > 0 {
			o.maxEntries = maxEntries
		}
	}
}

// StrictLinks makes CopyOut stop with an error wrapping ErrUnsafePath at
// the first symbolic link that points outside the host directory, instead
// of leaving it out.
func StrictLinks() CopyOption { return func(o *copyOptions) { o.strict = true } }

// OnSkippedLink has CopyOut call f, in the calling goroutine, for each
// symbolic link it leaves out because the link points outside the host
// directory: name is the link's path relative to the host directory,
// target what the link holds.
func OnSkippedLink(f func(name, target string)) CopyOption {
	return func(o *copyOptions) { o.skipped = f }
}

// maxSkippedLogged bounds the skipped links named in one audit record.
const maxSkippedLogged = 32

// CopyOut copies src (a file or a directory tree) from the sandbox into the
// existing host directory hostDir, as hostDir/base(src) — like docker cp.
// It reads as the sandbox user: a file that user cannot read stops the
// copy with fs.ErrPermission.
//
// It never creates or changes anything outside hostDir. Symbolic links
// whose target stays inside hostDir are kept as links. A link whose target
// is absolute or leads outside hostDir (a virtual environment's
// bin/python -> /usr/bin/python3, say) is not created and not followed: it
// is left out, named in the audit record and passed to OnSkippedLink, and
// the rest is copied; with StrictLinks it stops the copy with an error
// wrapping ErrUnsafePath instead. Devices, FIFOs and sockets are left out;
// set-id bits are dropped and files are owned by the calling user.
//
// What reaches the host is bounded (see CopyLimit): by default at most the
// larger of Limits.Disk and 1 GiB of file contents, sparse files counted at
// their full size, and DefaultCopyEntries entries. Files copied before an
// error stay.
func (s *Sandbox) CopyOut(ctx context.Context, src, hostDir string, opts ...CopyOption) error {
	o := copyOptions{maxBytes: max(s.cfg.limits.Disk, 1<<30), maxEntries: DefaultCopyEntries}
	for _, opt := range opts {
		opt(&o)
	}
	p := s.abs(src)
	cr := &countWriter{w: io.Discard, n: &counter{}}
	var skipped []string
	nskipped := 0
	xo := tarsafe.ExtractOptions{MaxBytes: o.maxBytes, MaxEntries: o.maxEntries}
	if !o.strict {
		xo.SkipLink = func(name, target string) {
			if nskipped++; len(skipped) < maxSkippedLogged {
				skipped = append(skipped, name+" -> "+target)
			}
			if o.skipped != nil {
				o.skipped(name, target)
			}
		}
	}
	var hostErr error
	res, err := s.fileOp(ctx, wire.FileRequest{Op: wire.Tar, Path: []byte(p), Limit: o.maxBytes}, func(op *agentconn.FileOp) error {
		r := io.TeeReader(op, cr)
		hostErr = tarsafe.Extract(r, hostDir, xo)
		if hostErr == nil {
			// The archive's end: zero blocks, nothing else.
			if n, _ := io.Copy(io.Discard, io.LimitReader(r, 1<<20)); n == 1<<20 {
				hostErr = errors.New("data after the end of the archive")
			}
		}
		return hostErr
	})
	if hostErr != nil && (errors.Is(hostErr, tarsafe.ErrUnsafePath) || errors.Is(hostErr, tarsafe.ErrTooLarge) || err == nil) {
		err = hostErr
	}
	switch {
	case errors.Is(err, tarsafe.ErrUnsafePath) && !errors.Is(err, ErrUnsafePath):
		err = fmt.Errorf("%w: %w", ErrUnsafePath, err)
	case errors.Is(err, tarsafe.ErrTooLarge), errors.Is(err, ErrFileTooLarge):
		err = fmt.Errorf("%w: over CopyLimit (%d bytes of file contents, %d entries): %v",
			ErrTooLarge, o.maxBytes, o.maxEntries, err)
	}
	attrs := []slog.Attr{slog.String("sandbox", s.id), slog.String("path", p), slog.String("host_dir", hostDir),
		slog.Int64("tar_bytes", cr.n.n)}
	if nskipped > 0 {
		attrs = append(attrs, slog.Int("skipped_links", nskipped), slog.Any("skipped", skipped))
	}
	if res.Skips > 0 { // directories the agent could not open for want of descriptors
		attrs = append(attrs, slog.Int64("skipped_dirs", res.Skips), slog.Any("skipped_dir_names", skippedNames(res.Skipped)))
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.copyout", append(attrs, errAttr(err))...)
	if err != nil {
		return &fs.PathError{Op: "copyout", Path: src, Err: err}
	}
	return nil
}

// FS returns a read-only view of the sandbox's filesystem rooted at "/"
// (names as the package documentation's Files section says: an fs.FS
// name, "workspace/data.csv", never "/workspace/data.csv"),
// for use with io/fs functions (fs.WalkDir, fs.Glob, fs.Sub, template
// parsing...). Every call reaches the sandbox with ctx. Files are read whole
// when opened, with ReadFile's bounds. It implements fs.StatFS,
// fs.ReadFileFS and fs.ReadDirFS.
func (s *Sandbox) FS(ctx context.Context) fs.FS { return sandboxFS{s: s, ctx: ctx} }

type sandboxFS struct {
	s   *Sandbox
	ctx context.Context
}

func (f sandboxFS) path(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return path.Clean("/" + name), nil
}

// fixErr reports errors with the fs.FS name rather than the absolute path.
func fixErr(err error, op, name string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return &fs.PathError{Op: op, Path: name, Err: pe.Err}
	}
	return err
}

func (f sandboxFS) Open(name string) (fs.File, error) {
	p, err := f.path("open", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.s.stat(f.ctx, p, true)
	if err != nil || fi.IsDir() {
		// One record for the call: the stat (a file's is the read's).
		f.s.log.LogAttrs(f.ctx, slog.LevelInfo, "sandbox.file.stat", slog.String("sandbox", f.s.id),
			slog.String("path", p), errAttr(err))
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	if fi.IsDir() {
		return &openDir{fs: f, path: p, name: name, info: fi}, nil
	}
	data, err := f.s.ReadFile(f.ctx, p)
	if err != nil {
		return nil, fixErr(err, "open", name)
	}
	return &openFile{Reader: bytes.NewReader(data), info: fi}, nil
}

func (f sandboxFS) Stat(name string) (fs.FileInfo, error) {
	p, err := f.path("stat", name)
	if err != nil {
		return nil, err
	}
	fi, err := f.s.Stat(f.ctx, p)
	return fi, fixErr(err, "stat", name)
}

func (f sandboxFS) ReadFile(name string) ([]byte, error) {
	p, err := f.path("readfile", name)
	if err != nil {
		return nil, err
	}
	data, err := f.s.ReadFile(f.ctx, p)
	return data, fixErr(err, "readfile", name)
}

func (f sandboxFS) ReadDir(name string) ([]fs.DirEntry, error) {
	p, err := f.path("readdir", name)
	if err != nil {
		return nil, err
	}
	ents, err := f.s.ReadDir(f.ctx, p)
	return ents, fixErr(err, "readdir", name)
}

type openFile struct {
	*bytes.Reader
	info fs.FileInfo
}

func (o *openFile) Stat() (fs.FileInfo, error) { return o.info, nil }
func (o *openFile) Close() error               { return nil }

type openDir struct {
	fs   sandboxFS
	path string
	name string
	info fs.FileInfo
	ents []fs.DirEntry
	read bool
}

func (d *openDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *openDir) Close() error               { return nil }
func (d *openDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.name, Err: syscall.EISDIR}
}

func (d *openDir) ReadDir(n int) ([]fs.DirEntry, error) {
	if !d.read {
		ents, err := d.fs.s.ReadDir(d.fs.ctx, d.path)
		if err != nil {
			return nil, fixErr(err, "readdir", d.name)
		}
		d.ents, d.read = ents, true
	}
	if n <= 0 {
		ents := d.ents
		d.ents = nil
		return ents, nil
	}
	if len(d.ents) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.ents))
	ents := d.ents[:n]
	d.ents = d.ents[n:]
	return ents, nil
}

// skippedNames are the names of entries an archive left out, for a log.
func skippedNames(names [][]byte) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = string(n)
	}
	return out
}
