//go:build linux

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The monitor is the activity record's eyes: it sees every program a
// command executes, every connection it attempts and every process end,
// including a process that exits at once and a static binary.
//
// The agent forks commands on one OS thread of its own that carries a
// seccomp filter returning SECCOMP_RET_USER_NOTIF for execve, execveat,
// connect and exit_group (other system calls pass untouched). A filter is
// inherited at fork and kept across exec, and a process under no_new_privs
// (every command) can add filters but never remove one; so every
// descendant of a command, whatever it does, stops at those calls until
// the agent has read what it asked and let it go on
// (SECCOMP_USER_NOTIF_FLAG_CONTINUE: the kernel then runs the call as
// asked, and the engine's own profile still applies). The rest of the
// agent's threads carry no filter. Reading a process's arguments needs
// access to its memory: the thread that answers the notifications takes
// on the process's user and group (as the file workers do, keeping root
// as its real and saved user) and reads /proc/PID/mem, which the kernel
// allows an ancestor of the same user. It does so itself, not through a
// worker: the process waits meanwhile, and a hand-over between threads
// costs it two wake-ups.
//
// What it cannot see: a process that made itself non-dumpable (or runs a
// program it may not read) keeps its arguments to itself (the record then
// has the path alone, or nothing but the PID); a process killed by a
// signal makes no exit call, and its end is learned from a pidfd, its
// status from its zombie when the agent is quicker than its parent. gVisor
// has no user notifications: there newMonitor fails and the agent runs
// without a monitor.
type monitor struct {
	fd    int         // the seccomp listener
	forks chan func() // run on the monitored thread
	root  bool        // the agent is root: serve takes on each process's user to read its memory
	cur   fsID        // the identity serve's thread has (serve's alone)
	emit  func(actEvent)
	self  int // the agent's PID
	// relayPort is the sandbox's relay port (0: none): a connect to it
	// is sent with its socket's inode, to find the command a relayed
	// connection comes from (origin.go). Set before any command runs.
	relayPort int

	mu          sync.Mutex
	pending     []string          // the arguments of the command being forked (its first exec runs in the agent's memory)
	pendingPath string            // and its program
	pendingTag  uint32            // and its tag
	known       map[int]*procSeen // processes that executed a program, until they end
	closed      bool
}

// procSeen is what the monitor keeps of a process between its exec and its
// end.
type procSeen struct {
	exited bool   // exit_group seen: the end event is sent
	code   int    // its status
	groups []byte // its supplementary groups at its last exec
	ppid   int
	uid    int
}

// actKind is the kind of an actEvent.
type actKind uint8

const (
	actExec    actKind = iota + 1 // a program executed (a new record, also in the same PID)
	actExit                       // a process that executed a program ended
	actConnect                    // a connection attempted
	actFile                       // a file created, changed, removed or renamed
)

// actEvent is one thing the monitor saw.
type actEvent struct {
	kind   actKind
	pid    int
	ppid   int
	uid    int
	groups []byte // supplementary groups, space-separated: the command's tag is among them
	time   time.Time

	path string   // actExec: the program as asked
	args []string // actExec: bounded (maxArgs, maxArgLen)

	code   int    // actExit: exit status, -1 when ended by a signal
	signal string // actExit: the signal's name, "" when it exited
	cpu    time.Duration
	maxRSS int64 // bytes

	network string // actConnect: "tcp4"/"tcp6"-like family: "ip4", "ip6"
	addr    string // actConnect: the address asked
	port    int
	inode   uint64 // actConnect to the relay port: the socket's inode (0: unknown)

	file fileChange // actFile
}

// Bounds of an exec's arguments as recorded.
const (
	maxArgs   = 64
	maxArgLen = 512
)

// errNoMonitor says the kernel (or gVisor) has no seccomp user
// notification.
var errNoMonitor = errors.New("agent: seccomp user notification is not available")

