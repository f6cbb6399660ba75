package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Dial connects to port on the sandbox's loopback interface through the
// agent (bounded by ctx and the Conn's timeout). The connection is a
// channel of the agent's stream: the sandbox needs no network for it.
func (c *Conn) Dial(ctx context.Context, port int) (net.Conn, error) {
	rc := c.openRelay(fmt.Sprintf("sandbox:%d", port))
	if err := c.w.WriteJSON(wire.Dial, rc.id, wire.DialRequest{Port: port}); err != nil {
		rc.forget()
		return nil, c.writeErr(err)
	}
	f, err := await(c, ctx, rc.ch.reply, "dial")
	if err != nil {
		rc.Close()
		return nil, err
	}
	if f.Kind == wire.Failed {
		rc.forget()
		return nil, &DialError{Port: port, Msg: string(f.Data)}
	}
	return rc, nil
}

// DialError is a Dial the agent could not make: nothing listens on the
// port, say.
type DialError struct {
	Port int
	Msg  string // the agent's words
}

func (e *DialError) Error() string {
	return fmt.Sprintf("agentconn: connecting to port %d in the sandbox: %s", e.Port, e.Msg)
}

// Accept waits for the next connection a program in the sandbox makes to
// the agent's relay port (bounded by ctx, not by the Conn's timeout: a
// sandbox may never connect). It fails at once if the agent has no relay
// port, and with ErrEgressTaken if a newer session of a leased agent
// serves egress (also for an Accept pending when that session came).
func (c *Conn) Accept(ctx context.Context) (net.Conn, error) {
	rc := c.openRelay("sandbox:relay")
	if err := c.w.Write(wire.Accept, rc.id, nil); err != nil {
		rc.forget()
		return nil, c.writeErr(err)
	}
	var f wire.Frame
	select {
	case f = <-rc.ch.reply:
	case <-c.done:
		select {
		case f = <-rc.ch.reply:
		default:
			rc.forget()
			return nil, c.doneErr
		}
	case <-ctx.Done():
		rc.Close() // the agent may hand it a connection meanwhile: kill that
		return nil, ctx.Err()
	}
	if f.Kind == wire.Failed {
		rc.forget()
		if strings.Contains(string(f.Data), wire.EgressTaken) {
			return nil, ErrEgressTaken
		}
		return nil, errors.New(string(f.Data))
	}
	var st wire.Start
	if json.Unmarshal(f.Data, &st) == nil {
		rc.pid, rc.cmd = st.PID, st.ID
	}
	return rc, nil
}

// Origin returns the process in the sandbox that made a connection
// Accept returned, and the ID of the command it belongs to, as the agent
// found them (see the agent's origin.go); 0 and "" when unknown.
func Origin(c net.Conn) (pid int, cmd string) {
	for {
		switch v := c.(type) {
		case *relayConn:
			return v.pid, v.cmd
		case interface{ Unwrap() net.Conn }:
			c = v.Unwrap()
		default:
			return 0, ""
		}
	}
}

// relayConn is a relayed connection: a net.Conn whose bytes travel as a
// channel of the agent's stream, RelayWindow ahead in each direction.
type relayConn struct {
	c    *Conn
	id   uint32
	ch   *channel
	addr relayAddr
	pid  int    // Accept's: the process that made the connection (Origin)
	cmd  string // and its command's ID

	rd, wd    *deadline
	closeOnce sync.Once
	shutOnce  sync.Once
}

func (c *Conn) openRelay(addr string) *relayConn {
	ch := &channel{reply: make(chan wire.Frame, 1), exited: make(chan struct{}), killed: make(chan wire.KillResult, 1)}
	c.mu.Lock()
	c.next++
	id := c.next
	ack := func(n int) { c.w.WriteCount(wire.Ack, id, uint32(n)) }
	ch.out = [2]*stream{newStream(ack, wire.RelayWindow), nil}
	ch.stdin = newCredit(wire.RelayWindow)
	c.chans[id] = ch
	c.mu.Unlock()
	return &relayConn{c: c, id: id, ch: ch, addr: relayAddr(addr), rd: newDeadline(), wd: newDeadline()}
}

// forget drops the channel without telling the agent (it holds nothing).
func (r *relayConn) forget() {
	r.closeOnce.Do(func() {
		r.c.release(r.id)
		r.ch.out[0].end(net.ErrClosed)
		r.ch.stdin.end()
	})
}

