//go:build linux

package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The file changes a command makes are seen the way its execs are: the
// monitor's filter also stops the system calls that create, change,
// remove or rename a file by name (open for writing, creat, mkdir, mknod,
// link, symlink, unlink, rmdir, rename, truncate, in every variant), and
// the monitor reads the names they ask for before the kernel runs them.
// An open that asks for no write (no O_WRONLY, O_RDWR, O_CREAT or
// O_TRUNC) passes the filter untouched: reading costs nothing.
//
// Each change is recorded as it begins, from what the file system holds at
// that moment: "create" for a name that does not exist yet, "modify" for
// an existing file opened for writing or truncated (opened for writing
// counts, whether or not a byte is then written), "remove", "rename".
// Size and mode are the file's as the change begins (a created file's mode
// is the one asked, less the process's umask). A call that must fail
// (an open without O_CREAT of a missing file, a mkdir of an existing name,
// a removal of a missing one) is not a change and is not recorded; a
// change the kernel refuses for its place (a read-only file system) or its
// permissions is recorded with Refused, learned by asking the kernel as
// the process's own user (faccessat2 with AT_EACCESS). Special files
// (devices, pipes, sockets) and the kernel's own trees (/proc, /sys, /dev
// but /dev/shm) are not recorded.
//
// What it cannot see: writes through a descriptor opened before the
// command started or passed to it, through memory mappings of such a
// descriptor, and changes a process makes in a mount namespace of its own
// (the names recorded are then those it asked for, resolved in the
// agent's view). A name that is not NUL-terminated within maxPathLen
// bytes is recorded cut.

// changeOp is what a file call does to the name it changes.
type changeOp uint8

const (
	fileOpen     changeOp = iota + 1 // open for writing: create or modify
	fileMake                         // mkdir, mknod, link, symlink: create (fails if the name exists)
	fileRemove                       // unlink, rmdir
	fileRename                       // rename: the new name, from the old
	fileTruncate                     // truncate: modify
)

// fileArgs says where a file call's arguments are, as indexes into the
// call's arguments (-1: absent).
type fileArgs struct {
	op          changeOp
	dir, name   int8   // the name changed, relative to dir (-1: the working directory)
	fdir, from  int8   // rename: the old name; link: the existing file; symlink: the target (a string, not resolved)
	flags, mode int8   // open: its flags and mode; mkdir, mknod: the mode
	how         bool   // openat2: flags and mode are in struct open_how at args[2]
	implied     uint32 // creat: the flags it implies
	typ         uint32 // the type a made name gets (S_IFDIR, S_IFLNK; 0: from mode, or from the linked file)
}

// The file calls, by the shape of their arguments.
var (
	fOpen      = &fileArgs{op: fileOpen, dir: -1, name: 0, fdir: -1, from: -1, flags: 1, mode: 2}
	fCreat     = &fileArgs{op: fileOpen, dir: -1, name: 0, fdir: -1, from: -1, flags: -1, mode: 1, implied: unix.O_CREAT | unix.O_WRONLY | unix.O_TRUNC}
	fOpenat    = &fileArgs{op: fileOpen, dir: 0, name: 1, fdir: -1, from: -1, flags: 2, mode: 3}
	fOpenat2   = &fileArgs{op: fileOpen, dir: 0, name: 1, fdir: -1, from: -1, flags: -1, mode: -1, how: true}
	fMkdir     = &fileArgs{op: fileMake, dir: -1, name: 0, fdir: -1, from: -1, flags: -1, mode: 1, typ: unix.S_IFDIR}
	fMkdirat   = &fileArgs{op: fileMake, dir: 0, name: 1, fdir: -1, from: -1, flags: -1, mode: 2, typ: unix.S_IFDIR}
	fMknod     = &fileArgs{op: fileMake, dir: -1, name: 0, fdir: -1, from: -1, flags: -1, mode: 1}
	fMknodat   = &fileArgs{op: fileMake, dir: 0, name: 1, fdir: -1, from: -1, flags: -1, mode: 2}
	fLink      = &fileArgs{op: fileMake, dir: -1, name: 1, fdir: -1, from: 0, flags: -1, mode: -1}
	fLinkat    = &fileArgs{op: fileMake, dir: 2, name: 3, fdir: 0, from: 1, flags: -1, mode: -1}
	fSymlink   = &fileArgs{op: fileMake, dir: -1, name: 1, fdir: -1, from: 0, flags: -1, mode: -1, typ: unix.S_IFLNK}
	fSymlinkat = &fileArgs{op: fileMake, dir: 1, name: 2, fdir: -1, from: 0, flags: -1, mode: -1, typ: unix.S_IFLNK}
	fUnlink    = &fileArgs{op: fileRemove, dir: -1, name: 0, fdir: -1, from: -1, flags: -1, mode: -1}
	fUnlinkat  = &fileArgs{op: fileRemove, dir: 0, name: 1, fdir: -1, from: -1, flags: -1, mode: -1}
	fRename    = &fileArgs{op: fileRename, dir: -1, name: 1, fdir: -1, from: 0, flags: -1, mode: -1}
	fRenameat  = &fileArgs{op: fileRename, dir: 2, name: 3, fdir: 0, from: 1, flags: -1, mode: -1}
	fTruncate  = &fileArgs{op: fileTruncate, dir: -1, name: 0, fdir: -1, from: -1, flags: -1, mode: -1}
)