// newMonitor starts the monitored thread and the loop that answers its
// notifications; emit receives every event, in order, on the loop's
// goroutine (it must not block for long: the process waits).
func newMonitor(emit func(actEvent)) (*monitor, error) {
	m := &monitor{forks: make(chan func()), emit: emit, self: os.Getpid(), known: map[int]*procSeen{}}
	m.root = os.Geteuid() == 0
	ready := make(chan error, 1)
	go m.thread(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	// Return only once serve runs on its own thread: a fork holds its P
	// until serve has answered the child's exec, and a serve goroutine
	// still waiting in that P's run queue would never run (the agent's
	// tests hung so, forking at once after newMonitor).
	running := make(chan struct{})
	go m.serve(running)
	<-running
	return m, nil
}

// thread installs the filter on its own OS thread, then runs forks.
func (m *monitor) thread(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the filter is this thread's
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		ready <- fmt.Errorf("agent: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
		return
	}
	prog := monitorFilter()
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fp)))
	if e != 0 {
		ready <- fmt.Errorf("%w: %v", errNoMonitor, e)
		return
	}
	m.fd = int(fd)
	ready <- nil
	for f := range m.forks {
		f()
	}
}

// fork runs f, which forks program path with arguments args as the
// command tagged tag, on the monitored thread. Forks take turns.
func (m *monitor) fork(path string, args []string, tag uint32, f func()) {
	m.mu.Lock()
	m.pending, m.pendingPath, m.pendingTag = args, path, tag
	m.mu.Unlock()
	// The fork's child stops at its exec until serve answers, and the
	// forking thread holds its P meanwhile, unable to stop (vfork: it is
	// in no system call the scheduler knows of). So serve needs a second
	// P, and nothing may stop the world until the fork returns: no
	// garbage collection (a cycle running is finished before it is off,
	// and the memory limit would start one), no change of GOMAXPROCS.
	if prev := runtime.GOMAXPROCS(0); prev < 2 {
		runtime.GOMAXPROCS(2)
		defer runtime.GOMAXPROCS(prev)
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	done := make(chan struct{})
	m.forks <- func() { f(); close(done) }
	<-done
	m.mu.Lock()
	m.pending, m.pendingPath, m.pendingTag = nil, "", 0
	m.mu.Unlock()
}

// seccompNotif is struct seccomp_notif.
type seccompNotif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

// seccompResp is struct seccomp_notif_resp.
type seccompResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

// serve answers notifications until the listener fails (the agent ends).
// It closes running once it has its thread.
func (m *monitor) serve(running chan<- struct{}) {
	runtime.LockOSThread() // never unlocked: the loop blocks in ioctl, and takes on users (see as)
	close(running)
	for {
		var n seccompNotif
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(m.fd), unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n)))
		if e == unix.EINTR || e == unix.ENOENT { // ENOENT: the process died waiting
			continue
		}
		if e != 0 {
			return
		}
		m.handle(&n)
		r := seccompResp{id: n.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		unix.Syscall(unix.SYS_IOCTL, uintptr(m.fd), unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&r)))
	}
}

// handle turns one notification into an event.
func (m *monitor) handle(n *seccompNotif) {
	c, ok := lookupCall(n.arch, n.nr)
	if !ok {
		return
	}
	pid := int(n.pid)
	if c.kind == callExit {
		m.mu.Lock()
		p := m.known[pid]
		m.mu.Unlock()
		if p == nil {
			return // a fork that never executed a program is not a record
		}
	}
	var buf [4096]byte
	st, err := readProc("/proc/"+strconv.Itoa(pid)+"/status", buf[:])
	if err != nil {
		return // gone already
	}
	ev := actEvent{pid: pid, time: time.Now()}
	var gid int
	ev.ppid, ev.uid, gid, ev.groups = monitorStatus(st)
	id := fsID{uint32(ev.uid), uint32(gid)}
	switch c.kind {
	case callExec, callExecAt:
		pathp, argvp := n.args[0], n.args[1]
		if c.kind == callExecAt {
			pathp, argvp = n.args[1], n.args[2]
		}
		ev.kind = actExec
		if path, args, ok := m.pendingExec(ev.ppid, ev.groups); ok {
			ev.path, ev.args = path, args
		} else {
			ev.path, ev.args = m.readExec(pid, id, pathp, argvp, c.word)
		}
		if !m.valid(n.id) {
			return
		}
		m.mu.Lock()
		p, seen := m.known[pid]
		if !seen {
			p = &procSeen{}
			m.known[pid] = p
		}
		p.groups, p.ppid, p.uid = ev.groups, ev.ppid, ev.uid
		m.mu.Unlock()
		if !seen {
			m.watchEnd(pid)
		}
	case callConnect, callSocketcall:
		fd, p, l := n.args[0], n.args[1], n.args[2]
		if c.kind == callSocketcall {
			if n.args[0] != 3 { // SYS_CONNECT
				return
			}
			var a [12]byte // fd, addr, len as 32-bit words
			if m.readMem(pid, id, n.args[1], a[:]) != len(a) {
				return
			}
			fd = uint64(binary.LittleEndian.Uint32(a[:]))
			p, l = uint64(binary.LittleEndian.Uint32(a[4:])), uint64(binary.LittleEndian.Uint32(a[8:]))
		}
		b := make([]byte, min(l, 128))
		b = b[:m.readMem(pid, id, p, b)]
		if !parseSockaddr(&ev, b) {
			return
		}
		if m.relayPort != 0 && ev.port == m.relayPort && isLoopback(ev.addr) {
			ev.inode = m.socketInode(pid, id, int32(fd))
		}
		if !m.valid(n.id) {
			return
		}
		ev.kind = actConnect
	case callFile:
		fc, ok := m.fileEvent(pid, id, statusUmask(st), c.file, n.args)
		if !ok || !m.valid(n.id) {
			return
		}
		ev.kind, ev.file = actFile, fc
	case callExit:
		m.mu.Lock()
		p := m.known[pid]
		if p == nil || p.exited {
			m.mu.Unlock()
			return // a fork that never executed a program is not a record
		}
		p.exited = true
		p.code = int(n.args[0] & 0xff)
		m.mu.Unlock()
		ev.kind = actExit
		ev.code = p.code
		ev.cpu, ev.maxRSS = procCost(pid, st)
	}
	m.emit(ev)
}

