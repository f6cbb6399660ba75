//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// A watch (wire.WatchRequest) is an inotify instance of its own, read by
// one goroutine. Every directory it covers is opened one name at a time
// from the watch's top (openat with O_NOFOLLOW) as the sandbox user on a
// file worker, and given to inotify through the agent's own descriptor
// (/proc/self/fd/N): no symbolic link is ever followed, so a link planted
// in the tree (to /, /proc, /etc) is an entry like any file, never a way
// out of it. Memory is bounded whatever the sandbox does: at most
// wire.MaxWatchDirs directories (a node each: a name and a few words), a
// read buffer, and watchPending bytes of records not yet sent; when the
// library gives no credit, the agent stops reading and the kernel's own
// bounded queue overflows (IN_Q_OVERFLOW: one WatchOverflow record).

// watchMask is what a watch asks inotify for.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchPending bounds the records a watch holds before it sends them:
// beyond it, records are dropped and one WatchOverflow says so.
const watchPending = 64 << 10

// moveWait is how long a watch waits for the IN_MOVED_TO that pairs with
// an IN_MOVED_FROM at the end of a read before calling it a removal (the
// kernel queues the two one after the other, not at once).
const moveWait = 10 * time.Millisecond

// dirWatch is one watch in progress on one channel.
type dirWatch struct {
	a         *agent
	ch        uint32
	id        fsID
	recursive bool
	out       *window // credit granted by the library

	ifd   *os.File // the inotify instance (non-blocking: read through the poller)
	rawFD int
	top   *wnode
	nodes map[int32]*wnode // by watch descriptor

	pending  []byte // records not sent yet
	overflow bool   // records were dropped since pending was last sent
	move     *moved // an IN_MOVED_FROM waiting for its IN_MOVED_TO
	ended    bool   // the top directory went away

	mu      sync.Mutex
	stopped bool // a Kill or the session's end: the reader ends
}

// wnode is a directory a watch covers.
type wnode struct {
	wd       int32
	parent   *wnode // nil for the top
	name     string // in parent; the top's absolute path for the top
	children map[string]*wnode
}

// moved is the first half of a rename.
type moved struct {
	cookie uint32
	dir    *wnode
	name   string
	isDir  bool
}

// path returns the absolute path of n.
func (n *wnode) path() string {
	if n.parent == nil {
		return n.name
	}
	var names []string
	for ; n.parent != nil; n = n.parent {
		names = append(names, n.name)
	}
	for i, j := 0, len(names)-1; i < j; i, j = i+1, j-1 {
		names[i], names[j] = names[j], names[i]
	}
	return path.Join(n.name, strings.Join(names, "/"))
}

// errTooManyWatches refuses a watch over wire.MaxWatches.
var errTooManyWatches = fmt.Errorf("agent: more than %d watches at once", wire.MaxWatches)

