// Package agentconn is the library's side of the conversation with the
// agent inside a sandbox (internal/agent): it multiplexes commands over one
// stream in the frames of internal/wire, with per-command flow control in
// both directions, and bounds every wait for an answer.
package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

var (
	// ErrGone means the stream to the agent ended: the container stopped
	// (killed, removed, its lifetime over) or the connection was lost.
	ErrGone = errors.New("agentconn: the sandbox's agent is gone")
	// ErrNoAnswer means the agent did not answer within the Conn's
	// timeout (a paused or frozen container).
	ErrNoAnswer = errors.New("agentconn: the sandbox's agent did not answer in time")
	// ErrEgressTaken means a newer session of a leased sandbox's agent
	// (another process that opened it since) serves its egress: Accept
	// (and a Listen listener's Accept) fail with it, and this session
	// should stop asking.
	ErrEgressTaken = errors.New("agentconn: the sandbox's egress is served by a newer session (another process opened it since)")
)

// Stream is the connection to the agent: writes go to its stdin. A write
// deadline bounds every write, so that a frozen container cannot block
// the library; CloseWrite ends the agent's stdin, which makes it exit.
type Stream interface {
	io.Writer
	SetWriteDeadline(time.Time) error
	CloseWrite() error
}

// Conn is a connection to one agent. Its methods may be called from any
// number of goroutines.
type Conn struct {
	s       Stream
	w       *wire.Writer
	timeout time.Duration

	mu    sync.Mutex
	chans map[uint32]*channel
	next  uint32

	hello   chan wire.Greeting
	done    chan struct{}
	doneErr error // why the stream ended; set before done is closed
}

// channel is the state of one command or request.
type channel struct {
	reply  chan wire.Frame // Started/Failed, Pong, OOMCount (first answer)
	exited chan struct{}   // closed when exit is set
	exit   wire.Exit
	killed chan wire.KillResult
	out    [2]*stream    // stdout, stderr
	stdin  *credit       // stdin bytes the agent may still take
	taken  chan struct{} // commands: closed on Taken

	end      chan struct{} // file operations: closed when Done or Failed came
	endFrame wire.Frame    // set before end is closed
	size     atomic.Int64  // file Read: the size the agent announced
	events   *stream       // watches: the records received
	actsMu   sync.Mutex    // guards acts
	acts     []wire.Act    // commands: the activity record, complete once exited is closed
	actsIn   chan struct{} // commands: a token when events arrive
}

// maxActs bounds a command's activity record as received.
const maxActs = 1 << 20

// Start runs the Conn's reader on r, the agent's stdout (demultiplexed
// from the attach stream). timeout bounds every wait for an answer.
func Start(s Stream, r io.Reader, timeout time.Duration) *Conn {
	c := &Conn{
		s: s, timeout: timeout, chans: map[uint32]*channel{},
		hello: make(chan wire.Greeting, 1), done: make(chan struct{}),
	}
	c.w = wire.NewWriter(deadlineWriter{s, timeout})
	go c.read(r)
	return c
}

// deadlineWriter bounds each write.
type deadlineWriter struct {
	s Stream
	d time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.s.SetWriteDeadline(time.Now().Add(w.d))
	n, err := w.s.Write(p)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("%w: writing to the agent: nothing taken for %v", ErrNoAnswer, w.d)
	default: // the connection is broken
		err = fmt.Errorf("%w: writing to the agent: %v", ErrGone, err)
	}
	return n, err
}

// Done is closed when the stream from the agent has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the stream ended (ErrGone, wrapped), or nil while it
// runs.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.doneErr
	default:
		return nil
	}
}

// Close ends the stream to the agent: a tethered agent exits, and the
// container with it; a leased one ends this session (the commands it
// started, its file operations and relayed connections) and goes on.
func (c *Conn) Close() error { return c.s.CloseWrite() }