// valid reports whether the notification id is still pending: what was
// read of the process's memory belonged to it.
func (m *monitor) valid(id uint64) bool {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(m.fd), unix.SECCOMP_IOCTL_NOTIF_ID_VALID, uintptr(unsafe.Pointer(&id)))
	return e == 0
}

// pendingExec returns the program and arguments of the command being
// forked if the exec is its first (and forgets them): a child of the
// agent that carries the new command's tag, which no other process can
// have. That exec runs in the agent's memory (a vfork child, already the
// sandbox user: the kernel lets no one read it).
func (m *monitor) pendingExec(ppid int, groups []byte) (string, []string, bool) {
	if ppid != m.self {
		return "", nil, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pendingPath == "" || !anyGroup(groups, map[uint32]bool{m.pendingTag: true}) {
		return "", nil, false
	}
	// Used once: the command's next exec in the same process (sh -c
	// execs its last program in place) can come before fork has
	// returned, and is read from the process's memory.
	path, args := m.pendingPath, boundArgs(append([]string(nil), m.pending...))
	m.pending, m.pendingPath, m.pendingTag = nil, "", 0
	return path, args, true
}

// readExec reads the program and arguments an exec asks for from the
// process's memory, as its user.
func (m *monitor) readExec(pid int, id fsID, pathp, argvp uint64, word int) (string, []string) {
	var path string
	var args []string
	err := m.as(id, func() error {
		f, err := openMem(pid)
		if err != nil {
			return err
		}
		defer f.Close()
		path = readCString(f, pathp)
		for i := range maxArgs {
			var b [8]byte
			if _, err := f.ReadAt(b[:word], int64(argvp)+int64(word*i)); err != nil {
				break
			}
			p := binary.LittleEndian.Uint64(b[:])
			if p == 0 {
				break
			}
			args = append(args, readCString(f, p))
		}
		return nil
	})
	if err != nil {
		return path, nil // not dumpable: the path alone, if even that
	}
	return path, boundArgs(args)
}

// as runs fn as the user id on the calling thread, serve's (see workers):
// only serve calls it.
func (m *monitor) as(id fsID, fn func() error) error {
	if !m.root {
		return fn() // every process is the agent's user's
	}
	if id != m.cur {
		if err := become(id); err != nil {
			m.cur = fsID{^uint32(0), ^uint32(0)} // unknown: change again next time
			return err
		}
		m.cur = id
	}
	return fn()
}

// readCString reads a NUL-terminated string at p, at most maxArgLen bytes.
func readCString(f procMem, p uint64) string { return readString(f, p, maxArgLen) }

// procMem is a process's memory (/proc/PID/mem), open. It is read with
// plain system calls, none of package os's bookkeeping: the process waits
// while the monitor reads.
type procMem int

// openMem opens the memory of process pid (see monitor.as).
func openMem(pid int) (procMem, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/mem", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	return procMem(fd), err
}

// ReadAt reads len(b) bytes at address off, or fewer where the memory ends.
func (m procMem) ReadAt(b []byte, off int64) (int, error) {
	n, err := unix.Pread(int(m), b, off)
	if n < 0 {
		n = 0
	}
	if err == nil && n < len(b) {
		err = io.EOF
	}
	return n, err
}

// Close closes it.
func (m procMem) Close() { unix.Close(int(m)) }

// readProc reads a /proc file of at most len(buf) bytes into buf.
func readProc(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return buf[:n], nil
}

// boundArgs bounds an argument list to maxArgs arguments of maxArgLen
// bytes each.
func boundArgs(args []string) []string {
	if len(args) > maxArgs {
		args = args[:maxArgs]
	}
	for i, a := range args {
		if len(a) > maxArgLen {
			args[i] = a[:maxArgLen]
		}
	}
	return args
}

// readMem reads len(b) bytes of pid's memory at p, as the user id, and
// returns how many it read.
func (m *monitor) readMem(pid int, id fsID, p uint64, b []byte) int {
	n := 0
	m.as(id, func() error {
		f, err := openMem(pid)
		if err != nil {
			return err
		}
		defer f.Close()
		n, _ = f.ReadAt(b, int64(p))
		return nil
	})
	return n
}

// parseSockaddr reads a struct sockaddr_in or sockaddr_in6.
func parseSockaddr(ev *actEvent, b []byte) bool {
	switch binary.LittleEndian.Uint16(b) {
	case unix.AF_INET:
		if len(b) < 8 {
			return false
		}
		ev.network = "ip4"
		ev.port = int(binary.BigEndian.Uint16(b[2:]))
		ev.addr = fmt.Sprintf("%d.%d.%d.%d", b[4], b[5], b[6], b[7])
		return true
	case unix.AF_INET6:
		if len(b) < 24 {
			return false
		}
		ev.network = "ip6"
		ev.port = int(binary.BigEndian.Uint16(b[2:]))
		var a [16]byte
		copy(a[:], b[8:24])
		ev.addr = ipv6String(a)
		return true
	}
	return false
}

// watchEnd learns the end of pid from a pidfd, for a process that ends
// without an exit call (a signal).
func (m *monitor) watchEnd(pid int) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		m.forget(pid)
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	go func() {
		defer f.Close()
		if rc, err := f.SyscallConn(); err == nil {
			rc.Read(func(fd uintptr) bool { // returns once readable: the process ended
				p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, _ := unix.Poll(p, 0)
				return n > 0
			})
		}
		m.mu.Lock()
		p := m.known[pid]
		delete(m.known, pid)
		closed := m.closed
		m.mu.Unlock()
		if p == nil || p.exited || closed {
			return
		}
		ev := actEvent{kind: actExit, pid: pid, ppid: p.ppid, uid: p.uid, groups: p.groups, time: time.Now(), code: -1}
		if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			if sig, ok := statSignal(st); ok {
				ev.signal = sig
			}
		}
		m.emit(ev)
	}()
}