// startWatch begins the watch of req on channel ch.
func (a *agent) startWatch(ch uint32, data []byte) {
	var req wire.WatchRequest
	if err := json.Unmarshal(data, &req); err != nil {
		a.watchFailed(ch, fmt.Errorf("agent: bad watch request: %w", err))
		return
	}
	p := string(req.Path)
	if !path.IsAbs(p) || path.Clean(p) != p || len(p) > wire.MaxWatchPath {
		a.watchFailed(ch, &os.PathError{Op: "watch", Path: p, Err: syscall.EINVAL})
		return
	}
	w := &dirWatch{a: a, ch: ch, id: fsID{req.Uid, req.Gid}, recursive: req.Recursive,
		out: newWindow(wire.WatchWindow), nodes: map[int32]*wnode{}}
	a.mu.Lock()
	switch {
	case a.ended || a.over:
		a.mu.Unlock()
		return
	case a.byChan[ch] != nil || a.files[ch] != nil || a.watches[ch] != nil:
		a.mu.Unlock()
		a.watchFailed(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return
	case a.nwatches >= wire.MaxWatches:
		a.mu.Unlock()
		a.watchFailed(ch, errTooManyWatches)
		return
	}
	a.nwatches++
	a.watches[ch] = w
	a.mu.Unlock()
	go func() {
		if err := w.open(p); err != nil {
			w.release()
			a.watchFailed(ch, err)
			return
		}
		a.sendJSON(wire.Started, ch, wire.Start{})
		w.run()
	}()
}

// watchFailed answers a watch request with Failed (a JSON FileError).
func (a *agent) watchFailed(ch uint32, err error) {
	fe := fileErr(err)
	if errors.Is(err, errTooManyWatches) || errors.Is(err, syscall.EMFILE) {
		fe.Errno = uint32(syscall.EMFILE)
	}
	a.sendJSON(wire.Failed, ch, fe)
}

func (a *agent) lookupWatch(ch uint32) *dirWatch {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.watches[ch]
}

// watchInput takes the library's Ack or Kill for a watch.
func (a *agent) watchInput(w *dirWatch, f wire.Frame) {
	switch f.Kind {
	case wire.Ack:
		if n, err := wire.Count(f.Data); err == nil {
			w.out.give(int(n))
		}
	case wire.Kill:
		w.stop()
		a.sendJSON(wire.Killed, f.Channel, wire.KillResult{})
	}
}

// stop ends the watch: its reader wakes and ends it (the reader alone
// closes the inotify descriptor, which it may be using).
func (w *dirWatch) stop() {
	w.mu.Lock()
	w.stopped = true
	if w.ifd != nil {
		w.ifd.SetReadDeadline(time.Unix(1, 0))
	}
	w.mu.Unlock()
	w.out.close()
}

// isStopped reports whether stop was called.
func (w *dirWatch) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// setDeadline sets the reader's deadline, unless the watch was stopped
// (whose deadline is past).
func (w *dirWatch) setDeadline(t time.Time) {
	w.mu.Lock()
	if !w.stopped {
		w.ifd.SetReadDeadline(t)
	}
	w.mu.Unlock()
}

// release forgets the watch: its channel and its place among the
// instance's watches.
func (w *dirWatch) release() {
	a := w.a
	a.mu.Lock()
	if a.watches[w.ch] == w {
		delete(a.watches, w.ch)
		a.nwatches--
	}
	a.mu.Unlock()
}

// open makes the inotify instance and watches the top directory p (and
// with recursive the tree below it).
func (w *dirWatch) open(p string) error {
	// Made as the sandbox user: the kernel charges the instance and its
	// watches to that user (fs.inotify.max_user_instances, 128 by
	// default, counts per user over the whole machine), not to root.
	var fd int
	err := w.a.fs.as(w.id, func() error {
		var err error
		fd, err = unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		return err
	})
	if err != nil {
		return &os.PathError{Op: "inotify_init", Path: p, Err: err}
	}
	w.rawFD = fd
	f := os.NewFile(uintptr(fd), "inotify")
	w.mu.Lock()
	w.ifd = f
	if w.stopped {
		f.SetReadDeadline(time.Unix(1, 0))
	}
	w.mu.Unlock()
	top := &wnode{name: p}
	err = w.a.fs.as(w.id, func() error {
		dfd, err := openTop(p)
		if err != nil {
			return &os.PathError{Op: "watch", Path: p, Err: err}
		}
		defer unix.Close(dfd)
		if top.wd, err = addWatch(w.rawFD, dfd); err != nil {
			return &os.PathError{Op: "watch", Path: p, Err: err}
		}
		w.nodes[top.wd] = top
		if w.recursive {
			w.addTree(dfd, top, false, false)
		}
		return nil
	})
	if err != nil {
		w.ifd.Close()
		return err
	}
	w.top = top
	return nil
}

// openTop opens directory p from the root one name at a time, following
// no symbolic link (ELOOP or ENOTDIR for one), and refuses /proc and /sys.
func openTop(p string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, name := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if name == "" {
			continue
		}
		next, err := openDirAt(fd, name)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	if pseudoFS(fd) {
		unix.Close(fd)
		return -1, unix.EACCES
	}
	return fd, nil
}

// openDirAt opens the directory name of dirfd, never following a link.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOTDIR {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = unix.ELOOP
		}
	}
	return fd, err
}

// pseudoFS reports whether fd is on /proc, /sys or a cgroup file system:
// nothing a watch has to do with.
func pseudoFS(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return true
	}
	switch sfs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC:
		return true
	}
	return false
}

// addWatch adds an inotify watch on the directory open as dfd, through
// the agent's own descriptor: the path resolves to exactly that directory.
func addWatch(ifd, dfd int) (int32, error) {
	wd, err := unix.InotifyAddWatch(ifd, "/proc/self/fd/"+strconv.Itoa(dfd), watchMask)
	return int32(wd), err
}

