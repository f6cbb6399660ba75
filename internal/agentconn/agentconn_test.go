package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipeStream is the library's end of an in-memory connection.
type pipeStream struct{ net.Conn }

func (p pipeStream) CloseWrite() error { return p.Conn.Close() }

// fake is an agent played by the test: it gets every frame the library
// sends and answers through w.
type fake struct {
	frames chan wire.Frame
	w      *wire.Writer
	conn   net.Conn
}

func start(t *testing.T, timeout time.Duration) (*Conn, *fake) {
	t.Helper()
	lib, ag := net.Pipe()
	c := Start(pipeStream{lib}, lib, timeout)
	f := &fake{frames: make(chan wire.Frame, 100), w: wire.NewWriter(ag), conn: ag}
	go func() {
		defer close(f.frames)
		for {
			fr, err := wire.ReadFrame(ag)
			if err != nil {
				return
			}
			f.frames <- fr
		}
	}()
	t.Cleanup(func() {
		ag.Close()
		lib.Close()
		<-c.Done()
	})
	return c, f
}

func (f *fake) next(t *testing.T, kind wire.Kind) wire.Frame {
	t.Helper()
	for fr := range f.frames {
		if fr.Kind == kind {
			return fr
		}
	}
	t.Fatalf("no %v frame", kind)
	return wire.Frame{}
}

func TestExecStreamsAndExit(t *testing.T) {
	c, f := start(t, 5*time.Second)
	go func() {
		fr := f.next(t, wire.Exec)
		var req wire.ExecRequest
		json.Unmarshal(fr.Data, &req)
		if req.Args[0] != "echo" || req.User != "1000:1000" {
			t.Errorf("request %+v", req)
		}
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 42})
		f.w.Write(wire.Stdout, fr.Channel, []byte("hi\n"))
		f.w.Write(wire.Stderr, fr.Channel, []byte("oops\n"))
		f.w.Write(wire.Stdout, fr.Channel, nil)
		f.w.Write(wire.Stderr, fr.Channel, nil)
		f.w.WriteJSON(wire.Exited, fr.Channel, wire.Exit{Code: 3})
		f.w.WriteJSON(wire.Exited, 999, wire.Exit{Code: 1}) // unknown channel: dropped
	}()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"echo", "hi"}, User: "1000:1000"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, _ := io.ReadAll(p.Stdout)
	errb, _ := io.ReadAll(p.Stderr)
	e, err := p.Wait(context.Background())
	if p.PID != 42 || string(out) != "hi\n" || string(errb) != "oops\n" || err != nil || e.Code != 3 {
		t.Errorf("pid %d, stdout %q, stderr %q, exit %+v, %v", p.PID, out, errb, e, err)
	}
}

// The library acknowledges exactly the output it consumed, so that the
// agent's window of unacknowledged output opens again.
func TestOutputAcks(t *testing.T) {
	c, f := start(t, 5*time.Second)
	var acked atomic.Int64
	go func() {
		fr := f.next(t, wire.Exec)
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 7})
		f.w.Write(wire.Stdout, fr.Channel, make([]byte, wire.Window))
		for acked.Load() < wire.Window {
			a := f.next(t, wire.Ack)
			n, _ := wire.Count(a.Data)
			acked.Add(int64(n))
		}
		f.w.Write(wire.Stdout, fr.Channel, nil)
		f.w.Write(wire.Stderr, fr.Channel, nil)
		f.w.WriteJSON(wire.Exited, fr.Channel, wire.Exit{})
	}()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	n, err := io.Copy(io.Discard, p.Stdout)
	if n != wire.Window || err != nil {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	p.Wait(context.Background())
	if acked.Load() != wire.Window {
		t.Errorf("acknowledged %d bytes of %d", acked.Load(), wire.Window)
	}
}

// An agent that sends more output than its window gets the stream ended
// with ErrWindow, and the host holds no more than the window.
func TestOutputOverWindow(t *testing.T) {
	c, f := start(t, 5*time.Second)
	go func() {
		fr := f.next(t, wire.Exec)
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 7})
		for range 4 {
			f.w.Write(wire.Stdout, fr.Channel, make([]byte, wire.Window/2+1))
		}
		f.w.Write(wire.Stdout, fr.Channel, nil)
		f.w.WriteJSON(wire.Exited, fr.Channel, wire.Exit{})
	}()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Wait(context.Background())
	n, err := io.Copy(io.Discard, p.Stdout)
	if !errors.Is(err, ErrWindow) || n > wire.Window {
		t.Fatalf("read %d bytes, %v; want at most a window, then ErrWindow", n, err)
	}
}

// An agent that does not answer makes each request fail after the Conn's
// timeout, naming what did not answer; a request can also be cancelled.
func TestNoAnswer(t *testing.T) {
	c, _ := start(t, 100*time.Millisecond)
	if err := c.Ping(context.Background()); !errors.Is(err, ErrNoAnswer) || !strings.Contains(err.Error(), "ping") {
		t.Errorf("Ping to a silent agent: %v", err)
	}
	if _, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"x"}}); !errors.Is(err, ErrNoAnswer) {
		t.Errorf("Exec on a silent agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.OOMKills(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("OOMKills with a cancelled context: %v", err)
	}
}

