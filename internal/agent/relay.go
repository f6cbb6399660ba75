//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
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
	ch  uint32
	in  *inbox  // bytes from the library, on their way to the connection
	out *window // credit for bytes from the connection

	mu     sync.Mutex
	c      *net.TCPConn // nil until connected
	left   int          // directions not yet done
	killed bool
}

// listenRelay opens the relay port on the sandbox's loopback interface,
// before any of the sandbox's code runs.
func (a *agent) listenRelay(port int) error {
	l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return fmt.Errorf("relay port %d: %w", port, err)
	}
	a.accepts = make(chan *relay, maxPendingAccepts)
	go a.acceptRelays(l)
	return nil
}

// acceptRelays pairs each connection to the relay port with the next
// Accept request that was not withdrawn.
func (a *agent) acceptRelays(l *net.TCPListener) {
	for r := range a.accepts {
		if r.isKilled() {
			a.relayEnd(r)
			continue
		}
		c, err := l.AcceptTCP()
		if err != nil {
			a.forgetRelay(r)
			a.fail(r.ch, fmt.Errorf("agent: accept: %w", err))
			continue
		}
		// An Accept withdrawn while the connection was awaited: the
		// connection goes to the next Accept, not to nobody.
		for r.isKilled() {
			a.relayEnd(r)
			next, ok := <-a.accepts
			if !ok {
				c.Close()
				return
			}
			r = next
		}
		a.connected(r, c)
	}
}

// newRelay registers a relay for a request; nil if the channel is in use
// (the request then failed).
func (a *agent) newRelay(ch uint32) *relay {
	r := &relay{ch: ch, in: newInbox(), out: newWindow(wire.RelayWindow), left: 2}
	a.mu.Lock()
	_, dupRelay := a.relays[ch]
	_, dupProc := a.byChan[ch]
	if !dupRelay && !dupProc {
		a.relays[ch] = r
	}
	a.mu.Unlock()
	if dupRelay || dupProc {
		a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return nil
	}
	return r
}

// accept queues an Accept request.
func (a *agent) accept(ch uint32) {
	if a.accepts == nil {
		a.fail(ch, errors.New("agent: no relay port (the sandbox has no network policy)"))
		return
	}
	r := a.newRelay(ch)
	if r == nil {
		return
	}
	select {
	case a.accepts <- r:
	default:
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
	r.mu.Lock()
	killed := r.killed
	if !killed {
		r.c = c
	}
	r.mu.Unlock()
	if killed {
		c.Close()
		a.relayEnd(r)
		return
	}
	a.sendJSON(wire.Started, r.ch, wire.Start{})
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