// addTree watches every directory below n (open as dfd), breadth first,
// as the sandbox user (on a file worker). With creates, every entry found
// is also said as created: a directory made after the watch began may
// have filled before its own watch was added.
func (w *dirWatch) addTree(dfd int, n *wnode, creates, closeFirst bool) {
	type item struct {
		fd int
		n  *wnode
	}
	own := closeFirst // whether queue[0].fd is ours to close
	queue := []item{{dfd, n}}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		rd, err := unix.Openat(it.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if own {
			unix.Close(it.fd)
		}
		own = true
		if err != nil {
			continue // gone meanwhile, or closed to the user
		}
		f := os.NewFile(uintptr(rd), "dir")
		for {
			ents, err := f.ReadDir(256)
			for _, e := range ents {
				name := e.Name()
				if creates {
					w.record(wire.WatchCreate, it.n, name, nil)
				}
				if !e.IsDir() {
					continue
				}
				child, cfd := w.watchChild(int(f.Fd()), it.n, name)
				if child != nil && cfd >= 0 {
					queue = append(queue, item{cfd, child})
				}
			}
			if err != nil || len(ents) == 0 {
				break
			}
		}
		f.Close()
	}
}

// watchChild watches directory name of n (open as dirfd), returning its
// node and an O_PATH descriptor of it (the caller closes), or nil and -1
// for a directory not watched: one a link, gone, on /proc or /sys, or
// over the bounds (then a WatchOverflow record names it).
func (w *dirWatch) watchChild(dirfd int, n *wnode, name string) (*wnode, int) {
	if c := n.children[name]; c != nil {
		return nil, -1 // already watched
	}
	if len(w.nodes) >= wire.MaxWatchDirs || len(n.path())+1+len(name) > wire.MaxWatchPath {
		w.record(wire.WatchOverflow, n, name, nil)
		return nil, -1
	}
	cfd, err := openDirAt(dirfd, name)
	if err != nil {
		return nil, -1
	}
	if pseudoFS(cfd) {
		unix.Close(cfd)
		return nil, -1
	}
	wd, err := addWatch(w.rawFD, cfd)
	if err != nil {
		unix.Close(cfd)
		if err == unix.ENOSPC {
			w.record(wire.WatchOverflow, n, name, nil)
		}
		return nil, -1
	}
	if old := w.nodes[wd]; old != nil {
		// The same directory, seen again (a hard-linked directory cannot
		// be, but a rename may race the scan): keep its first node.
		unix.Close(cfd)
		return nil, -1
	}
	c := &wnode{wd: wd, parent: n, name: name}
	if n.children == nil {
		n.children = map[string]*wnode{}
	}
	n.children[name] = c
	w.nodes[wd] = c
	return c, cfd
}

