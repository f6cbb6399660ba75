//go:build linux

package main

import (
	"archive/tar"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/tarsafe"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// fileOp is a file operation in progress on one channel.
type fileOp struct {
	ch    uint32
	in    *inbox  // input (Write, Untar)
	out   *window // output credit granted by the library
	input bool    // the operation takes input: it ends with CloseStdin or Kill

	mu       sync.Mutex
	finished bool // the operation sent Done
	inEnded  bool // CloseStdin or Kill came
	aborted  chan struct{}
	abortOne sync.Once
}

// errAborted ends an operation the library gave up on.
var errAborted = coded{wire.CodeAborted, "aborted by the library"}

// coded is a file operation error that is not a system error.
type coded struct{ code, text string }

func (c coded) Error() string { return c.text }

// startFile registers a file operation (so that its input, which follows
// the request at once, finds it) and runs it.
func (a *agent) startFile(ch uint32, req wire.FileRequest) {
	op := &fileOp{
		ch: ch, in: newInbox(), out: newWindow(wire.Window),
		input:   req.Op == wire.Write || req.Op == wire.Untar,
		aborted: make(chan struct{}),
	}
	a.mu.Lock()
	if _, dup := a.files[ch]; dup || a.byChan[ch] != nil {
		a.mu.Unlock()
		a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return
	}
	a.files[ch] = op
	a.mu.Unlock()
	go func() {
		res := a.runFile(op, req)
		a.sendJSON(wire.Done, ch, res)
		a.finishFile(op)
	}()
}

func (a *agent) lookupFile(ch uint32) *fileOp {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.files[ch]
}

// fileInput takes input for a file operation, or drops and acknowledges it
// once the operation has ended (the library may still be sending).
func (a *agent) fileInput(op *fileOp, f wire.Frame) {
	op.mu.Lock()
	if f.Kind == wire.CloseStdin {
		op.inEnded = true
		op.in.close()
		done := op.finished
		op.mu.Unlock()
		if done {
			a.dropFile(op)
		}
		return
	}
	if op.finished {
		op.mu.Unlock()
		a.ack(op.ch, len(f.Data))
		return
	}
	op.in.feed(f.Data)
	op.mu.Unlock()
}

// abortFile ends a file operation early: its input and output stop.
func (a *agent) abortFile(op *fileOp) {
	op.abortOne.Do(func() { close(op.aborted) })
	op.out.close()
	op.mu.Lock()
	op.inEnded = true
	op.in.close()
	done := op.finished
	op.mu.Unlock()
	if done {
		a.dropFile(op)
	}
}

// finishFile marks op ended: input still queued is acknowledged and
// dropped, and op is forgotten once its input has ended too.
func (a *agent) finishFile(op *fileOp) {
	op.mu.Lock()
	op.finished = true
	n := op.in.drop()
	done := op.inEnded || !op.input
	op.mu.Unlock()
	if n > 0 {
		a.ack(op.ch, n)
	}
	if done {
		a.dropFile(op)
	}
}

func (a *agent) dropFile(op *fileOp) {
	a.mu.Lock()
	if a.files[op.ch] == op {
		delete(a.files, op.ch)
	}
	a.mu.Unlock()
}

func (a *agent) ack(ch uint32, n int) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(n))
	a.send(wire.Ack, ch, b[:])
}

// opInput reads a file operation's input, acknowledging it as it is taken.
type opInput struct {
	a   *agent
	op  *fileOp
	buf []byte
}

func (r *opInput) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		b, ok := r.op.in.next()
		if !ok {
			select {
			case <-r.op.aborted:
				return 0, errAborted
			default:
				return 0, io.EOF
			}
		}
		r.a.ack(r.op.ch, len(b))
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// opOutput sends a file operation's output, no faster than the library's
// credit allows.
type opOutput struct {
	a  *agent
	op *fileOp
	n  int64
}

func (w *opOutput) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n := w.op.out.take(min(len(p)-done, wire.MaxData))
		if n == 0 {
			return done, errAborted
		}
		w.a.send(wire.Stdout, w.op.ch, p[done:done+n])
		done += n
		w.n += int64(n)
	}
	return done, nil
}

