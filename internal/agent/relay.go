//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Relays carry TCP connections between the sandbox's loopback interface
// and the library, over the agent's stream: a sandbox with no network
// interface but loopback still reaches the library's egress proxy
// (connections to the relay port, taken by Accept requests) and serves
// the library's exposed ports (Dial requests). Nothing but the library
// decides what a relayed connection reaches.

// maxPendingAccepts bounds the Accept requests the agent holds. The
// library holds a few; a connection a sandbox program makes waits in the
// listen queue until one is there, so the sandbox cannot make the agent
// hold more relays than the library asked for.
const maxPendingAccepts = 64

// dialTimeout bounds a Dial's connect (a full listen queue).
const dialTimeout = 5 * time.Second

// lingerTimeout bounds how long a closed relay still writes what the
// library sent before the close to a program that does not read it.
const lingerTimeout = 10 * time.Second

// relay is one relayed connection. It is known from its request on, so
// that a Kill that overtakes the connection still finds it.
type relay struct {
	s   *agent // the session that asked for it
	ch  uint32
	in  *inbox  // bytes from the library, on their way to the connection
	out *window // credit for bytes from the connection

	mu     sync.Mutex
	c      *net.TCPConn // nil until connected
	left   int          // directions not yet done
	killed bool
}

// egress is the relay port and the session that serves it: the newest
// session (the one begun last) that has sent an Accept. An Accept of an
// older session than that one fails (wire.EgressTaken), and one of a
// newer session takes egress over (the previous one's pending Accepts
// fail the same way). Once the serving session ends, every connection to
// the port is accepted and reset at once, until a newer session sends an
// Accept: a connection never waits for nobody. A connection is taken from
// the listen queue only for a pending Accept (or to be reset): besides
// the pending Accepts, at most one connection is held, taken for an
// Accept withdrawn meanwhile, until the next Accept.
type egress struct {
	l *net.TCPListener

	mu      sync.Mutex
	cond    *sync.Cond
	owner   *agent       // the session serving egress; nil before the first Accept and once it ended
	last    uint64       // the order (agent.seq) of the current or last owner; 0: none yet
	pending []*relay     // the owner's Accept requests, oldest first
	held    *net.TCPConn // a connection waiting for the owner's next Accept
	noted   []noted      // connects to the port the monitor saw, oldest first (origin.go)
}

// listenRelay opens the relay port on the sandbox's loopback interface,
// before any of the sandbox's code runs.
func (in *instance) listenRelay(port int) error {
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return fmt.Errorf("relay port %d: %w", port, err)
	}
	e := &egress{l: l}
	e.cond = sync.NewCond(&e.mu)
	in.egress = e
	go e.run()
	return nil
}

// refusing reports that nobody serves egress any more (e.mu held).
func (e *egress) refusing() bool { return e.owner == nil && e.last > 0 }

// run takes connections to the relay port while there is a pending
// Accept or nobody serves egress any more, and places them.
func (e *egress) run() {
	for {
		e.mu.Lock()
		for len(e.pending) == 0 && !e.refusing() {
			e.cond.Wait()
		}
		c := e.held
		e.held = nil
		e.mu.Unlock()
		if c == nil {
			var err error
			if c, err = e.l.AcceptTCP(); err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				e.acceptFailed(err)
				continue
			}
		}
		e.place(c)
	}
}

// acceptFailed fails the oldest pending Accept with err (out of
// descriptors, say): the library asks again.
func (e *egress) acceptFailed(err error) {
	e.mu.Lock()
	var r *relay
	if len(e.pending) > 0 {
		r = e.pending[0]
		e.pending = slices.Delete(e.pending, 0, 1)
	}
	e.mu.Unlock()
	switch {
	case r == nil:
		time.Sleep(acceptPause)
	case r.isKilled():
		r.s.relayEnd(r)
	default:
		r.s.forgetRelay(r)
		r.s.fail(r.ch, fmt.Errorf("agent: accept: %w", err))
	}
}