// openNode opens the directory of node n from the top, one name at a
// time, never following a link (as the sandbox user: on a file worker).
func (w *dirWatch) openNode(n *wnode) (int, error) {
	var names []string
	for m := n; m.parent != nil; m = m.parent {
		names = append(names, m.name)
	}
	fd, err := openTop(w.top.name)
	if err != nil {
		return -1, err
	}
	for i := len(names) - 1; i >= 0; i-- {
		next, err := openDirAt(fd, names[i])
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// addNew watches directory name of n, made (or moved in) after the watch
// began, and the tree below it, saying what it already holds as created.
func (w *dirWatch) addNew(n *wnode, name string) {
	if len(w.nodes) >= wire.MaxWatchDirs {
		w.record(wire.WatchOverflow, n, name, nil) // no walk: a flood of directories costs little
		return
	}
	w.a.fs.as(w.id, func() error {
		dfd, err := w.openNode(n)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		c, cfd := w.watchChild(dfd, n, name)
		if c == nil {
			return nil
		}
		w.addTree(cfd, c, true, true)
		return nil
	})
}

// record queues one record about name in directory n (name empty: n
// itself); from, if not nil, is a rename's old path.
func (w *dirWatch) record(op byte, n *wnode, name string, from []byte) {
	p := n.path()
	if name != "" {
		p = path.Join(p, name)
	}
	if len(w.pending)+wire.WatchRecordSize+len(p)+len(from) > watchPending {
		w.overflow = true
		return
	}
	if w.overflow {
		w.pending, _ = wire.AppendWatchRecord(w.pending, wire.WatchOverflow, []byte(w.top.pathOr()), nil)
		w.overflow = false
	}
	var ok bool
	if w.pending, ok = wire.AppendWatchRecord(w.pending, op, []byte(p), from); !ok {
		w.pending, _ = wire.AppendWatchRecord(w.pending, wire.WatchOverflow, []byte(n.path()), nil)
	}
}

// pathOr is the top's path, also while open is still making the top.
func (n *wnode) pathOr() string {
	if n == nil {
		return ""
	}
	return n.path()
}

// run reads the watch's events until it ends, then sends its end.
func (w *dirWatch) run() {
	defer func() {
		w.stop()
		w.ifd.Close()
		w.release()
		w.a.send(wire.Events, w.ch, nil)
	}()
	buf := make([]byte, 64<<10)
	for !w.ended {
		if w.move != nil {
			w.setDeadline(time.Now().Add(moveWait))
		}
		n, err := w.ifd.Read(buf)
		if w.move != nil {
			w.setDeadline(time.Time{})
		}
		switch {
		case w.isStopped():
			return // a Kill, the session's end
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.moveOut()
		case err != nil:
			return
		default:
			w.events(buf[:n])
		}
		if !w.flush() {
			return
		}
	}
	w.flush()
}

// flush sends the pending records in frames of whole records, each once
// the library's credit allows; false if the window closed (stopped).
func (w *dirWatch) flush() bool {
	if w.overflow {
		w.pending, _ = wire.AppendWatchRecord(w.pending, wire.WatchOverflow, []byte(w.top.path()), nil)
		w.overflow = false
	}
	b := w.pending
	for len(b) > 0 {
		// Cut at a record's end within MaxData.
		end := 0
		for end < len(b) {
			_, _, _, rest, ok := wire.ParseWatchRecord(b[end:])
			next := len(b) - len(rest)
			if !ok || next > wire.MaxData {
				break
			}
			end = next
		}
		for got := 0; got < end; {
			n := w.out.take(end - got)
			if n == 0 {
				return false
			}
			got += n
		}
		w.a.send(wire.Events, w.ch, b[:end])
		b = b[end:]
	}
	w.pending = w.pending[:0]
	return true
}

// events turns a read of inotify events into records.
func (w *dirWatch) events(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(b) {
			return
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		if i := strings.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		w.event(ev.Wd, ev.Mask, ev.Cookie, name)
		b = b[end:]
	}
}

// event takes one inotify event.
func (w *dirWatch) event(wd int32, mask, cookie uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.overflow = true
		return
	}
	n := w.nodes[wd]
	if n == nil {
		return // a directory no longer watched
	}
	isDir := mask&unix.IN_ISDIR != 0
	if w.move != nil && !(mask&unix.IN_MOVED_TO != 0 && cookie == w.move.cookie) {
		w.moveOut()
	}
	switch {
	case mask&unix.IN_IGNORED != 0:
		w.forget(n)
		if n == w.top {
			w.ended = true
		}
	case mask&unix.IN_DELETE_SELF != 0:
		if n == w.top {
			w.record(wire.WatchRemove, n, "", nil)
		}
	case mask&unix.IN_CREATE != 0:
		w.record(wire.WatchCreate, n, name, nil)
		if isDir && w.recursive {
			w.addNew(n, name)
		}
	case mask&unix.IN_MODIFY != 0:
		if !isDir {
			w.record(wire.WatchModify, n, name, nil)
		}
	case mask&unix.IN_DELETE != 0:
		w.record(wire.WatchRemove, n, name, nil)
	case mask&unix.IN_MOVED_FROM != 0:
		w.move = &moved{cookie: cookie, dir: n, name: name, isDir: isDir}
	case mask&unix.IN_MOVED_TO != 0:
		m := w.move
		w.move = nil
		if m == nil {
			w.record(wire.WatchCreate, n, name, nil)
			if isDir && w.recursive {
				w.addNew(n, name)
			}
			return
		}
		from := path.Join(m.dir.path(), m.name)
		w.record(wire.WatchRename, n, name, []byte(from))
		if !isDir || !w.recursive {
			return
		}
		if c := m.dir.children[m.name]; c != nil {
			delete(m.dir.children, m.name)
			if old := n.children[name]; old != nil { // replaced an empty directory
				w.drop(old)
			}
			c.parent, c.name = n, name
			if n.children == nil {
				n.children = map[string]*wnode{}
			}
			n.children[name] = c
		} else {
			w.addNew(n, name)
		}
	}
}

// moveOut ends a rename whose second half never came: the entry left the
// watch, which is a removal.
func (w *dirWatch) moveOut() {
	m := w.move
	w.move = nil
	if m == nil {
		return
	}
	w.record(wire.WatchRemove, m.dir, m.name, nil)
	if c := m.dir.children[m.name]; c != nil && m.isDir {
		w.drop(c)
	}
}

// drop stops watching directory n and everything below it.
func (w *dirWatch) drop(n *wnode) {
	for _, c := range n.children {
		w.drop(c)
	}
	unix.InotifyRmWatch(w.rawFD, uint32(n.wd))
	w.forget(n)
}

// forget removes n from the watch's tables (its watch is gone).
func (w *dirWatch) forget(n *wnode) {
	if w.nodes[n.wd] == n {
		delete(w.nodes, n.wd)
	}
	if n.parent != nil && n.parent.children[n.name] == n {
		delete(n.parent.children, n.name)
	}
}