// When the agent's stream ends, everything waiting on it ends with ErrGone.
func TestGone(t *testing.T) {
	c, f := start(t, 5*time.Second)
	started := make(chan struct{})
	go func() {
		fr := f.next(t, wire.Exec)
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 9})
		f.w.Write(wire.Stdout, fr.Channel, []byte("partial"))
		<-started
		f.conn.Close()
	}()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	close(started)
	out, err := io.ReadAll(p.Stdout)
	if string(out) != "partial" || !errors.Is(err, ErrGone) {
		t.Errorf("stdout %q, %v; want the partial output, then ErrGone", out, err)
	}
	if _, err := p.Wait(context.Background()); !errors.Is(err, ErrGone) {
		t.Errorf("Wait: %v", err)
	}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrGone) && !errors.Is(err, ErrNoAnswer) {
		t.Errorf("Ping after the end: %v", err)
	}
	if !errors.Is(c.Err(), ErrGone) {
		t.Errorf("Err() = %v", c.Err())
	}
}

// Stdin goes out no more than a window ahead of the agent's
// acknowledgements.
func TestStdinCredit(t *testing.T) {
	c, f := start(t, 5*time.Second)
	got := make(chan int, 1)
	go func() {
		fr := f.next(t, wire.Exec)
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 5})
		n := 0
		for n < wire.Window {
			n += len(f.next(t, wire.Stdin).Data)
		}
		got <- n
	}()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	w := p.Stdin()
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(make([]byte, 2*wire.Window))
		wrote <- err
	}()
	if n := <-got; n != wire.Window {
		t.Errorf("agent got %d bytes before acknowledging any", n)
	}
	select {
	case err := <-wrote:
		t.Fatalf("Write of two windows returned without acknowledgements: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.Close() // ends the waiting Write
	if err := <-wrote; !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("Write after Close: %v", err)
	}
}

// An answer that comes back before the requester waits for it is kept: the
// request's channel is registered, with room for its answer, before the
// request is written. (The readiness hang of the shell supervisor this
// replaced was such an answer, dropped.)
func TestAnswerBeforeWait(t *testing.T) {
	c, f := start(t, 5*time.Second)
	go func() {
		for fr := range f.frames {
			if fr.Kind == wire.Ping {
				f.w.Write(wire.Pong, fr.Channel, nil)
			}
		}
	}()
	for i := range 2000 {
		if err := c.Ping(context.Background()); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
}

// Lease sends the request as JSON and decodes the agent's LeaseState; the
// greeting's Lease comes through Ready; a Failed answer is an error.
func TestLease(t *testing.T) {
	c, f := start(t, 5*time.Second)
	f.w.WriteJSON(wire.Hello, 0, wire.Greeting{Version: "2", PID: 1, Lease: 30 * time.Second})
	g, err := c.Ready(context.Background())
	if err != nil || g.Lease != 30*time.Second {
		t.Fatalf("greeting %+v, %v", g, err)
	}
	go func() {
		fr := f.next(t, wire.Lease)
		var req wire.LeaseRequest
		if err := json.Unmarshal(fr.Data, &req); err != nil || !req.Renew {
			t.Errorf("lease request %q: %+v, %v", fr.Data, req, err)
		}
		f.w.WriteJSON(wire.LeaseState, fr.Channel, wire.LeaseInfo{Leased: true, Lease: 30 * time.Second, Left: 29 * time.Second})
		fr = f.next(t, wire.Lease)
		f.w.Write(wire.Failed, fr.Channel, []byte("agent: bad lease request"))
	}()
	li, err := c.Lease(context.Background(), true)
	if err != nil || li != (wire.LeaseInfo{Leased: true, Lease: 30 * time.Second, Left: 29 * time.Second}) {
		t.Fatalf("Lease: %+v, %v", li, err)
	}
	if _, err := c.Lease(context.Background(), false); err == nil || !strings.Contains(err.Error(), "bad lease request") {
		t.Fatalf("Lease answered by Failed: %v", err)
	}
}

// An Accept the agent refuses because a newer session serves egress fails
// with ErrEgressTaken, and a Listen listener stops asking and says so.
func TestEgressTaken(t *testing.T) {
	c, f := start(t, 5*time.Second)
	go func() {
		for fr := range f.frames {
			if fr.Kind == wire.Accept {
				f.w.Write(wire.Failed, fr.Channel, []byte("agent: "+wire.EgressTaken))
			}
		}
	}()
	if _, err := c.Accept(context.Background()); !errors.Is(err, ErrEgressTaken) {
		t.Fatalf("Accept refused for a newer session: %v", err)
	}
	l := c.Listen(3)
	defer l.Close()
	if _, err := l.Accept(); !errors.Is(err, ErrEgressTaken) {
		t.Fatalf("listener's Accept: %v", err)
	}
}