func (c *Conn) read(r io.Reader) {
	var err error
	for {
		var f wire.Frame
		if f, err = wire.ReadFrame(r); err != nil {
			break
		}
		c.dispatch(f)
	}
	if err == io.EOF {
		c.doneErr = ErrGone
	} else {
		c.doneErr = fmt.Errorf("%w: %v", ErrGone, err)
	}
	c.mu.Lock()
	for _, ch := range c.chans {
		for _, s := range ch.out {
			if s != nil {
				s.end(c.doneErr)
			}
		}
		if ch.stdin != nil {
			ch.stdin.end()
		}
		if ch.events != nil {
			ch.events.end(c.doneErr)
		}
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *Conn) dispatch(f wire.Frame) {
	if f.Kind == wire.Hello {
		var g wire.Greeting
		json.Unmarshal(f.Data, &g)
		select {
		case c.hello <- g:
		default:
		}
		return
	}
	c.mu.Lock()
	ch := c.chans[f.Channel]
	c.mu.Unlock()
	if ch == nil {
		return // a late answer to a request given up on
	}
	if ch.end != nil {
		switch f.Kind {
		case wire.Started:
			var st wire.Start
			json.Unmarshal(f.Data, &st)
			ch.size.Store(st.Size)
			return
		case wire.Done, wire.Failed:
			select {
			case <-ch.end:
			default:
				ch.endFrame = f
				close(ch.end)
			}
			return
		}
	}
	switch f.Kind {
	case wire.Taken:
		if ch.taken == nil {
			return
		}
		select {
		case <-ch.taken:
		default:
			close(ch.taken)
			for _, s := range ch.out {
				s.end(ErrTaken)
			}
			if ch.stdin != nil {
				ch.stdin.end()
			}
		}
	case wire.Started, wire.Failed, wire.Pong, wire.OOMCount, wire.LeaseState, wire.SessionList, wire.UsageState:
		select {
		case ch.reply <- f:
		default:
		}
	case wire.Events:
		if s := ch.events; s != nil {
			if len(f.Data) == 0 {
				s.end(io.EOF)
			} else {
				s.add(f.Data)
			}
		}
	case wire.Stdout, wire.Stderr:
		if s := ch.out[f.Kind-wire.Stdout]; s != nil {
			if len(f.Data) == 0 {
				s.end(io.EOF)
			} else {
				s.add(f.Data)
			}
		}
	case wire.Activity:
		var acts []wire.Act
		if ch.exited != nil && json.Unmarshal(f.Data, &acts) == nil {
			select {
			case <-ch.exited: // too late: the record was complete
			default:
				ch.actsMu.Lock()
				ch.acts = append(ch.acts, acts[:min(len(acts), maxActs-len(ch.acts))]...)
				ch.actsMu.Unlock()
				select {
				case ch.actsIn <- struct{}{}:
				default:
				}
			}
		}
	case wire.Exited:
		if ch.exited == nil {
			return // not a command (a file operation): nothing exits
		}
		select {
		case <-ch.exited: // a second one: ignored
		default:
			json.Unmarshal(f.Data, &ch.exit)
			close(ch.exited)
		}
	case wire.Killed:
		var k wire.KillResult
		json.Unmarshal(f.Data, &k)
		select {
		case ch.killed <- k:
		default:
		}
	case wire.Ack:
		if n, err := wire.Count(f.Data); err == nil && ch.stdin != nil {
			ch.stdin.give(int(n))
		}
	}
}

// open registers a new channel.
func (c *Conn) open() (uint32, *channel) {
	ch := &channel{reply: make(chan wire.Frame, 1), exited: make(chan struct{}), killed: make(chan wire.KillResult, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.chans[c.next] = ch
	return c.next, ch
}

func (c *Conn) release(id uint32) {
	c.mu.Lock()
	delete(c.chans, id)
	c.mu.Unlock()
}

// await waits for a value on ch, bounded by ctx and the Conn's timeout.
func await[T any](c *Conn, ctx context.Context, ch <-chan T, what string) (T, error) {
	var zero T
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case v := <-ch:
		return v, nil
	case <-c.done:
		// An answer that came just before the end still counts.
		select {
		case v := <-ch:
			return v, nil
		default:
		}
		return zero, c.doneErr
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-t.C:
		return zero, fmt.Errorf("%w: %s: none within %v", ErrNoAnswer, what, c.timeout)
	}
}

// Ready waits for the agent's greeting.
func (c *Conn) Ready(ctx context.Context) (wire.Greeting, error) {
	return await(c, ctx, c.hello, "greeting")
}

// Ping asks the agent for a sign of life.
func (c *Conn) Ping(ctx context.Context) error {
	id, ch := c.open()
	defer c.release(id)
	if err := c.w.Write(wire.Ping, id, nil); err != nil {
		return c.writeErr(err)
	}
	_, err := await(c, ctx, ch.reply, "ping")
	return err
}

// OOMKills returns how many processes the kernel's OOM killer has ended in
// the sandbox so far, or -1 if the agent cannot tell.
func (c *Conn) OOMKills(ctx context.Context) (int, error) {
	return ask[int](c, ctx, wire.OOM, nil, wire.OOMCount, "oom count")
}

// Lease returns the sandbox's lease as its agent holds it, renewed
// first if renew (the sandbox then ends no sooner than the lease's length
// from now, unless renewed again). An agent of a sandbox that is not
// leased answers wire.LeaseInfo{} (Leased false). Bounded by ctx and the
// Conn's timeout.
func (c *Conn) Lease(ctx context.Context, renew bool) (wire.LeaseInfo, error) {
	return ask[wire.LeaseInfo](c, ctx, wire.Lease, wire.LeaseRequest{Renew: renew}, wire.LeaseState, "lease")
}

// ask sends a request of kind (req as JSON; nil: no payload) on a channel
// of its own and decodes the agent's answer, which must be of kind answer.
// Bounded by ctx and the Conn's timeout.
func ask[T any](c *Conn, ctx context.Context, kind wire.Kind, req any, answer wire.Kind, what string) (T, error) {
	var out T
	id, ch := c.open()
	defer c.release(id)
	var err error
	if req == nil {
		err = c.w.Write(kind, id, nil)
	} else {
		err = c.w.WriteJSON(kind, id, req)
	}
	if err != nil {
		return out, c.writeErr(err)
	}
	f, err := await(c, ctx, ch.reply, what)
	if err != nil {
		return out, err
	}
	if f.Kind == wire.Failed {
		return out, fmt.Errorf("agentconn: %s: the agent refused: %s", what, f.Data)
	}
	if f.Kind != answer || json.Unmarshal(f.Data, &out) != nil {
		var zero T
		return zero, fmt.Errorf("agentconn: bad %s answer %v %q", what, f.Kind, f.Data)
	}
	return out, nil
}

// writeErr prefers the stream's end as the reason a write failed.
func (c *Conn) writeErr(err error) error {
	if e := c.Err(); e != nil {
		return e
	}
	return err
}
