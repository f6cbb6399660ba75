//go:build linux

package main

// A leased instance (agent -listen=PATH -lease=D) outlives the process
// that made it: the agent ignores its standard input and serves every
// connection to its socket as a session of its own, at once, each with
// the whole protocol and its own channels, until no session has renewed
// the lease for D. A session is one process of the library's (through an
// exec'd `agent -connect`, which proves itself: see relayProof; a command,
// even root's, cannot); its end kills the commands it started and
// ends its file operations and relayed connections, and leaves the other
// sessions as they were. Egress is served by one session: see egress in
// relay.go.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// maxSessions bounds the sessions served at once; a connection beyond
// them is closed at once.
const maxSessions = 64

// acceptPause paces a listener that fails (out of descriptors).
const acceptPause = 10 * time.Millisecond

// runLeased runs a leased instance: it starts the lease of length d (its
// first renewal is now) and the reaper, and serves sessions on l. It
// returns only if l fails for good.
func (in *instance) runLeased(l *net.UnixListener, d time.Duration) error {
	in.mu.Lock()
	in.owners, in.pruneAt = map[uint32]*agent{}, pruneFloor
	in.mu.Unlock()
	in.lease = startLease(d, in.expire)
	in.startReaper()
	return in.serveSessions(l)
}

// serveSessions serves every connection to l from the library's relay
// (see relayProof; with in.execOnly, also one the kernel names as exec'd
// by the engine, where it names it: see execd) as a session, for the
// agent's life. It returns only if l fails for good.
func (in *instance) serveSessions(l *net.UnixListener) error {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			time.Sleep(acceptPause)
			continue
		}
		in.mu.Lock()
		admitted := in.sessions < maxSessions && !in.over
		if admitted {
			in.sessions++
			in.seq++ // in the order accepted: see egress
		}
		seq := in.seq
		in.mu.Unlock()
		if !admitted {
			c.Close()
			continue
		}
		go in.session(c, seq)
	}
}

// session serves the library on c as session number seq, once the relay
// proved itself, until c ends; then it ends the session.
func (in *instance) session(c *net.UnixConn, seq uint64) {
	relayPID, err := relayProof(c, in.relayUID)
	if err == nil && in.execOnly && relayPID > 0 && !execd(relayPID) {
		err = errNotRelay
	}
	if err != nil {
		c.Close()
		in.mu.Lock()
		in.sessions--
		in.mu.Unlock()
		return
	}
	c.SetReadBuffer(1 << 20)
	c.SetWriteBuffer(1 << 20)
	broken := func() { c.Close() } // the read ends, and the session with it
	b := newSessionBatcher(c, broken)
	a := in.newSessionAt(seq, b, relayPID, broken)
	a.sendJSON(wire.Hello, 0, in.greeting)
	a.serve(bufio.NewReaderSize(c, 64<<10))
	c.Close()
	a.end()
	b.stop()
}