func (r *relayConn) Read(p []byte) (int, error) {
	s := r.ch.out[0]
	for {
		if n, ok, err := s.tryRead(p); ok {
			return n, err
		}
		select {
		case <-s.wake:
		case <-r.rd.wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
}

func (r *relayConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		n, ok, settled := r.ch.stdin.tryTake(min(len(p)-done, wire.MaxData))
		if !settled { // no credit yet: wait for some, or for the deadline
			select {
			case <-r.ch.stdin.wake:
				continue
			case <-r.wd.wait():
				return done, os.ErrDeadlineExceeded
			}
		}
		if !ok {
			if err := r.c.Err(); err != nil {
				return done, err
			}
			return done, net.ErrClosed
		}
		if err := r.c.w.Write(wire.Stdin, r.id, p[done:done+n]); err != nil {
			return done, r.c.writeErr(err)
		}
		done += n
	}
	return done, nil
}

// CloseWrite half-closes the connection: the program in the sandbox reads
// its end.
func (r *relayConn) CloseWrite() error {
	var err error
	r.shutOnce.Do(func() {
		if e := r.c.w.Write(wire.CloseStdin, r.id, nil); e != nil {
			err = r.c.writeErr(e)
		}
	})
	return err
}

// Close closes the connection in the sandbox too, without waiting.
func (r *relayConn) Close() error {
	r.closeOnce.Do(func() {
		r.c.w.Write(wire.Kill, r.id, nil)
		r.c.release(r.id)
		r.ch.out[0].end(net.ErrClosed)
		r.ch.stdin.end()
	})
	return nil
}

func (r *relayConn) LocalAddr() net.Addr  { return relayAddr("library") }
func (r *relayConn) RemoteAddr() net.Addr { return r.addr }

func (r *relayConn) SetDeadline(t time.Time) error {
	r.rd.set(t)
	r.wd.set(t)
	return nil
}
func (r *relayConn) SetReadDeadline(t time.Time) error  { r.rd.set(t); return nil }
func (r *relayConn) SetWriteDeadline(t time.Time) error { r.wd.set(t); return nil }

// relayAddr names the ends of a relayed connection.
type relayAddr string

func (a relayAddr) Network() string { return "agent-relay" }
func (a relayAddr) String() string  { return string(a) }

// deadline is a settable deadline whose passing closes a channel, as
// net.Pipe has.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
}

func newDeadline() *deadline { return &deadline{cancel: make(chan struct{})} }

// set sets the deadline; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer's function ran: wait for the close
	}
	d.timer = nil
	if isClosed(d.cancel) {
		d.cancel = make(chan struct{})
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.cancel)
		return
	}
	cancel := d.cancel
	d.timer = time.AfterFunc(dur, func() { close(cancel) })
}

// wait returns a channel closed once the deadline has passed.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Listen returns a listener of the connections programs in the sandbox
// make to the agent's relay port, with pending Accept requests always
// waiting at the agent. Its Accept fails once the stream to the agent has
// ended or the listener is closed, and with ErrEgressTaken once a newer
// session of a leased agent serves egress (it then asks no more).
func (c *Conn) Listen(pending int) net.Listener {
	ctx, cancel := context.WithCancel(context.Background())
	l := &relayListener{c: c, conns: make(chan net.Conn), ctx: ctx, cancel: cancel, taken: make(chan struct{})}
	for range pending {
		l.wg.Go(l.loop)
	}
	return l
}

type relayListener struct {
	c         *Conn
	conns     chan net.Conn
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	taken     chan struct{} // closed once the agent said ErrEgressTaken
	takenOnce sync.Once
}

// acceptRetry paces Accept requests the agent refused.
const acceptRetry = 100 * time.Millisecond

func (l *relayListener) loop() {
	for {
		conn, err := l.c.Accept(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil || l.c.Err() != nil {
				return
			}
			if errors.Is(err, ErrEgressTaken) { // every loop stops asking
				l.takenOnce.Do(func() { close(l.taken) })
				return
			}
			select { // the agent could not accept (out of descriptors, say)
			case <-time.After(acceptRetry):
				continue
			case <-l.ctx.Done():
				return
			}
		}
		select {
		case l.conns <- conn:
		case <-l.ctx.Done():
			conn.Close()
			return
		}
	}
}

func (l *relayListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	case <-l.c.Done():
		return nil, l.c.Err()
	case <-l.taken:
		select { // a connection taken before still goes out
		case c := <-l.conns:
			return c, nil
		default:
			return nil, ErrEgressTaken
		}
	}
}

// Close stops taking connections (those taken stay open).
func (l *relayListener) Close() error {
	l.cancel()
	l.wg.Wait()
	return nil
}

func (l *relayListener) Addr() net.Addr { return relayAddr("sandbox:relay") }
