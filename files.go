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
	"unicode/utf8"

	"github.com/docker/docker/api/types/container"

	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/tarsafe"
)

// File operations. A relative name is relative to the sandbox's working
// directory; an absolute name may point anywhere in the sandbox. Errors are
// *fs.PathError values, and a missing file satisfies
// errors.Is(err, fs.ErrNotExist). WriteFile, ReadFile, Stat and the Copy
// methods go through the engine's archive API (which resolves symbolic
// links inside the container, never on the host), except under /tmp, /dev,
// /proc and /sys and for names that are not UTF-8 (see viaExec); ReadDir,
// MkdirAll, Remove and those exceptions run a small shell command as the
// sandbox user, so they are bound by that user's permissions.

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
	case strings.Contains(msg, "No such container"), engine.IsUnreachable(err):
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
	case strings.Contains(msg, "too many links"):
		err = syscall.ELOOP
	case engine.IsConflict(err): // a paused container, for one
		err = s.engineErr(op, err)
	case engine.IsNotFound(err):
		// A stat (HEAD request) 404 comes without a message.
		if s.goneNow() {
			err = s.engineErr(op, err)
		} else {
			err = fs.ErrNotExist
		}
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}

// goneAfter returns err or, if a write through the archive API succeeded
// while the sandbox ended, the error saying it is gone: the engine also
// writes into a container that has stopped (and is about to be removed),
// and the data is lost with it.
func (s *Sandbox) goneAfter(err error) error {
	if err == nil {
		return s.check()
	}
	return err
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
	if viaExec(p) {
		err := s.writeExec(ctx, p, data, perm)
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.write", slog.String("sandbox", s.id),
			slog.String("path", p), slog.Int("bytes", len(data)), errAttr(err))
		return s.pathErr("write", name, err)
	}
	var buf bytes.Buffer
	buf.Grow(len(data) + 2048)
	if err := tarsafe.SingleFile(&buf, base, data, perm, s.uid, s.gid); err != nil {
		return &fs.PathError{Op: "write", Path: name, Err: err}
	}
	err := s.goneAfter(s.copyTo(ctx, s.id, dir, &buf))
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
		if viaExec(p) {
			data, err := s.readExec(ctx, p)
			return data, s.pathErr("read", name, err)
		}
		rc, err := s.copyFrom(ctx, s.id, p)
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
	if viaExec(p) {
		fi, err := s.statExec(ctx, p, follow)
		if err != nil {
			return nil, s.pathErr("stat", name, err)
		}
		return fi, nil
	}
	st, err := s.cli.ContainerStatPath(ctx, s.id, p)
	if err != nil && !engine.IsNotFound(err) && ctx.Err() == nil && s.check() == nil {
		// The engine fails (500, no message) on a symbolic link loop,
		// which it tries to resolve; stat(1) answers.
		fi, err := s.statExec(ctx, p, follow)
		if err != nil {
			return nil, s.pathErr("stat", name, err)
		}
		return fi, nil
	}
	if err != nil {
		return nil, s.pathErr("stat", name, err)
	}
	if follow && st.Mode&fs.ModeSymlink != 0 && viaExec(st.LinkTarget) {
		fi, err := s.statExec(ctx, st.LinkTarget, true)
		if err != nil {
			return nil, s.pathErr("stat", name, err)
		}
		fi.st.Name = st.Name
		return fi, nil
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
	script, args = shArgs(script, args)
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

// viaExec reports whether the absolute path p lies on a file system that
// exists only inside the container's mount namespace (the /tmp tmpfs, and
// /dev, /proc, /sys), which the engine's archive API cannot see (there it
// reads and writes the read-only image layer underneath instead), or is not
// valid UTF-8, which the engine's API mangles. Such files are read, written
// and stat'ed by a command run as the sandbox user.
func viaExec(p string) bool {
	if !utf8.ValidString(p) {
		return true
	}
	for _, m := range [...]string{"/tmp", "/dev", "/proc", "/sys"} {
		if p == m || strings.HasPrefix(p, m+"/") {
			return true
		}
	}
	return false
}

var errNoArchive = fmt.Errorf("%w: the engine cannot copy trees to or from /tmp, /dev, /proc, /sys or a path that is not UTF-8; use WriteFile and ReadFile there", errors.ErrUnsupported)

// shArgs returns script and args ready to pass through the engine's JSON
// API, which replaces bytes that are not UTF-8: if an arg is not valid
// UTF-8, every arg's backslashes and non-ASCII bytes are escaped for
// printf's %b, and the script starts by decoding them.
func shArgs(script string, args []string) (string, []string) {
	if !slices.ContainsFunc(args, func(a string) bool { return !utf8.ValidString(a) }) {
		return script, args
	}
	enc := make([]string, len(args))
	for i, a := range args {
		var b strings.Builder
		for _, c := range []byte(a) {
			if c == '\\' || c >= 0x80 {
				fmt.Fprintf(&b, "\\0%03o", c)
			} else {
				b.WriteByte(c)
			}
		}
		enc[i] = b.String()
	}
	const decode = `n=$#; while [ "$n" -gt 0 ]; do a=$(printf '%bx' "$1"); shift; set -- "$@" "${a%x}"; n=$((n-1)); done
`
	return decode + script, enc
}

// runIO runs script as the sandbox user with args, stdin and stdout, and
// returns the error its exit code or standard error stands for.
func (s *Sandbox) runIO(ctx context.Context, script string, stdin io.Reader, stdout io.Writer, args ...string) error {
	stderr := newCapture(64 << 10)
	script, args = shArgs(script, args)
	c := s.Command(ctx, "/bin/sh", append([]string{"-c", script, "sh"}, args...)...)
	c.Stdin, c.Stdout, c.Stderr = stdin, stdout, stderr
	err := c.Run()
	var ee *ExitError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &ee):
		return err
	case ee.cause != nil:
		return ee.cause
	case ee.Code == 5:
		return syscall.EISDIR
	}
	msg := stderr.String()
	switch {
	case strings.Contains(msg, "No such file"):
		return fs.ErrNotExist
	case strings.Contains(msg, "Not a directory"):
		return syscall.ENOTDIR
	case strings.Contains(msg, "Too many levels of symbolic links"):
		return syscall.ELOOP
	case strings.Contains(msg, "No space left"):
		return syscall.ENOSPC
	case strings.Contains(msg, "Permission denied"):
		return fs.ErrPermission
	case strings.Contains(msg, "Read-only file system"):
		return syscall.EROFS
	}
	return scriptErr(ee.Code, []byte(msg))
}