// fileNr is a file call's number in one calling convention.
type fileNr struct {
	nr int32
	f  *fileArgs
}

// addFileCalls adds the file calls of one convention (arch, pointer size
// word, numbers with bits set) to monitorCalls.
func addFileCalls(arch uint32, word int, bits int32, calls []fileNr) {
	for _, c := range calls {
		monitorCalls = append(monitorCalls, monitorCall{arch, bits | c.nr, callFile, word, c.f})
	}
}

// writeFlags are the open flags that make an open a change: the filter
// stops an open only when one is set.
const writeFlags = unix.O_WRONLY | unix.O_RDWR | unix.O_CREAT | unix.O_TRUNC

// maxPathLen bounds a name read from a process (PATH_MAX).
const maxPathLen = 4096

// fileChange is what a file event says.
type fileChange struct {
	op      string // "create", "modify", "remove", "rename"
	path    string // absolute
	from    string
	size    int64
	mode    uint32 // Unix mode bits, type included
	refused bool
}

// fileEvent reads the change a stopped file call is about to make, as the
// process's user; ok is false when it changes nothing that is recorded.
func (m *monitor) fileEvent(pid int, id fsID, umask uint32, fa *fileArgs, args [6]uint64) (fc fileChange, ok bool) {
	m.as(id, func() error {
		mem, err := openMem(pid)
		if err != nil {
			return err // not dumpable: its names are its own
		}
		defer mem.Close()
		fc, ok = fileChangeOf(pid, mem, umask, fa, args)
		return nil
	})
	return fc, ok
}

// fileChangeOf works out the change (see fileEvent); mem is the process's
// memory.
func fileChangeOf(pid int, mem procMem, umask uint32, fa *fileArgs, args [6]uint64) (fileChange, bool) {
	name := procPath(pid, mem, args, fa.dir, fa.name)
	if name == "" || !recordedPlace(name) {
		return fileChange{}, false
	}
	fc := fileChange{path: name}
	flags, mode := fa.implied, uint32(0)
	if fa.flags >= 0 {
		flags = uint32(args[fa.flags])
	}
	if fa.mode >= 0 {
		mode = uint32(args[fa.mode])
	}
	if fa.how {
		var how [16]byte // struct open_how: flags, mode (u64 each)
		if n, _ := mem.ReadAt(how[:], int64(args[2])); n < len(how) {
			return fileChange{}, false
		}
		flags, mode = uint32(binary.LittleEndian.Uint64(how[:])), uint32(binary.LittleEndian.Uint64(how[8:]))
	}
	var st unix.Stat_t
	var fails bool
	exists := func(p string, follow bool) (bool, bool) { // exists, known
		var err error
		if follow {
			err = unix.Stat(p, &st)
		} else {
			err = unix.Lstat(p, &st)
		}
		return err == nil, err == nil || err == unix.ENOENT
	}
	switch fa.op {
	case fileOpen:
		if flags&writeFlags == 0 || flags&unix.O_TMPFILE == unix.O_TMPFILE {
			return fileChange{}, false // a read, or a file without a name
		}
		there, known := exists(name, flags&unix.O_NOFOLLOW == 0)
		typ := st.Mode & unix.S_IFMT
		switch {
		case !known:
			return fileChange{}, false
		case there && (flags&(unix.O_CREAT|unix.O_EXCL) == unix.O_CREAT|unix.O_EXCL || typ != unix.S_IFREG):
			return fileChange{}, false // fails, or a special file or directory
		case there && flags&(unix.O_WRONLY|unix.O_RDWR|unix.O_TRUNC) == 0:
			return fileChange{}, false // O_CREAT of an existing file, to read
		case there:
			fc.op, fc.size, fc.mode = "modify", st.Size, st.Mode
			fc.refused, _ = access(name, false)
		case flags&unix.O_CREAT == 0:
			return fileChange{}, false // fails: no such file
		default:
			fc.op, fc.mode = "create", unix.S_IFREG|mode&0o7777&^umask
			// A dangling symbolic link: the kernel creates its target.
			dir := path.Dir(name)
			if t, err := os.Readlink(name); err == nil && flags&unix.O_NOFOLLOW == 0 {
				if !strings.HasPrefix(t, "/") {
					t = path.Join(dir, t)
				}
				dir = path.Dir(t)
			}
			if fc.refused, fails = access(dir, true); fails {
				return fileChange{}, false
			}
		}
	case fileMake:
		if there, known := exists(name, false); there || !known {
			return fileChange{}, false // fails: the name exists
		}
		fc.op = "create"
		if fc.refused, fails = access(path.Dir(name), true); fails {
			return fileChange{}, false
		}
		switch {
		case fa.typ == unix.S_IFLNK:
			fc.mode = unix.S_IFLNK | 0o777
			fc.from = readString(mem, args[fa.from], maxPathLen)
		case fa.typ == unix.S_IFDIR:
			fc.mode = unix.S_IFDIR | mode&0o7777&^umask
		case fa.from >= 0: // a hard link: the existing file's
			fc.from = procPath(pid, mem, args, fa.fdir, fa.from)
			if there, _ := exists(fc.from, false); there {
				fc.size, fc.mode = st.Size, st.Mode
			}
		default: // mknod
			if t := mode & unix.S_IFMT; t != 0 && t != unix.S_IFREG {
				return fileChange{}, false // a special file
			}
			fc.mode = unix.S_IFREG | mode&0o7777&^umask
		}
	case fileRemove, fileTruncate:
		if there, _ := exists(name, fa.op == fileTruncate); !there {
			return fileChange{}, false // fails: no such file
		}
		if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR && t != unix.S_IFLNK {
			return fileChange{}, false
		}
		fc.size, fc.mode = st.Size, st.Mode
		if fa.op == fileTruncate {
			fc.op = "modify"
			fc.refused, _ = access(name, false)
		} else {
			fc.op = "remove"
			fc.refused, _ = access(path.Dir(name), true)
		}
	case fileRename:
		fc.from = procPath(pid, mem, args, fa.fdir, fa.from)
		if fc.from == "" {
			return fileChange{}, false
		}
		if there, _ := exists(fc.from, false); !there {
			return fileChange{}, false // fails: no such file
		}
		fc.op, fc.size, fc.mode = "rename", st.Size, st.Mode
		to, fails := access(path.Dir(name), true)
		if fails {
			return fileChange{}, false
		}
		from, _ := access(path.Dir(fc.from), true)
		fc.refused = to || from
	}
	return fc, true
}