// forget drops what is kept of pid.
func (m *monitor) forget(pid int) {
	m.mu.Lock()
	delete(m.known, pid)
	m.mu.Unlock()
}

// close stops the monitor: no more events.
func (m *monitor) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
}

// callKind is what a stopped system call means to the monitor.
type callKind uint8

const (
	callExec callKind = iota + 1
	callExecAt
	callConnect
	callSocketcall // i386: connect is socketcall(SYS_CONNECT, args)
	callExit
	callFile // creates, changes, removes or renames a file by name (see monitorCall.file)
)

// monitorCall is one system call the monitor stops: its architecture,
// number, meaning, and the size of a pointer in that convention.
type monitorCall struct {
	arch uint32
	nr   int32
	kind callKind
	word int
	file *fileArgs // callFile: where its arguments are
}

// lookupCall finds the monitorCall of a notification.
func lookupCall(arch uint32, nr int32) (monitorCall, bool) {
	for _, c := range monitorCalls {
		if c.arch == arch && c.nr == nr {
			return c, true
		}
	}
	return monitorCall{}, false
}

// monitorFilter is the seccomp program: for each architecture, the calls
// of monitorCalls return SECCOMP_RET_USER_NOTIF (an open only when its
// flags ask for a write: see writeFlags); everything else is allowed (the
// engine's own filter decides about it).
func monitorFilter() []unix.SockFilter {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	var archs []uint32
	byArch := map[uint32][]monitorCall{}
	for _, c := range monitorCalls {
		if _, ok := byArch[c.arch]; !ok {
			archs = append(archs, c.arch)
		}
		byArch[c.arch] = append(byArch[c.arch], c)
	}
	var prog []unix.SockFilter
	for _, a := range archs {
		// ld arch; jeq a (else past this block); ld nr; a jeq per call
		// (to notify, or to its flags check); allow; notify; then for
		// each call with flags: ld its flags; jset writeFlags; allow;
		// notify.
		calls := byArch[a]
		var checked []monitorCall
		for _, c := range calls {
			if c.file != nil && c.file.flags >= 0 {
				checked = append(checked, c)
			}
		}
		block := 1 + len(calls) + 2 + 4*len(checked)
		prog = append(prog,
			unix.SockFilter{Code: ld, K: 4}, // seccomp_data.arch
			unix.SockFilter{Code: jeq, K: a, Jf: uint8(block)},
			unix.SockFilter{Code: ld, K: 0}, // seccomp_data.nr
		)
		notify := len(calls) + 1 // from the first jeq
		j := 0
		for i, c := range calls {
			to := notify - i - 1
			if c.file != nil && c.file.flags >= 0 {
				to = notify + 4*j - i // its check block, past allow and notify
				j++
			}
			prog = append(prog, unix.SockFilter{Code: jeq, K: uint32(c.nr), Jt: uint8(to)})
		}
		prog = append(prog,
			unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
			unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_USER_NOTIF},
		)
		for _, c := range checked {
			prog = append(prog,
				unix.SockFilter{Code: ld, K: 16 + 8*uint32(c.file.flags)}, // seccomp_data.args[i], its low word
				unix.SockFilter{Code: jset, K: writeFlags, Jt: 1},
				unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW},
				unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_USER_NOTIF},
			)
		}
	}
	return append(prog, unix.SockFilter{Code: ret, K: unix.SECCOMP_RET_ALLOW})
}