// runFile carries out one file operation.
func (a *agent) runFile(op *fileOp, req wire.FileRequest) wire.FileResult {
	p := string(req.Path)
	if !path.IsAbs(p) || path.Clean(p) != p {
		return wire.FileResult{Err: &wire.FileError{Errno: uint32(syscall.EINVAL), Text: "path is not absolute and clean"}}
	}
	id := fsID{req.Uid, req.Gid}
	var res wire.FileResult
	var err error
	out := &opOutput{a: a, op: op}
	switch req.Op {
	case wire.Read:
		err = a.readFile(op.ch, id, p, req.Limit, out)
	case wire.Write:
		res.Bytes, err = a.writeFile(id, p, req.Perm, &opInput{a: a, op: op})
	case wire.Stat, wire.Lstat:
		var fi wire.FileInfo
		fi, err = a.stat(id, p, req.Op == wire.Stat)
		if err == nil {
			res.Info = &fi
		}
	case wire.ReadDir:
		err = a.readDir(id, p, req.Limit, out)
	case wire.MkdirAll:
		err = a.fs.as(id, func() error { return os.MkdirAll(p, fs.FileMode(req.Perm&0o777)) })
	case wire.RemoveAll:
		err = a.fs.as(id, func() error {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			return os.RemoveAll(p)
		})
	case wire.Remove:
		err = a.fs.as(id, func() error { return os.Remove(p) })
	case wire.Untar:
		in := &opInput{a: a, op: op}
		err = a.fs.as(id, func() error {
			return tarsafe.Extract(in, p, tarsafe.ExtractOptions{Faithful: true})
		})
	case wire.Tar:
		err = a.fs.as(id, func() error {
			sk, err := writeTar(out, p, req.Limit)
			res.Skipped, res.Skips = skippedOf(sk)
			return err
		})
	case wire.Capture:
		var sk *skipped
		sk, err = a.capture(id, p, req.Limit, out)
		res.Skipped, res.Skips = skippedOf(sk)
	default:
		err = fmt.Errorf("agent: unknown file operation %q", req.Op)
	}
	if req.Op == wire.Read || req.Op == wire.ReadDir || req.Op == wire.Tar || req.Op == wire.Capture {
		a.send(wire.Stdout, op.ch, nil) // end of output
		res.Bytes = out.n
	}
	res.Err = fileErr(err)
	return res
}

// skippedOf is what sk lists, for a FileResult.
func skippedOf(sk *skipped) ([][]byte, int64) {
	if sk == nil {
		return nil, 0
	}
	return sk.names, sk.n
}

// fileErr describes err for the library.
func fileErr(err error) *wire.FileError {
	if err == nil {
		return nil
	}
	fe := &wire.FileError{Text: err.Error()}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		fe.Errno = uint32(errno)
	}
	var c coded
	if errors.As(err, &c) {
		fe.Code = c.code
	}
	if errors.Is(err, tarsafe.ErrUnsafePath) {
		fe.Code = wire.CodeBadName
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		fe.Path = []byte(pe.Path)
	}
	return fe
}

func tooLarge(limit int64) error {
	return coded{wire.CodeTooLarge, fmt.Sprintf("more than %d bytes", limit)}
}

// openRegular opens the regular file p for reading, following symbolic
// links, as id. Anything else is refused before a byte is read: a
// directory (EISDIR), a device, FIFO or socket (a link to /dev/zero must
// not stream for ever; opening does not block on a FIFO).
func (a *agent) openRegular(id fsID, p string, flags int) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	var fd int
	err := a.fs.as(id, func() error {
		var err error
		fd, err = open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC|flags)
		if err != nil {
			return &fs.PathError{Op: "open", Path: p, Err: err}
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, st, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		unix.Close(fd)
		return nil, st, syscall.EISDIR
	default:
		unix.Close(fd)
		return nil, st, coded{wire.CodeNotRegular, typeName(st.Mode)}
	}
	unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), p), st, nil
}

