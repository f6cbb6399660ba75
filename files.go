package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/agentsandbox/sandbox/internal/tarsafe"
)

// File operations. A relative name is relative to the sandbox's working
// directory; an absolute name may point anywhere in the sandbox. Errors are
// *fs.PathError values, and a missing file satisfies
// errors.Is(err, fs.ErrNotExist). WriteFile, ReadFile, Stat and the Copy
// methods go through the engine's archive API (which resolves symbolic
// links inside the container, never on the host); ReadDir, MkdirAll and
// Remove run a small shell command as the sandbox user, so they are bound
// by that user's permissions.

// abs returns the absolute, clean path of name in the sandbox.
func (s *Sandbox) abs(name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(s.cfg.workdir, name)
}

// pathErr wraps an engine error for a file operation.
func (s *Sandbox) pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	if c := s.check(); c != nil {
		return &fs.PathError{Op: op, Path: name, Err: c}
	}
	msg := err.Error()
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case strings.Contains(msg, "No such container"):
		err = s.engineErr(op, err)
	case strings.Contains(msg, "Could not find the file"), strings.Contains(msg, "no such file"),
		strings.Contains(msg, "not found"):
		err = fs.ErrNotExist
	case strings.Contains(msg, "read-only"):
		err = syscall.EROFS
	case strings.Contains(msg, "not a directory"):
		err = syscall.ENOTDIR
	case strings.Contains(msg, "no space left"):
		err = syscall.ENOSPC
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// WriteFile writes data to the named file, creating or replacing it with
// permissions perm, owned by the sandbox user. The directory must exist.
func (s *Sandbox) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	if err := s.check(); err != nil {
		return &fs.PathError{Op: "write", Path: name, Err: err}
	}
	p := s.abs(name)
	dir, base := path.Split(p)
	if base == "" || base == "." || base == ".." {
		return &fs.PathError{Op: "write", Path: name, Err: syscall.EISDIR}
	}
	var buf bytes.Buffer
	buf.Grow(len(data) + 2048)
	if err := tarsafe.SingleFile(&buf, base, data, perm, s.uid, s.gid); err != nil {
		return &fs.PathError{Op: "write", Path: name, Err: err}
	}
	err := s.cli.CopyToContainer(ctx, s.id, dir, &buf, container.CopyToContainerOptions{})
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.write", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int("bytes", len(data)), errAttr(err))
	return s.pathErr("write", name, err)
}

// ReadFile reads the named file, following symbolic links.
func (s *Sandbox) ReadFile(ctx context.Context, name string) ([]byte, error) {
	data, err := s.readFile(ctx, s.abs(name), name)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.read", slog.String("sandbox", s.id),
		slog.String("path", s.abs(name)), slog.Int("bytes", len(data)), errAttr(err))
	return data, err
}

func (s *Sandbox) readFile(ctx context.Context, p, name string) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	for hops := 0; hops < 40; hops++ {
		rc, _, err := s.cli.CopyFromContainer(ctx, s.id, p)
		if err != nil {
			return nil, s.pathErr("read", name, err)
		}
		tr := tar.NewReader(rc)
		hdr, err := tr.Next()
		if err != nil {
			rc.Close()
			return nil, &fs.PathError{Op: "read", Path: name, Err: err}
		}
		switch hdr.Typeflag {
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			rc.Close()
			if err != nil {
				return nil, &fs.PathError{Op: "read", Path: name, Err: err}
			}
			return data, nil
		case tar.TypeSymlink:
			rc.Close()
			if path.IsAbs(hdr.Linkname) {
				p = path.Clean(hdr.Linkname)
			} else {
				p = path.Join(path.Dir(p), hdr.Linkname)
			}
		case tar.TypeDir:
			rc.Close()
			return nil, &fs.PathError{Op: "read", Path: name, Err: syscall.EISDIR}
		default:
			rc.Close()
			return nil, &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("not a regular file (tar type %q)", hdr.Typeflag)}
		}
	}
	return nil, &fs.PathError{Op: "read", Path: name, Err: syscall.ELOOP}
}

// Stat returns information about the named file, following symbolic links.
func (s *Sandbox) Stat(ctx context.Context, name string) (fs.FileInfo, error) {
	return s.stat(ctx, name, true)
}

