//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// freezeWait bounds how long freeze tries to get every process stopped
// (processes may resume each other, and one in an uninterruptible sleep
// stops only when it wakes).
const freezeWait = 2 * time.Second

// The cgroup freezer would stop a whole cgroup at once, but the agent
// cannot use it: it shares the sandbox's cgroup (it would stop itself),
// and the cgroup filesystem is read-only in the container, which has no
// CAP_SYS_ADMIN. So the freeze stops processes one by one with SIGSTOP,
// and proves afterwards that none ran: see freezer.

// freezer stops every process of the sandbox but the agent and those it
// must keep running (the relays that carry the sessions' frames), and
// resumes those it stopped. A process stopped by its user
// before the freeze came is left as it was.
//
// Stopping one process at a time cannot by itself keep the processes
// stopped: one still running may resume one already stopped (SIGCONT),
// and a POSIX timer or an I/O signal can deliver SIGCONT to a stopped
// process with nothing of the sandbox running. So every scan of /proc
// stops again every task found not stopped, until a whole scan finds all
// stopped; then, before and after the files are read, the freeze takes a
// mark of every task (its state, its context switches, CPU time and start
// time): a task that ran in between has switched out at least once or is
// running still, so a mark that changed, a task gone or a new one proves
// the files were read while something ran (errNotStill).
type freezer struct {
	self    int
	keep    map[int]bool // never stopped (the relays)
	relay   uint32       // the relays' user: processes of it are never stopped either (where the kernel gave no relay's process ID)
	stopped map[int]bool // processes this freeze signalled
	order   []int        // the same, in order, for thaw
	buf     []byte
}

func newFreezer(self int, keep []int, relay uint32) *freezer {
	z := &freezer{self: self, keep: map[int]bool{}, relay: relay, stopped: map[int]bool{}, buf: make([]byte, 8<<10)}
	for _, p := range keep {
		z.keep[p] = true
	}
	return z
}

// mark is what the freeze records of one task (thread).
type mark struct {
	pid      int // its process
	state    byte
	switches uint64 // voluntary and involuntary context switches
	cpu      uint64 // utime + stime, clock ticks
	start    uint64 // start time, clock ticks since boot
	comm     string
	uid      int64 // real user, -1 if unread
}

// stoppedState reports a task that does not run: stopped by a signal (T)
// or by its tracer (t).
func stoppedState(s byte) bool { return s == 'T' || s == 't' }

// deadState reports a task that will never run again.
func deadState(s byte) bool { return s == 'Z' || s == 'X' || s == 'x' }

// errNotStill is the error of a freeze that could not keep the sandbox's
// processes stopped; the library retries the capture a few times.
func errNotStill(format string, args ...any) error {
	return coded{wire.CodeNotStill, fmt.Sprintf(format, args...)}
}

