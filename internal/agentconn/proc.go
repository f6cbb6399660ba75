package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Proc is a command running in the sandbox.
type Proc struct {
	c  *Conn
	id uint32
	ch *channel

	PID    int       // in the sandbox's PID namespace; 0 for a command not found
	ID     string    // the agent's name for the command (wire.Start.ID)
	Replay int64     // after an Attach: how many of Stdout's first bytes are kept output replayed (wire.Start.Replay)
	Stdout io.Reader // the command's output, read as it comes; io.EOF at its end
	Stderr io.Reader
}

// Exec starts a command and waits (bounded by ctx and the Conn's timeout)
// for the agent to say it runs. A command that is not found runs too: it
// writes why on its stderr and exits 127, as in a shell.
func (c *Conn) Exec(ctx context.Context, req wire.ExecRequest) (*Proc, error) {
	return c.begin(ctx, wire.Exec, req, req.Stdin, "exec")
}

// Attach attaches to the command named id (wire.AttachRequest) and waits,
// as Exec does, for the agent's answer. The Proc then replays the output
// the agent kept and goes on live; its Stdin writes to the command's
// stdin if stdin.
func (c *Conn) Attach(ctx context.Context, id string, stdin bool) (*Proc, error) {
	return c.begin(ctx, wire.Attach, wire.AttachRequest{ID: id}, stdin, "attach")
}

// ErrTaken ends the output of a command that another session attached
// (wire.Taken).
var ErrTaken = errors.New("agentconn: another session attached the command")

func (c *Conn) begin(ctx context.Context, kind wire.Kind, req any, stdin bool, what string) (*Proc, error) {
	ch := &channel{reply: make(chan wire.Frame, 1), exited: make(chan struct{}), killed: make(chan wire.KillResult, 1), taken: make(chan struct{}), actsIn: make(chan struct{}, 1)}
	c.mu.Lock()
	c.next++
	id := c.next
	ack := func(n int) { c.w.WriteCount(wire.Ack, id, uint32(n)) }
	ch.out = [2]*stream{newStream(ack, wire.Window), newStream(ack, wire.Window)}
	if stdin {
		ch.stdin = newCredit(wire.Window)
	}
	c.chans[id] = ch
	c.mu.Unlock()
	p := &Proc{c: c, id: id, ch: ch, Stdout: ch.out[0], Stderr: ch.out[1]}
	if err := c.w.WriteJSON(kind, id, req); err != nil {
		p.Close()
		return nil, c.writeErr(err)
	}
	f, err := await(c, ctx, ch.reply, what)
	if err != nil {
		if kind == wire.Exec {
			// It may have started after all: make sure it does not run on.
			c.w.Write(wire.Kill, id, nil)
		}
		p.Close()
		return nil, err
	}
	if f.Kind == wire.Failed {
		p.Close()
		return nil, errors.New(string(f.Data))
	}
	var st wire.Start
	json.Unmarshal(f.Data, &st)
	p.PID, p.ID, p.Replay = st.PID, st.ID, st.Replay
	return p, nil
}

// Taken is closed when another session attached the command: its output
// ends here with ErrTaken and no exit will come.
func (p *Proc) Taken() <-chan struct{} { return p.ch.taken }

// List lists the commands of the instance (wire.List).
func (c *Conn) List(ctx context.Context) ([]wire.Session, error) {
	return ask[[]wire.Session](c, ctx, wire.List, nil, wire.SessionList, "list")
}

// Resize sets the size of a PTY command's terminal (see wire.Resize): the
// frame is sent, and nothing is answered.
func (p *Proc) Resize(rows, cols uint16) error {
	if err := p.c.w.WriteJSON(wire.Resize, p.id, wire.ResizeRequest{Rows: rows, Cols: cols}); err != nil {
		return p.c.writeErr(err)
	}
	return nil
}

// Stdin returns the writer to the command's stdin (nil if the request had
// no Stdin). A Write blocks while the agent holds a window of bytes the
// command has not read yet; Close ends the command's stdin.
func (p *Proc) Stdin() io.WriteCloser {
	if p.ch.stdin == nil {
		return nil
	}
	return stdinWriter{p}
}

type stdinWriter struct{ p *Proc }

func (w stdinWriter) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, ok := w.p.ch.stdin.take(min(len(b)-done, wire.MaxData))
		if !ok {
			return done, io.ErrClosedPipe
		}
		if err := w.p.c.w.Write(wire.Stdin, w.p.id, b[done:done+n]); err != nil {
			return done, w.p.c.writeErr(err)
		}
		done += n
	}
	return done, nil
}

func (w stdinWriter) Close() error {
	if err := w.p.c.w.Write(wire.CloseStdin, w.p.id, nil); err != nil {
		return w.p.c.writeErr(err)
	}
	return nil
}

// Exited is closed when the command has exited (its output may still be
// coming: a process it left behind may hold it open); Exit then says how.
func (p *Proc) Exited() <-chan struct{} { return p.ch.exited }

// Exit returns how the command ended, once Exited is closed.
func (p *Proc) Exit() wire.Exit {
	<-p.ch.exited
	return p.ch.exit
}

// Activity returns the command's activity record, once Exited is closed.
func (p *Proc) Activity() []wire.Act {
	<-p.ch.exited
	return p.ActivityFrom(0)
}

// ActivityIn receives a token when activity events arrive (the agent
// sends them as they happen); ActivityFrom then returns them.
func (p *Proc) ActivityIn() <-chan struct{} { return p.ch.actsIn }