// open opens p for a file operation, refusing what the sandbox user's own
// commands could not reach but the agent's threads could:
//
//   - a "magic" link of /proc on the way (such as /proc/self/fd/0, which
//     would be the agent's own stdin): ELOOP. Without openat2 (before
//     Linux 5.6, gVisor, a seccomp profile that refuses it) p is opened
//     plainly; the sandbox user's identity still keeps the agent's /proc
//     entries behind the next check.
//   - the agent's own entries of /proc (/proc/self, /proc/thread-self,
//     /proc/1, its threads' /proc/TID, whatever link led there): EACCES,
//     which is what a command gets for them. The kernel lets any thread
//     read its own process's entries whatever its identity, so the
//     worker threads would see the agent's memory map, file descriptors
//     and status.
func open(p string, flags int) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_NO_MAGICLINKS})
	if err == unix.ENOSYS || err == unix.EPERM { // no openat2, or a seccomp profile without it
		fd, err = unix.Open(p, flags, 0)
	}
	if err != nil {
		return -1, err
	}
	if ownProc(fd) {
		unix.Close(fd)
		return -1, unix.EACCES
	}
	return fd, nil
}

// ownProc reports whether fd is an entry of /proc that belongs to the
// agent's own process (its directory, or anything under it or under one
// of its threads' directories).
func ownProc(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil || sfs.Type != unix.PROC_SUPER_MAGIC {
		return false
	}
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return true // a /proc file it cannot name: refused
	}
	rest, ok := strings.CutPrefix(target, "/proc/")
	if !ok {
		return true
	}
	first, _, _ := strings.Cut(rest, "/")
	pid, err := strconv.Atoi(first)
	if err != nil {
		return first == "self" || first == "thread-self"
	}
	if pid == os.Getpid() {
		return true
	}
	var st unix.Stat_t
	return unix.Stat("/proc/self/task/"+first, &st) == nil
}

// typeName names the kind of a file that is not regular.
func typeName(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFCHR:
		return "character device"
	case unix.S_IFBLK:
		return "block device"
	case unix.S_IFIFO:
		return "named pipe (FIFO)"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("file of type %#o", m&unix.S_IFMT)
}

// readFile sends the regular file p, refusing more than limit bytes.
func (a *agent) readFile(ch uint32, id fsID, p string, limit int64, out io.Writer) error {
	f, st, err := a.openRegular(id, p, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if limit > 0 && st.Size > limit {
		return tooLarge(limit)
	}
	a.sendJSON(wire.Started, ch, wire.Start{Size: st.Size})
	var r io.Reader = f
	if limit > 0 {
		// Files such as those of /proc say size 0 and have more.
		r = io.LimitReader(f, limit)
	}
	if _, err := io.CopyBuffer(out, r, make([]byte, wire.MaxData)); err != nil {
		return err
	}
	if limit > 0 {
		var one [1]byte
		if n, _ := f.Read(one[:]); n > 0 {
			return tooLarge(limit)
		}
	}
	return nil
}

// writeFile replaces the file p with the input: written to a new file in
// the same directory, given permissions perm, then renamed over p. A
// symbolic link or hard link at p is replaced, never written through;
// readers see the old contents or the new, never a part.
func (a *agent) writeFile(id fsID, p string, perm uint32, in io.Reader) (int64, error) {
	dir, base := path.Split(p)
	if base == "" {
		return 0, syscall.EISDIR
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := ".sandbox-write-" + hex.EncodeToString(rnd[:])
	var dirfd, fd int
	err := a.fs.as(id, func() error {
		var err error
		dirfd, err = open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			unix.Close(dirfd)
			return syscall.EISDIR
		}
		fd, err = unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			if err = unix.Fchmod(fd, perm&0o777); err != nil {
				unix.Close(fd)
				unix.Unlinkat(dirfd, tmp, 0)
			}
		}
		if err != nil {
			unix.Close(dirfd)
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), tmp)
	n, err := io.Copy(f, in)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	err2 := a.fs.as(id, func() error {
		defer unix.Close(dirfd)
		if err != nil {
			unix.Unlinkat(dirfd, tmp, 0)
			return nil
		}
		if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
			unix.Unlinkat(dirfd, tmp, 0)
			return err
		}
		return nil
	})
	if err == nil {
		err = err2
	}
	return n, err
}