// procPath reads the name at args[name] of process pid and makes it
// absolute: relative to the directory descriptor args[dir] (dir < 0 or
// AT_FDCWD: its working directory). An empty name is the descriptor's own
// (AT_EMPTY_PATH).
func procPath(pid int, mem procMem, args [6]uint64, dir, name int8) string {
	p := readString(mem, args[name], maxPathLen)
	if strings.HasPrefix(p, "/") {
		return path.Clean(p)
	}
	base := "/proc/" + strconv.Itoa(pid) + "/cwd"
	if dir >= 0 {
		if fd := int32(args[dir]); fd != unix.AT_FDCWD {
			base = "/proc/" + strconv.Itoa(pid) + "/fd/" + strconv.Itoa(int(fd))
		}
	}
	d, err := os.Readlink(base)
	if err != nil || !strings.HasPrefix(d, "/") {
		return "" // gone, or not a directory of this file system tree
	}
	return path.Join(d, p)
}

// readString reads a NUL-terminated string at p, at most max bytes: 256
// first (most names are short), then the rest.
func readString(f procMem, p uint64, max int) string {
	if p == 0 {
		return ""
	}
	b := make([]byte, min(max, 256))
	n, _ := f.ReadAt(b, int64(p))
	if i := bytes.IndexByte(b[:n], 0); i >= 0 {
		return string(b[:i])
	}
	if n == len(b) && len(b) < max {
		b = append(b, make([]byte, max-len(b))...)
		m, _ := f.ReadAt(b[n:], int64(p)+int64(n))
		n += m
	}
	b = b[:n]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// recordedPlace reports whether a change at p is recorded: not in the
// kernel's trees (/proc, /sys, /dev but /dev/shm).
func recordedPlace(p string) bool {
	for _, k := range []string{"/proc", "/sys", "/dev"} {
		if p == k || strings.HasPrefix(p, k+"/") {
			return k == "/dev" && (p == "/dev/shm" || strings.HasPrefix(p, "/dev/shm/"))
		}
	}
	return true
}

// access asks the kernel whether the calling thread's user may write the
// file p, or make and remove names in the directory p (dir), and says
// what a change there comes to: refused (EROFS, EACCES), failing (no such
// directory: no change), or neither. Where the kernel cannot say (no
// faccessat2), neither.
func access(p string, dir bool) (refused, fails bool) {
	mode := uint32(unix.W_OK)
	if dir {
		mode |= unix.X_OK
	}
	switch unix.Faccessat2(unix.AT_FDCWD, p, mode, unix.AT_EACCESS) {
	case unix.EROFS, unix.EACCES:
		return true, false
	case unix.ENOENT, unix.ENOTDIR:
		return false, true
	}
	return false, false
}