// place gives c to the owner's oldest pending Accept that was not
// withdrawn, resets it if nobody serves egress any more, or holds it
// until the owner's next Accept.
func (e *egress) place(c *net.TCPConn) {
	for {
		e.mu.Lock()
		if len(e.pending) == 0 {
			if e.refusing() {
				e.mu.Unlock()
				reset(c)
				return
			}
			e.held = c
			e.mu.Unlock()
			return
		}
		r := e.pending[0]
		e.pending = slices.Delete(e.pending, 0, 1)
		e.mu.Unlock()
		if r.take(c) {
			r.s.relayStart(r)
			return
		}
		r.s.relayEnd(r) // withdrawn: c goes to the next
	}
}

// reset closes c with a reset: the program in the sandbox sees its
// connection refused, not a clean end.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

// withdraw removes r, whose Accept the library withdrew, from the pending
// Accepts; false if it is not pending (it has a connection, or is being
// given one).
func (e *egress) withdraw(r *relay) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := slices.Index(e.pending, r)
	if i < 0 {
		return false
	}
	e.pending = slices.Delete(e.pending, i, i+1)
	return true
}

// release lets go of egress for session a, which ended: if it served
// egress, nobody does until a newer session sends an Accept.
func (e *egress) release(a *agent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.owner != a {
		return
	}
	e.owner, e.pending = nil, nil
	e.cond.Broadcast() // run resets what it holds and what comes
}

// newRelay registers a relay for a request; nil if the channel is in use
// (the request then failed) or the session has ended.
func (a *agent) newRelay(ch uint32) *relay {
	r := &relay{s: a, ch: ch, in: newInbox(), out: newWindow(wire.RelayWindow), left: 2}
	a.mu.Lock()
	ended := a.ended
	_, dupRelay := a.relays[ch]
	_, dupProc := a.byChan[ch]
	if !dupRelay && !dupProc && !ended {
		a.relays[ch] = r
	}
	a.mu.Unlock()
	if ended {
		return nil
	}
	if dupRelay || dupProc {
		a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return nil
	}
	return r
}

// accept queues an Accept request of session a, which serves egress from
// now on unless a newer session does.
func (a *agent) accept(ch uint32) {
	e := a.egress
	if e == nil {
		a.fail(ch, errors.New("agent: no relay port (the sandbox has no network policy)"))
		return
	}
	r := a.newRelay(ch)
	if r == nil {
		return
	}
	e.mu.Lock()
	if a.seq < e.last {
		e.mu.Unlock()
		a.forgetRelay(r)
		a.fail(ch, errors.New("agent: "+wire.EgressTaken))
		return
	}
	var taken []*relay
	if e.owner != a { // a newer session takes egress over
		taken, e.pending = e.pending, nil
		e.owner, e.last = a, a.seq
	}
	full := len(e.pending) >= maxPendingAccepts
	if !full {
		e.pending = append(e.pending, r)
		e.cond.Broadcast()
	}
	e.mu.Unlock()
	for _, t := range taken {
		t.s.forgetRelay(t)
		t.s.fail(t.ch, errors.New("agent: "+wire.EgressTaken))
	}
	if full {
		a.forgetRelay(r)
		a.fail(ch, fmt.Errorf("agent: more than %d accepts pending", maxPendingAccepts))
	}
}

// dial registers a Dial request and connects in the background.
func (a *agent) dial(ch uint32, data []byte) {
	var req wire.DialRequest
	if err := json.Unmarshal(data, &req); err != nil {
		a.fail(ch, fmt.Errorf("agent: bad dial request: %w", err))
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		a.fail(ch, fmt.Errorf("agent: dial: port %d out of range", req.Port))
		return
	}
	r := a.newRelay(ch)
	if r == nil {
		return
	}
	go func() {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(req.Port)), dialTimeout)
		if err != nil {
			a.forgetRelay(r)
			a.fail(ch, fmt.Errorf("agent: %w", unwrapOp(err)))
			return
		}
		a.connected(r, c.(*net.TCPConn))
	}()
}

