//go:build linux

package main

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// window is a command's output credit: how many more bytes the agent may
// send before the library acknowledges some.
type window struct {
	mu     sync.Mutex
	cond   *sync.Cond
	avail  int
	closed bool
}

func newWindow(n int) *window {
	w := &window{avail: n}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// take waits for credit and takes up to max bytes of it; 0 once closed.
func (w *window) take(max int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.avail <= 0 && !w.closed {
		w.cond.Wait()
	}
	if w.closed {
		return 0
	}
	n := min(max, w.avail)
	w.avail -= n
	return n
}

func (w *window) give(n int) {
	if n <= 0 {
		return
	}
	w.mu.Lock()
	w.avail += n
	w.mu.Unlock()
	w.cond.Broadcast()
}

// close makes take return 0 from now on.
func (w *window) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cond.Broadcast()
}

// inbox is a command's stdin bytes on their way to it. Its size is bounded
// by the library's window of unacknowledged stdin, not by a count of
// frames (a writer of single bytes sends many small ones).
type inbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	q      [][]byte
	closed bool
}

func newInbox() *inbox {
	b := &inbox{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *inbox) feed(p []byte) {
	b.mu.Lock()
	if !b.closed {
		b.q = append(b.q, p)
	}
	b.mu.Unlock()
	b.cond.Signal()
}

func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Signal()
}

// drop closes the inbox and empties it, returning how many bytes it held.
func (b *inbox) drop() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, p := range b.q {
		n += len(p)
	}
	b.q, b.closed = nil, true
	b.cond.Signal()
	return n
}

// next returns the next bytes, waiting for them; false once closed and
// drained.
func (b *inbox) next() ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.q) == 0 && !b.closed {
		b.cond.Wait()
	}
	if len(b.q) == 0 {
		return nil, false
	}
	p := b.q[0]
	b.q[0] = nil
	b.q = b.q[1:]
	return p, true
}

// maxRounds bounds a kill's scans of /proc. Every round kills every tagged
// process it sees, and a killed process forks no more, so a kill ends in
// a few rounds even against a fork bomb; the bound is a guard.
const maxRounds = 1000

// killTag SIGKILLs every process that carries the supplementary group tag,
// scanning /proc until a scan finds none alive. It returns how many
// processes it killed and how many scans it took.
func killTag(tag uint32, self int) (killed, rounds int) {
	return killTags(map[uint32]bool{tag: true}, self)
}

// killTags is killTag of every process that carries any of tags.
func killTags(tags map[uint32]bool, self int) (killed, rounds int) {
	buf := make([]byte, 8<<10)
	for rounds = 1; rounds <= maxRounds; rounds++ {
		n := 0
		for _, pid := range pids(self) {
			st, ok := readStatus(pid, buf)
			if !ok {
				continue
			}
			f := statusFields(st)
			if f.gone() || !anyGroup(f.groups, tags) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
		killed += n
		if n == 0 {
			return killed, rounds
		}
	}
	return killed, maxRounds
}

// groupsInUse returns the supplementary groups that live processes other
// than self carry.
func groupsInUse(self int) map[uint32]bool {
	in := map[uint32]bool{}
	buf := make([]byte, 8<<10)
	for _, pid := range pids(self) {
		st, ok := readStatus(pid, buf)
		if !ok {
			continue
		}
		f := statusFields(st)
		if f.gone() {
			continue
		}
		for _, g := range bytes.Fields(f.groups) {
			if n, err := strconv.ParseUint(string(g), 10, 32); err == nil {
				in[uint32(n)] = true
			}
		}
	}
	return in
}

// pids lists the processes in /proc other than self.
func pids(self int) []int {
	out := numbered("/proc")
	for i, pid := range out {
		if pid == self {
			return append(out[:i], out[i+1:]...)
		}
	}
	return out
}

// numbered lists the entries of directory dir named by a number, such as
// /proc's processes and /proc/PID/task's threads.
func numbered(dir string) []int {
	d, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]int, 0, len(names))
	for _, n := range names {
		if id, err := strconv.Atoi(n); err == nil {
			out = append(out, id)
		}
	}
	return out
}

// readStatus reads /proc/PID/status, at most len(buf) bytes of it (the
// kernel writes it; it is about 1.5 KiB).
func readStatus(pid int, buf []byte) ([]byte, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		return nil, false
	}
	return buf[:n], true
}

// status is what the kill reads of /proc/PID/status.
type status struct {
	state   byte   // R, S, D, T, Z...
	threads int    // threads still in the process
	groups  []byte // supplementary groups, space-separated
}

// gone reports a process with no thread left to run: a zombie waiting to
// be reaped. Its leader alone being a zombie is not enough: a main thread
// that called exit(2) shows state Z while the process's other threads run
// on, and those must be killed.
func (s status) gone() bool { return s.state == 'Z' && s.threads <= 1 }

// statusFields reads the fields of a /proc/PID/status text that the kill
// needs. The last line of each name is used: the kernel escapes the one
// field a process controls (Name), but a forged line could only come
// before the real one anyway.
func statusFields(st []byte) status {
	var s status
	for line := range bytes.SplitSeq(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("State:")); ok {
			v = bytes.TrimSpace(v)
			if len(v) > 0 {
				s.state = v[0]
			}
		} else if v, ok := bytes.CutPrefix(line, []byte("Threads:")); ok {
			s.threads, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		} else if v, ok := bytes.CutPrefix(line, []byte("Groups:")); ok {
			s.groups = v
		}
	}
	return s
}

// anyGroup reports whether the space-separated list groups holds any of
// tags.
func anyGroup(groups []byte, tags map[uint32]bool) bool {
	for _, g := range bytes.Fields(groups) {
		if n, err := strconv.ParseUint(string(g), 10, 32); err == nil && tags[uint32(n)] {
			return true
		}
	}
	return false
}

// oomKills returns how many processes the kernel's OOM killer has ended in
// the container's memory cgroup (cgroup v1 or v2), or -1 if it cannot tell.
func oomKills() int {
	for _, f := range []string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range bytes.SplitSeq(b, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
				if n, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil {
					return n
				}
			}
		}
	}
	return -1
}