// end ends a session of a leased instance: it kills every command the
// session started (every process that carries one of its tags), ends its
// file operations and relayed connections, and lets go of egress and of
// its relay's place in the keep list. Other sessions go on.
func (a *agent) end() {
	a.mu.Lock()
	a.ended = true
	a.sessions--
	if i := slices.Index(a.keep, a.relayPID); a.relayPID > 0 && i >= 0 {
		a.keep = slices.Delete(a.keep, i, i+1)
	}
	tags := map[uint32]bool{}
	for t, s := range a.owners {
		if s == a {
			tags[t] = true
			delete(a.owners, t)
		}
	}
	var procs, kept []*proc
	for _, p := range a.byChan {
		if p.keep && p.running() {
			kept = append(kept, p)
			continue
		}
		procs = append(procs, p)
		tags[p.tag] = true
	}
	for _, p := range kept {
		delete(tags, p.tag) // it runs on, with what it started
	}
	var ops []*fileOp
	for _, op := range a.files {
		ops = append(ops, op)
	}
	var relays []*relay
	for _, r := range a.relays {
		relays = append(relays, r)
	}
	var watches []*dirWatch
	for _, w := range a.watches {
		watches = append(watches, w)
	}
	a.mu.Unlock()
	for _, w := range watches {
		w.stop()
	}
	if a.egress != nil {
		a.egress.release(a)
	}
	// Commands started to outlive their session run on, detached (unless
	// another session attached them meanwhile).
	for _, p := range kept {
		p.mu.Lock()
		if p.s == a {
			p.detachLocked()
		}
		p.mu.Unlock()
	}
	for _, p := range procs {
		p.mu.Lock()
		p.killed = true
		p.mu.Unlock()
	}
	if len(tags) > 0 {
		killTags(tags, os.Getpid())
	}
	for _, p := range procs {
		p.closeWindow(a) // the pumps end: nobody takes the output
		if p.stdin != nil {
			p.stdin.close()
		}
	}
	for _, op := range ops {
		a.abortFile(op)
	}
	for _, r := range relays {
		r.mu.Lock()
		r.killed = true
		c := r.c
		r.mu.Unlock()
		r.out.close()
		r.in.close()
		if c != nil {
			c.Close()
		}
	}
}

// execd reports whether process pid was started from outside the
// sandbox: exec'd by the engine, as the library's relay (agent -connect)
// is, its parent is outside the container's PID namespace, which the
// kernel shows as PPid 0. A command's processes all descend from the agent
// (PID 1). (Beside relayProof, which alone holds where the kernel gives no
// process ID.)
func execd(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, ok := readStatus(pid, make([]byte, 8<<10))
	if !ok {
		return false
	}
	ppid := -1
	for line := range bytes.SplitSeq(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("PPid:")); ok {
			if n, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil {
				ppid = n
			}
		}
	}
	return ppid == 0
}

// lease is a leased instance's deadline: the last renewal (or the start)
// plus its length. Its timer ends the instance once the deadline passes.
type lease struct {
	d   time.Duration
	end func() // ends the instance

	mu       sync.Mutex
	deadline time.Time
	t        *time.Timer
}

// startLease starts a lease of d; end runs once no renewal came for d.
func startLease(d time.Duration, end func()) *lease {
	l := &lease{d: d, end: end, deadline: time.Now().Add(d)}
	l.mu.Lock()
	l.t = time.AfterFunc(d, l.check)
	l.mu.Unlock()
	return l
}

// check ends the instance if the deadline has passed, or waits again
// until it.
func (l *lease) check() {
	l.mu.Lock()
	left := time.Until(l.deadline)
	if left > 0 {
		l.t.Reset(left)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.end()
}

// query returns the lease, renewed first if renew. A nil lease (a
// tethered instance) says it is not leased.
func (l *lease) query(renew bool) wire.LeaseInfo {
	if l == nil {
		return wire.LeaseInfo{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if renew {
		l.deadline = now.Add(l.d)
	}
	return wire.LeaseInfo{Leased: true, Lease: l.d, Left: max(0, l.deadline.Sub(now))}
}

// expire ends a leased instance whose lease ran out: it says so on
// stderr, kills every command of every session and exits, which (as PID 1)
// ends the container.
func (in *instance) expire() {
	fmt.Fprintf(os.Stderr, "agent: lease ended: no renewal for %v\n", in.lease.d)
	in.killAll()
	os.Exit(0)
}

// killAll kills every command of every session, and lets none start any
// more.
func (in *instance) killAll() {
	in.mu.Lock()
	in.over = true
	tags := map[uint32]bool{}
	for t := range in.owners {
		tags[t] = true
	}
	for _, p := range in.byPID {
		tags[p.tag] = true
	}
	in.mu.Unlock()
	if len(tags) > 0 {
		killTags(tags, os.Getpid())
	}
}