// writeExec replaces the file p (never writing through a symbolic link)
// with data and permissions perm.
func (s *Sandbox) writeExec(ctx context.Context, p string, data []byte, perm fs.FileMode) error {
	return s.runIO(ctx, `d=${1%/*}; [ -e "${d:-/}" ] || exit 2; [ -d "${d:-/}" ] || exit 3
[ -d "$1" ] && [ ! -L "$1" ] && exit 5
{ [ ! -e "$1" ] && [ ! -L "$1" ]; } || rm -f "$1" || exit 1
umask 077; cat > "$1" && chmod "$2" "$1"`, bytes.NewReader(data), nil,
		p, strconv.FormatUint(uint64(perm.Perm()), 8))
}

// readExec reads the file p, following symbolic links.
func (s *Sandbox) readExec(ctx context.Context, p string) ([]byte, error) {
	var out bytes.Buffer
	err := s.runIO(ctx, `[ -e "$1" ] || exit 2; [ -d "$1" ] && exit 5; exec cat "$1"`, nil, &out, p)
	if err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// statExec stats p with stat(1), following a final symbolic link if follow.
func (s *Sandbox) statExec(ctx context.Context, p string, follow bool) (fileInfo, error) {
	var out bytes.Buffer
	script := `exec stat -c '%f %s %Y' "$1"`
	if follow {
		script = `exec stat -L -c '%f %s %Y' "$1"`
	}
	if err := s.runIO(ctx, script, nil, &out, p); err != nil {
		return fileInfo{}, err
	}
	var raw uint32
	var size, mtime int64
	if _, err := fmt.Sscanf(out.String(), "%x %d %d", &raw, &size, &mtime); err != nil {
		return fileInfo{}, fmt.Errorf("unexpected stat output %q: %w", out.String(), err)
	}
	mode := fs.FileMode(raw & 0o777)
	switch raw & 0o170000 {
	case 0o060000:
		mode |= fs.ModeDevice
	case 0o020000:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case 0o040000:
		mode |= fs.ModeDir
	case 0o010000:
		mode |= fs.ModeNamedPipe
	case 0o120000:
		mode |= fs.ModeSymlink
	case 0o140000:
		mode |= fs.ModeSocket
	case 0o100000:
	default:
		mode |= fs.ModeIrregular
	}
	if raw&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if raw&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if raw&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return fileInfo{container.PathStat{Name: path.Base(p), Size: size, Mode: mode, Mtime: time.Unix(mtime, 0)}}, nil
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
	if viaExec(p) {
		return &fs.PathError{Op: "copyin", Path: dst, Err: errNoArchive}
	}
	if err := s.MkdirAll(ctx, p, 0o755); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	cw := &countWriter{w: pw, n: &counter{}}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		pw.CloseWithError(tarsafe.FromFS(cw, src, ".", tarsafe.Header{Uid: s.uid, Gid: s.gid}))
	}()
	err := s.goneAfter(s.copyTo(ctx, s.id, p, pr))
	pr.CloseWithError(errors.New("sandbox: copy aborted"))
	// When the upload ends early (cancelled, engine gone), the archive
	// writer is still running: wait until its next write fails, so that
	// nothing reads src after CopyIn returns and its count is final.
	<-produced
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
	if viaExec(p) {
		return &fs.PathError{Op: "copyout", Path: src, Err: errNoArchive}
	}
	rc, err := s.copyFrom(ctx, s.id, p)
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