func (s *Sandbox) stat(ctx context.Context, name string, follow bool) (fs.FileInfo, error) {
	if err := s.check(); err != nil {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	p := s.abs(name)
	st, err := s.cli.ContainerStatPath(ctx, s.id, p)
	if err != nil {
		return nil, s.pathErr("stat", name, err)
	}
	if follow && st.Mode&fs.ModeSymlink != 0 {
		target, err := s.cli.ContainerStatPath(ctx, s.id, st.LinkTarget)
		if err != nil {
			return nil, s.pathErr("stat", name, err)
		}
		target.Name = st.Name
		st = target
	}
	return fileInfo{st}, nil
}

// fileInfo adapts the engine's stat result to fs.FileInfo.
type fileInfo struct{ st container.PathStat }

func (fi fileInfo) Name() string       { return fi.st.Name }
func (fi fileInfo) Size() int64        { return fi.st.Size }
func (fi fileInfo) Mode() fs.FileMode  { return fi.st.Mode }
func (fi fileInfo) ModTime() time.Time { return fi.st.Mtime }
func (fi fileInfo) IsDir() bool        { return fi.st.Mode.IsDir() }
func (fi fileInfo) Sys() any           { return nil }

// listScript prints "TYPE NAME\0" for each entry of directory $1, with
// builtins only. Exit 2: missing; 3: not a directory; 4: not readable.
const listScript = `[ -e "$1" ] || exit 2
[ -d "$1" ] || exit 3
cd "$1" 2>/dev/null || exit 4
for f in * .*; do
case $f in .|..) continue ;; esac
if [ -L "$f" ]; then t=l
elif [ -d "$f" ]; then t=d
elif [ -f "$f" ]; then t=f
elif [ -p "$f" ]; then t=p
elif [ -S "$f" ]; then t=s
elif [ -b "$f" ]; then t=b
elif [ -c "$f" ]; then t=c
elif [ -e "$f" ]; then t=o
else continue
fi
printf '%s %s\0' "$t" "$f"
done`

// ReadDir reads the named directory and returns its entries sorted by name.
// Entries' Info is fetched from the engine when asked for (with the
// context given here), and describes a symbolic link itself.
func (s *Sandbox) ReadDir(ctx context.Context, name string) ([]fs.DirEntry, error) {
	p := s.abs(name)
	out, code, err := s.script(ctx, listScript, p)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
	}
	if err := scriptErr(code, out); err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: err}
	}
	var ents []fs.DirEntry
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) < 3 {
			continue
		}
		ents = append(ents, &dirEntry{s: s, ctx: ctx, dir: p, name: string(rec[2:]), typ: entryType(rec[0])})
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.readdir", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int("entries", len(ents)))
	return ents, nil
}

func entryType(c byte) fs.FileMode {
	switch c {
	case 'l':
		return fs.ModeSymlink
	case 'd':
		return fs.ModeDir
	case 'p':
		return fs.ModeNamedPipe
	case 's':
		return fs.ModeSocket
	case 'b':
		return fs.ModeDevice
	case 'c':
		return fs.ModeDevice | fs.ModeCharDevice
	case 'o':
		return fs.ModeIrregular
	}
	return 0
}

type dirEntry struct {
	s    *Sandbox
	ctx  context.Context
	dir  string
	name string
	typ  fs.FileMode
}

func (d *dirEntry) Name() string      { return d.name }
func (d *dirEntry) IsDir() bool       { return d.typ.IsDir() }
func (d *dirEntry) Type() fs.FileMode { return d.typ }
func (d *dirEntry) Info() (fs.FileInfo, error) {
	return d.s.stat(d.ctx, path.Join(d.dir, d.name), false)
}
func (d *dirEntry) String() string { return fs.FormatDirEntry(d) }

// scriptErr maps the exit codes of the file scripts to errors.
func scriptErr(code int, out []byte) error {
	switch code {
	case 0:
		return nil
	case 2:
		return fs.ErrNotExist
	case 3:
		return syscall.ENOTDIR
	case 4:
		return fs.ErrPermission
	}
	msg := strings.TrimSpace(string(out))
	if msg == "" {
		msg = "exit status " + strconv.Itoa(code)
	}
	return errors.New(msg)
}

// script runs a shell script as the sandbox user with args, returning its
// combined output (bounded) and exit code.
func (s *Sandbox) script(ctx context.Context, script string, args ...string) ([]byte, int, error) {
	out := newCapture(16 << 20)
	c := s.Command(ctx, "/bin/sh", append([]string{"-c", script, "sh"}, args...)...)
	c.Stdout, c.Stderr = out, out
	err := c.Run()
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.cause != nil {
			return nil, 0, ee.cause
		}
		return out.Bytes(), ee.Code, nil
	}
	return out.Bytes(), 0, err
}