// unwrapOp drops the "dial tcp4 ADDR:" prefix: the library names the
// port.
func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return unwrapSyscall(oe.Err)
	}
	return err
}

// connected starts relaying c, unless the relay was killed meanwhile.
func (a *agent) connected(r *relay, c *net.TCPConn) {
	if !r.take(c) {
		c.Close()
		a.relayEnd(r)
		return
	}
	a.relayStart(r)
}

// take makes c the relay's connection; false if it was killed.
func (r *relay) take(c *net.TCPConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		return false
	}
	r.c = c
	return true
}

// relayStart starts relaying the relay's connection.
func (a *agent) relayStart(r *relay) {
	var st wire.Start // PID, ID: the process and command the connection comes from
	if a.mon != nil {
		st.PID, st.ID = a.origin(r.c)
	}
	a.sendJSON(wire.Started, r.ch, st)
	a.flush() // the library waits for it (a command's waits for company)
	go a.relayIn(r)
	go a.relayOut(r)
}

func (r *relay) isKilled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killed
}

func (a *agent) lookupRelay(ch uint32) *relay {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.relays[ch]
}

func (a *agent) forgetRelay(r *relay) {
	a.mu.Lock()
	if a.relays[r.ch] == r {
		delete(a.relays, r.ch)
	}
	a.mu.Unlock()
}

// relayInput takes a frame of the library's for a relay.
func (a *agent) relayInput(r *relay, f wire.Frame) {
	switch f.Kind {
	case wire.Stdin:
		r.in.feed(f.Data)
	case wire.CloseStdin:
		r.in.close()
	case wire.Ack:
		if n, err := wire.Count(f.Data); err == nil {
			r.out.give(int(n))
		}
	case wire.Kill:
		// As close(2) of a TCP socket: what the library wrote before
		// still goes out (for at most lingerTimeout), then the
		// connection closes; nothing more is read from it.
		r.mu.Lock()
		r.killed = true
		if r.c != nil {
			r.c.SetWriteDeadline(time.Now().Add(lingerTimeout))
		}
		r.mu.Unlock()
		r.out.close()
		r.in.close()
		a.sendJSON(wire.Killed, r.ch, wire.KillResult{})
		if a.egress != nil && a.egress.withdraw(r) {
			a.relayEnd(r) // an Accept withdrawn before a connection came
		}
	}
}

// relayIn writes the library's bytes to the connection and acknowledges
// them; the end of the input half-closes it. Once the connection refuses
// them, the rest is acknowledged and dropped.
func (a *agent) relayIn(r *relay) {
	broken := false
	for {
		b, ok := r.in.next()
		if !ok {
			break
		}
		if !broken {
			if _, err := r.c.Write(b); err != nil {
				broken = true
			}
		}
		a.ack(r.ch, len(b))
	}
	if r.isKilled() {
		r.c.Close() // also ends relayOut's read
	} else if !broken {
		r.c.CloseWrite()
	}
	a.relayDone(r)
}

// relayOut sends what the connection gives, no more than the library's
// credit allows, then the end-of-stream marker.
func (a *agent) relayOut(r *relay) {
	buf := make([]byte, 32<<10)
	for {
		n := r.out.take(len(buf))
		if n == 0 {
			break // killed
		}
		m, err := r.c.Read(buf[:n])
		if m > 0 {
			a.send(wire.Stdout, r.ch, buf[:m])
		}
		r.out.give(n - m)
		if err != nil {
			break
		}
	}
	a.send(wire.Stdout, r.ch, nil)
	a.flush() // the end of the connection's stream: its reader waits for it
	a.relayDone(r)
}

// relayDone ends the relay once both directions are done.
func (a *agent) relayDone(r *relay) {
	r.mu.Lock()
	r.left--
	done := r.left == 0
	r.mu.Unlock()
	if done {
		r.c.Close()
		a.relayEnd(r)
	}
}

// relayEnd forgets the relay and reports its end.
func (a *agent) relayEnd(r *relay) {
	a.forgetRelay(r)
	a.sendJSON(wire.Exited, r.ch, wire.Exit{Killed: r.isKilled()})
}