// ActivityLen returns how many activity events were received so far.
func (p *Proc) ActivityLen() int {
	p.ch.actsMu.Lock()
	defer p.ch.actsMu.Unlock()
	return len(p.ch.acts)
}

// ActivityFrom returns the events of the command's activity record
// received so far, from the i-th on.
func (p *Proc) ActivityFrom(i int) []wire.Act {
	p.ch.actsMu.Lock()
	defer p.ch.actsMu.Unlock()
	if i >= len(p.ch.acts) {
		return nil
	}
	return slices.Clone(p.ch.acts[i:])
}

// Wait waits for the command to exit, for the stream to the agent to end
// (ErrGone), or for ctx.
func (p *Proc) Wait(ctx context.Context) (wire.Exit, error) {
	select {
	case <-p.ch.exited:
		return p.ch.exit, nil
	case <-p.c.done:
		select {
		case <-p.ch.exited:
			return p.ch.exit, nil
		default:
		}
		return wire.Exit{}, p.c.doneErr
	case <-ctx.Done():
		return wire.Exit{}, ctx.Err()
	}
}

// Kill kills every process the command started, wherever it went, and
// returns when none is left (bounded by ctx and the Conn's timeout).
func (p *Proc) Kill(ctx context.Context) (wire.KillResult, error) {
	select {
	case <-p.ch.killed: // a result from an earlier Kill
	default:
	}
	if err := p.c.w.Write(wire.Kill, p.id, nil); err != nil {
		return wire.KillResult{}, p.c.writeErr(err)
	}
	return await(p.c, ctx, p.ch.killed, "kill")
}

// Close forgets the command: its output streams end (reads return
// io.ErrClosedPipe once what arrived is read), and later frames for it are
// dropped. Call it once its output is read and Wait returned.
func (p *Proc) Close() {
	p.c.release(p.id)
	for _, s := range p.ch.out {
		s.end(io.ErrClosedPipe)
	}
	if p.ch.stdin != nil {
		p.ch.stdin.end()
	}
}

// stream is output received and not yet read.
type stream struct {
	mu      sync.Mutex
	bufs    [][]byte // frames' payloads, not yet read (owned: ReadFrame allocates each)
	held    int      // bytes in bufs: never more than the window the agent was given
	unacked int      // bytes read and not yet acknowledged: less than ackEvery
	err     error
	wake    chan struct{}
	ack     func(n int)
	window  int // most bytes the agent may send ahead of acknowledgements
}

// A stream acknowledges what was read once it is a quarter of its window,
// so that the agent never runs out of credit while the reader keeps up,
// and a command's short output costs no acknowledgement (each is a write
// through the engine's relays).
func newStream(ack func(int), window int) *stream {
	return &stream{wake: make(chan struct{}, 1), ack: ack, window: window}
}

// ErrWindow ends a stream whose agent sent more output than the window
// it was given: what it sent is dropped, so host memory stays bounded
// whatever the other side does.
var ErrWindow = errors.New("agentconn: the agent sent more output than its window")

func (s *stream) add(b []byte) {
	s.mu.Lock()
	switch {
	case s.err != nil:
	case s.held+len(b) > s.window:
		s.err, s.bufs, s.held = ErrWindow, nil, 0
	default:
		s.bufs = append(s.bufs, b)
		s.held += len(b)
	}
	s.mu.Unlock()
	s.notify()
}

func (s *stream) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.notify()
}

func (s *stream) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stream) Read(p []byte) (int, error) {
	for {
		if n, ok, err := s.tryRead(p); ok {
			return n, err
		}
		<-s.wake
	}
}

// tryRead reads what has arrived, or the stream's end; ok is false if
// there is neither yet.
func (s *stream) tryRead(p []byte) (n int, ok bool, err error) {
	s.mu.Lock()
	if len(s.bufs) > 0 {
		n := copy(p, s.bufs[0])
		s.held -= n
		if s.bufs[0] = s.bufs[0][n:]; len(s.bufs[0]) == 0 {
			s.bufs[0] = nil
			s.bufs = s.bufs[1:]
		}
		ack := 0
		if s.err == nil {
			if s.unacked += n; s.unacked >= s.window/4 {
				ack, s.unacked = s.unacked, 0
			}
		}
		s.mu.Unlock()
		if ack > 0 {
			s.ack(ack)
		}
		return n, true, nil
	}
	err = s.err
	s.mu.Unlock()
	return 0, err != nil, err
}

// credit is the input bytes the agent may still take.
type credit struct {
	mu    sync.Mutex
	avail int
	ended bool
	wake  chan struct{}
}

func newCredit(n int) *credit { return &credit{avail: n, wake: make(chan struct{}, 1)} }

func (c *credit) take(max int) (int, bool) {
	for {
		if n, ok, done := c.tryTake(max); done {
			return n, ok
		}
		<-c.wake
	}
}

// tryTake takes up to max bytes of credit; done is false if there is none
// and the credit has not ended.
func (c *credit) tryTake(max int) (n int, ok, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.ended:
		return 0, false, true
	case c.avail > 0:
		n = min(max, c.avail)
		c.avail -= n
		return n, true, true
	}
	return 0, false, false
}

func (c *credit) give(n int) {
	c.mu.Lock()
	c.avail += n
	c.mu.Unlock()
	c.notify()
}

func (c *credit) end() {
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
	c.notify()
}

func (c *credit) notify() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (p *Proc) String() string { return fmt.Sprintf("agent command #%d (pid %d)", p.id, p.PID) }