// stat describes p, following a final symbolic link if follow.
func (a *agent) stat(id fsID, p string, follow bool) (wire.FileInfo, error) {
	var st unix.Stat_t
	err := a.fs.as(id, func() error {
		flags := unix.O_PATH | unix.O_CLOEXEC
		if !follow {
			flags |= unix.O_NOFOLLOW
		}
		fd, err := open(p, flags)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Fstat(fd, &st)
	})
	return info(&st), err
}

func info(st *unix.Stat_t) wire.FileInfo {
	return wire.FileInfo{Mode: uint32(goMode(st.Mode)), Size: st.Size, Mtime: st.Mtim.Nano()}
}

// readDir sends the entries of directory p as wire directory records,
// refusing listings of more than limit bytes.
func (a *agent) readDir(id fsID, p string, limit int64, out io.Writer) error {
	var fd int
	err := a.fs.as(id, func() error {
		var err error
		fd, err = open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
		return err
	})
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	var total int64
	var buf []byte
	for {
		ents, err := d.ReadDir(256)
		if len(ents) > 0 {
			buf = buf[:0]
			a.fs.as(id, func() error {
				for _, e := range ents {
					var st unix.Stat_t
					fi := wire.FileInfo{Mode: uint32(e.Type())}
					if unix.Fstatat(fd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
						fi = info(&st)
					}
					buf = wire.AppendDirRecord(buf, []byte(e.Name()), fi)
				}
				return nil
			})
			total += int64(len(buf))
			if limit > 0 && total > limit {
				return tooLarge(limit)
			}
			if _, err := out.Write(buf); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// writeTar writes a tar archive of p (named base(p), and its tree if it is
// a directory) to out: directories, regular files, symbolic links (not
// followed) and hard links; other kinds of file are left out. At most
// limit bytes of file contents are sent. It runs on a worker: every access
// is the sandbox user's. It returns the entries it had to leave out (see
// tarWalk.skip).
func writeTar(out io.Writer, p string, limit int64) (*skipped, error) {
	t := newTarWalk(out, limit)
	dir, base := path.Split(p)
	if base == "" { // "/"
		dir, base = "/", "/"
	}
	dirfd, err := open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dirfd)
	if err := t.add(dirfd, base, path.Base(p), 0); err != nil {
		return &t.skipped, err
	}
	return &t.skipped, t.tw.Close()
}

// writeTarContents is writeTar of the contents of directory p, named
// relative to it (p itself is left out), for a snapshot: the setuid,
// setgid and sticky bits are kept, and files and directories of owner
// that its own permissions close to it (chmod 000) are opened for the
// copy and given their modes back, so the sandbox's processes must be
// stopped meanwhile (see capture). Beyond limit bytes of file contents,
// or wire.CaptureHeaderBound(limit) bytes of the rest, it fails saying
// which.
func writeTarContents(out io.Writer, p string, limit int64, owner uint32) (*skipped, error) {
	t := newTarWalk(out, limit)
	t.owner, t.capture, t.headLimit = owner, true, wire.CaptureHeaderBound(limit)
	if err := t.add(unix.AT_FDCWD, p, "", 0); err != nil {
		return &t.skipped, err
	}
	return &t.skipped, t.tw.Close()
}

// The walk's bounds: what it holds does not grow with the number of names
// in a directory, only (by a few KiB and one descriptor a level) with the
// depth of the tree.
const (
	// direntBuf is the getdents buffer of each directory being walked:
	// the names of one buffer are taken at a time.
	direntBuf = 4 << 10
	// linkNames bounds the bytes of names the walk remembers for files
	// with several links; beyond it, further linked files are stored
	// whole (their contents counted again) rather than as links.
	linkNames = 16 << 20
)

type tarWalk struct {
	tw        *tar.Writer
	cw        *countWriter
	limit     int64 // most bytes of file contents (0: no bound)
	headLimit int64 // most bytes of the rest (0: no bound)
	bytes     int64 // bytes of file contents so far
	entries   int64
	links     map[[2]uint64]*linked // device and inode of files with several links
	linkBytes int64                 // bytes of names in links
	owner     uint32                // with capture: whose closed files may be opened
	capture   bool                  // see writeTarContents
	skipped   skipped
}

// linked is a file with several links met by the walk: the archive name
// of its first link, and how many of its links are still to come (it is
// forgotten when none are).
type linked struct {
	name string
	left uint64
}

// skipped lists what a walk left out.
type skipped struct {
	names [][]byte
	n     int64
}

func (s *skipped) add(name string) {
	if len(s.names) < wire.MaxSkipped {
		s.names = append(s.names, []byte(name))
	}
	s.n++
}

func newTarWalk(out io.Writer, limit int64) *tarWalk {
	cw := &countWriter{w: out}
	return &tarWalk{tw: tar.NewWriter(cw), cw: cw, limit: limit, links: map[[2]uint64]*linked{}}
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// header writes hdr, refusing to go beyond headLimit bytes of everything
// but file contents. The bound is checked before, with the most the header
// can take, so that what the library receives stays within its own bound.
func (t *tarWalk) header(hdr *tar.Header) error {
	t.entries++
	if t.headLimit > 0 {
		// A PAX header (512 bytes and its records: the name, the link
		// target, times, ids), the header itself, and the padding of the
		// entry before it.
		most := int64(4<<10 + 2*(len(hdr.Name)+len(hdr.Linkname)))
		if t.cw.n-t.bytes+most > t.headLimit {
			return coded{wire.CodeTooLarge, fmt.Sprintf(
				"the archive's entries (names, link targets, times) take more than %d bytes besides file contents, at entry %d (%d bytes of file contents so far): too many entries or too long names",
				t.headLimit, t.entries, t.bytes)}
		}
	}
	return t.tw.WriteHeader(hdr)
}

// opened lets the owner in to a file or directory of theirs (base, in
// dirfd) that they closed to themselves, until the returned function
// gives it its mode back.
func (t *tarWalk) opened(dirfd int, base string, st *unix.Stat_t, need uint32) func() {
	if !t.capture || st.Uid != t.owner || st.Mode&need == need {
		return func() {}
	}
	mode := st.Mode & 0o7777
	if unix.Fchmodat(dirfd, base, mode|need, 0) != nil {
		return func() {}
	}
	return func() { unix.Fchmodat(dirfd, base, mode, 0) }
}

// openAt opens base in directory dirfd (base is a single name, or with
// dirfd AT_FDCWD the walk's top path), refusing what open refuses.
func openAt(dirfd int, base string, flags int) (int, error) {
	if dirfd == unix.AT_FDCWD {
		return open(base, flags)
	}
	fd, err := unix.Openat(dirfd, base, flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, err
	}
	if ownProc(fd) {
		unix.Close(fd)
		return -1, unix.EACCES
	}
	return fd, nil
}

// add archives the file base of directory dirfd (and its tree if it is a
// directory) as name. Every access is relative to a directory descriptor,
// so no path the kernel is given is longer than one name: a tree deeper
// than PATH_MAX is walked whole.
func (t *tarWalk) add(dirfd int, base, name string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lstat", Path: t.pathOf(name, base), Err: err}
	}
	mode := goMode(st.Mode)
	hdr := &tar.Header{
		Name: name, Mode: int64(mode.Perm()), ModTime: unixTime(st.Mtim),
		Uid: int(st.Uid), Gid: int(st.Gid), Format: tar.FormatPAX,
	}
	if t.capture {
		hdr.Mode = int64(st.Mode & 0o7777)
	}
	switch {
	case mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if name != "" { // "": the top of writeTarContents
			if err := t.header(hdr); err != nil {
				return err
			}
		}
		defer t.opened(dirfd, base, &st, 0o500)()
		fd, err := openAt(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
		if (err == unix.EMFILE || err == unix.ENFILE) && name != "" {
			// Too deep for the descriptors the sandbox's limit leaves:
			// the directory is kept, empty, and the walk says so.
			t.skipped.add(name + "/")
			return nil
		}
		if err != nil {
			return &fs.PathError{Op: "open", Path: t.pathOf(name, base), Err: err}
		}
		defer unix.Close(fd)
		return t.dir(fd, name, depth)
	case mode&fs.ModeSymlink != 0:
		target, err := readlinkAt(dirfd, base, st.Size)
		if err != nil {
			return &fs.PathError{Op: "readlink", Path: t.pathOf(name, base), Err: err}
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		return t.header(hdr)
	case !mode.IsRegular():
		return nil // devices, FIFOs, sockets
	}
	key := [2]uint64{uint64(st.Dev), st.Ino}
	if st.Nlink > 1 {
		if l, ok := t.links[key]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, l.name
			if l.left--; l.left == 0 {
				delete(t.links, key)
				t.linkBytes -= int64(len(l.name))
			}
			return t.header(hdr)
		}
	}
	reclose := t.opened(dirfd, base, &st, 0o400)
	fd, err := openAt(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC)
	reclose()
	if err != nil {
		return &fs.PathError{Op: "open", Path: t.pathOf(name, base), Err: err}
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil // replaced meanwhile by something else
	}
	unix.SetNonblock(fd, false)
	if t.limit > 0 && st.Size > t.limit-t.bytes {
		return &fs.PathError{Op: "copy", Path: t.pathOf(name, base), Err: coded{wire.CodeTooLarge,
			fmt.Sprintf("file contents add up to more than %d bytes: %d so far, and this file has %d (sparse files count in full)", t.limit, t.bytes, st.Size)}}
	}
	if st.Nlink > 1 && t.linkBytes+int64(len(name)) <= linkNames {
		t.links[key] = &linked{name: name, left: uint64(st.Nlink) - 1}
		t.linkBytes += int64(len(name))
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := t.header(hdr); err != nil {
		return err
	}
	t.bytes += st.Size
	// Exactly the size announced: a file that grows is cut, one that
	// shrinks is padded with zeros.
	n, err := io.CopyN(t.tw, f, st.Size)
	if err == io.EOF {
		_, err = io.CopyN(t.tw, zeros{}, st.Size-n)
	}
	return err
}

// dir archives the entries of the open directory fd (named name), a
// buffer of names at a time, in the order the file system lists them
// (the same files in the same file system list alike, so a snapshot's
// digest is stable; nothing is sorted, which would hold every name).
func (t *tarWalk) dir(fd int, name string, depth int) error {
	buf := make([]byte, direntBuf)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &fs.PathError{Op: "readdir", Path: t.pathOf(name, "."), Err: err}
		}
		if n <= 0 {
			return nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, n := range names {
			child := n
			if name != "" {
				child = name + "/" + n
			}
			if err := t.add(fd, n, child, depth+1); err != nil {
				return err
			}
		}
	}
}

// pathOf names an entry in errors: its archive name, or base at the top.
func (t *tarWalk) pathOf(name, base string) string {
	if name == "" {
		return base
	}
	return name
}

// readlinkAt reads the target of symbolic link base in dirfd, of size
// bytes as fstatat said (more if it grew).
func readlinkAt(dirfd int, base string, size int64) (string, error) {
	n := max(int(min(size, 1<<20)), 64) + 1
	for {
		b := make([]byte, n)
		m, err := unix.Readlinkat(dirfd, base, b)
		if err != nil {
			return "", err
		}
		if m < n || n >= 1<<20 {
			return string(b[:m]), nil
		}
		n *= 4
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func unixTime(ts unix.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }

// goMode converts a Unix file mode to an io/fs one (as package os does).
func goMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFREG:
	default:
		mode |= fs.ModeIrregular
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