// monitorStatus reads the parent, real user, real group and supplementary
// groups of a /proc/PID/status text (the last line of each name: see
// statusFields).
func monitorStatus(st []byte) (ppid, uid, gid int, groups []byte) {
	for line := range bytes.SplitSeq(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("PPid:")); ok {
			ppid, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		} else if v, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			uid = secondField(v)
		} else if v, ok := bytes.CutPrefix(line, []byte("Gid:")); ok {
			gid = secondField(v)
		} else if v, ok := bytes.CutPrefix(line, []byte("Groups:")); ok {
			groups = bytes.TrimSpace(v)
		}
	}
	return
}

// statusUmask reads the Umask: line of a /proc/PID/status text (022 if
// it has none).
func statusUmask(st []byte) uint32 {
	for line := range bytes.SplitSeq(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Umask:")); ok {
			if n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 32); err == nil {
				return uint32(n)
			}
		}
	}
	return 0o022
}

// secondField returns the effective ID of a Uid: or Gid: line's values.
func secondField(v []byte) int {
	f := bytes.Fields(v)
	if len(f) < 2 {
		return -1
	}
	n, _ := strconv.Atoi(string(f[1]))
	return n
}

// procCost reads the CPU time and peak memory of a live process: its
// stat's utime and stime and its status's VmHWM.
func procCost(pid int, status []byte) (time.Duration, int64) {
	var cpu time.Duration
	var buf [1024]byte // a stat line is about 300 bytes (the name at most 15)
	if st, err := readProc("/proc/"+strconv.Itoa(pid)+"/stat", buf[:]); err == nil {
		if f := statFields(st); len(f) > 12 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			cpu = time.Duration(u+s) * time.Second / clockTicks
		}
	}
	var rss int64
	for line := range bytes.SplitSeq(status, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			f := bytes.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
				rss = kb << 10
			}
		}
	}
	return cpu, rss
}

// statFields returns the fields of a /proc/PID/stat text after the
// command name (which may hold spaces and parentheses): field 3 (state)
// is index 0.
func statFields(st []byte) []string {
	i := bytes.LastIndexByte(st, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(st[i+1:]))
}

// statSignal reads the signal that ended a zombie from its stat's
// exit_code (field 52).
func statSignal(st []byte) (string, bool) {
	f := statFields(st)
	if len(f) < 50 {
		return "", false
	}
	code, err := strconv.Atoi(f[49])
	if err != nil {
		return "", false
	}
	ws := syscall.WaitStatus(code)
	if !ws.Signaled() {
		return "", false
	}
	return unix.SignalName(ws.Signal()), true
}

// ipv6String formats an IPv6 address.
func ipv6String(a [16]byte) string { return netip.AddrFrom16(a).String() }