// freeze stops every process and returns the marks of every task once a
// full scan finds all of them stopped. It gives up after freezeWait with
// errNotStill naming a process still running; tasks in an uninterruptible
// sleep (D: a vfork parent whose child is stopped, a disk wait) are then
// taken as they are, since they run no code of their own and the marks
// show whether they woke. Processes it stopped are resumed by thaw, also
// when it fails.
func (z *freezer) freeze() (map[int]mark, error) {
	deadline := time.Now().Add(freezeWait)
	for round := 0; ; round++ {
		marks, running := z.scan(true)
		if running == nil {
			return marks, nil
		}
		if time.Now().After(deadline) {
			if running.state == 'D' {
				if marks, running = z.scan(false); running == nil || running.state == 'D' {
					return marks, nil
				}
			}
			return nil, errNotStill("process %d (%q) still not stopped after %v (state %c)",
				running.pid, running.comm, freezeWait, running.state)
		}
		// The signals take effect in microseconds; a process in a system
		// call stops on its way out of it.
		if round < 20 {
			time.Sleep(100 * time.Microsecond)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

// scan reads every task of every process but self and those kept, and
// with stop sends SIGSTOP to every process with a task not stopped. It
// returns the marks of the live tasks and the first task found running
// (nil if none; one in D is returned only if nothing else runs).
func (z *freezer) scan(stop bool) (map[int]mark, *mark) {
	marks := map[int]mark{}
	var running, sleeping *mark
	for _, pid := range pids(z.self) {
		if z.keep[pid] {
			continue
		}
		signalled := false
		for _, tid := range tids(pid) {
			m, ok := z.read(pid, tid)
			if ok && m.uid == int64(z.relay) {
				break // a relay, whose process ID the kernel did not give
			}
			if !ok || deadState(m.state) {
				continue
			}
			marks[tid] = m
			if stoppedState(m.state) {
				continue
			}
			if m.state == 'D' {
				if sleeping == nil {
					sleeping = &m
				}
			} else if running == nil {
				running = &m
			}
			if stop && !signalled && syscall.Kill(pid, syscall.SIGSTOP) == nil {
				signalled = true
				if !z.stopped[pid] {
					z.stopped[pid] = true
					z.order = append(z.order, pid)
				}
			}
		}
	}
	if running == nil {
		running = sleeping
	}
	return marks, running
}

// read takes the mark of task tid of process pid.
func (z *freezer) read(pid, tid int) (mark, bool) {
	m := mark{pid: pid, uid: -1}
	dir := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid)
	st, ok := readFile(dir+"/stat", z.buf)
	if !ok {
		return m, false
	}
	// pid (comm) state ppid ...: comm may hold anything, so the fields
	// start after its last ')'.
	i := bytes.LastIndexByte(st, ')')
	j := bytes.IndexByte(st, '(')
	if i < 0 || j < 0 || j > i {
		return m, false
	}
	m.comm = string(st[j+1 : i])
	f := bytes.Fields(st[i+1:])
	// Fields from 3 (state) on: utime is field 14, stime 15, starttime 22.
	if len(f) < 20 || len(f[0]) == 0 {
		return m, false
	}
	m.state = f[0][0]
	utime, _ := strconv.ParseUint(string(f[11]), 10, 64)
	stime, _ := strconv.ParseUint(string(f[12]), 10, 64)
	m.cpu = utime + stime
	m.start, _ = strconv.ParseUint(string(f[19]), 10, 64)
	status, ok := readFile(dir+"/status", z.buf)
	if !ok {
		return m, false
	}
	for line := range bytes.SplitSeq(status, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("voluntary_ctxt_switches:")); ok {
			n, _ := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			m.switches += n
		} else if v, ok := bytes.CutPrefix(line, []byte("nonvoluntary_ctxt_switches:")); ok {
			n, _ := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			m.switches += n
		} else if v, ok := bytes.CutPrefix(line, []byte("Uid:")); ok {
			if f := bytes.Fields(v); len(f) > 0 {
				if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil {
					m.uid = n
				}
			}
		}
	}
	return m, true
}

// still compares the marks taken when the freeze began with the tasks now:
// nil if none of them ran meanwhile and none came or went.
func (z *freezer) still(before map[int]mark) error {
	now, _ := z.scan(false)
	for tid, b := range before {
		n, ok := now[tid]
		switch {
		case !ok || n.start != b.start:
			return errNotStill("process %d (%q) ended while the files were read", b.pid, b.comm)
		case n.state != b.state || n.switches != b.switches || n.cpu != b.cpu:
			return errNotStill("process %d (%q) ran while the files were read (state %c, was %c)", n.pid, n.comm, n.state, b.state)
		}
	}
	for tid, n := range now {
		if _, ok := before[tid]; !ok {
			return errNotStill("process %d (%q) started while the files were read", n.pid, n.comm)
		}
	}
	return nil
}

// thaw resumes the processes the freeze stopped.
func (z *freezer) thaw() {
	for _, pid := range z.order {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// tids returns the tasks (threads) of process pid.
func tids(pid int) []int { return numbered("/proc/" + strconv.Itoa(pid) + "/task") }

// readFile reads at most len(buf) bytes of a /proc file.
func readFile(name string, buf []byte) ([]byte, bool) {
	f, err := os.Open(name)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	n, err := f.Read(buf)
	if err != nil {
		return nil, false
	}
	return buf[:n], true
}

// capture stops every other process of the sandbox (but those in keep),
// writes a tar archive of directory p's contents to out (see
// writeTarContents), proves that none of them ran meanwhile, and resumes
// them, also when the archive fails or the library aborts it. A capture
// during which a process ran fails with errNotStill, whatever else went
// wrong (a file renamed under the walk is the process's doing).
func (a *agent) capture(id fsID, p string, limit int64, out *opOutput) (*skipped, error) {
	a.freezing.Lock()
	defer a.freezing.Unlock()
	a.mu.Lock()
	keep := slices.Clone(a.keep) // every session's relay
	a.mu.Unlock()
	z := newFreezer(os.Getpid(), keep, a.relayUID)
	defer z.thaw()
	before, err := z.freeze()
	if err != nil {
		return nil, err
	}
	var sk *skipped
	werr := a.fs.as(id, func() error {
		var err error
		sk, err = writeTarContents(out, p, limit, id.uid)
		return err
	})
	if errors.Is(werr, errAborted) {
		return nil, werr
	}
	if err := z.still(before); err != nil {
		return nil, err
	}
	return sk, werr
}