// MkdirAll creates the named directory and any missing parents with
// permissions perm (before the sandbox's umask), as the sandbox user.
func (s *Sandbox) MkdirAll(ctx context.Context, name string, perm fs.FileMode) error {
	p := s.abs(name)
	out, code, err := s.script(ctx, `[ -d "$1" ] && exit 0; [ -e "$1" ] && exit 3; mkdir -p -m "$2" "$1"`,
		p, strconv.FormatUint(uint64(perm.Perm()), 8))
	if err == nil {
		err = scriptErr(code, out)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.mkdir", slog.String("sandbox", s.id),
		slog.String("path", p), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	return nil
}

// Remove removes the named file or directory tree, as the sandbox user. A
// missing name is an error satisfying errors.Is(err, fs.ErrNotExist).
func (s *Sandbox) Remove(ctx context.Context, name string) error {
	p := s.abs(name)
	out, code, err := s.script(ctx, `[ -e "$1" ] || [ -L "$1" ] || exit 2; rm -rf "$1"`, p)
	if err == nil {
		err = scriptErr(code, out)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.remove", slog.String("sandbox", s.id),
		slog.String("path", p), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	return nil
}

// CopyIn copies the tree of src (for example os.DirFS("./project")) into
// directory dst in the sandbox, creating dst if needed. Files are owned by
// the sandbox user and keep their permission bits; symbolic links are
// copied when src implements fs.ReadLinkFS.
func (s *Sandbox) CopyIn(ctx context.Context, dst string, src fs.FS) error {
	p := s.abs(dst)
	if err := s.MkdirAll(ctx, p, 0o755); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	cw := &countWriter{w: pw, n: &counter{}}
	go func() {
		pw.CloseWithError(tarsafe.FromFS(cw, src, ".", tarsafe.Header{Uid: s.uid, Gid: s.gid}))
	}()
	err := s.cli.CopyToContainer(ctx, s.id, p, pr, container.CopyToContainerOptions{})
	pr.CloseWithError(errors.New("sandbox: copy aborted"))
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.copyin", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Int64("tar_bytes", cw.n.n), errAttr(err))
	return s.pathErr("copyin", dst, err)
}

// CopyOut copies src (a file or a directory tree) from the sandbox into the
// existing host directory hostDir, as hostDir/base(src) — like docker cp.
// It never creates or changes anything outside hostDir: an entry that would
// land outside (a "../" name, an absolute name, a link pointing out) stops
// the copy with an error wrapping ErrUnsafePath. Symbolic links that stay
// inside are kept as links; devices and FIFOs are skipped; set-id bits are
// dropped and files are owned by the calling user. Files copied before an
// error stay.
func (s *Sandbox) CopyOut(ctx context.Context, src, hostDir string) error {
	if err := s.check(); err != nil {
		return &fs.PathError{Op: "copyout", Path: src, Err: err}
	}
	p := s.abs(src)
	rc, _, err := s.cli.CopyFromContainer(ctx, s.id, p)
	if err != nil {
		return s.pathErr("copyout", src, err)
	}
	defer rc.Close()
	cr := &countWriter{w: io.Discard, n: &counter{}}
	err = tarsafe.Extract(io.TeeReader(rc, cr), hostDir, tarsafe.ExtractOptions{})
	if errors.Is(err, tarsafe.ErrUnsafePath) {
		err = fmt.Errorf("%w: %w", ErrUnsafePath, err)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.copyout", slog.String("sandbox", s.id),
		slog.String("path", p), slog.String("host_dir", hostDir), slog.Int64("tar_bytes", cr.n.n), errAttr(err))
	if err != nil {
		return &fs.PathError{Op: "copyout", Path: src, Err: err}
	}
	return nil
}

// FS returns a read-only view of the sandbox's filesystem rooted at "/",
// for use with io/fs functions (fs.WalkDir, fs.Glob, fs.Sub, template
// parsing...). Every call reaches the engine with ctx. Files are read whole
// when opened. It implements fs.StatFS, fs.ReadFileFS and fs.ReadDirFS.
func (s *Sandbox) FS(ctx context.Context) fs.FS { return sandboxFS{s: s, ctx: ctx} }

type sandboxFS struct {
	s   *Sandbox
	ctx context.Context
}

func (f sandboxFS) path(op, name string) (string, error) {
	if !fs.ValidPath(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return "/" + name, nil
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
	fi, err := f.s.Stat(f.ctx, p)
	if err != nil {
		return nil, fixErr(err, "open", name)
	}
	if fi.IsDir() {
		return &openDir{fs: f, path: p, name: name, info: fi}, nil
	}
	data, err := f.s.readFile(f.ctx, p, p)
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
	data, err := f.s.readFile(f.ctx, p, p)
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
