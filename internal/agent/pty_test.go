//go:build linux

package main

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// ttyProc is a PTY command of a test agent, its output collected.
type ttyProc struct {
	*agentconn.Proc
	mu  sync.Mutex
	out bytes.Buffer
	eof chan struct{}
}

func startTTY(t *testing.T, c *agentconn.Conn, tty wire.TTY, stdin bool, args ...string) *ttyProc {
	t.Helper()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: args, Dir: "/", User: uidSpec(), Stdin: stdin, TTY: &tty})
	if err != nil {
		t.Fatalf("exec %q on a terminal: %v", args, err)
	}
	t.Cleanup(p.Close)
	tp := &ttyProc{Proc: p, eof: make(chan struct{})}
	go func() {
		defer close(tp.eof)
		buf := make([]byte, 4096)
		for {
			n, err := p.Stdout.Read(buf)
			tp.mu.Lock()
			tp.out.Write(buf[:n])
			tp.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return tp
}

func (tp *ttyProc) output() string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.out.String()
}

// waitFor waits until the output holds s.
func (tp *ttyProc) waitFor(t *testing.T, s string) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(tp.output(), s), "no " + strconv.Quote(s) + " in the terminal's output " + strconv.Quote(tp.output())
	})
}

func (tp *ttyProc) wait(t *testing.T) wire.Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := tp.Wait(ctx)
	if err != nil {
		t.Fatalf("wait: %v; output %q", err, tp.output())
	}
	select {
	case <-tp.eof:
	case <-ctx.Done():
		t.Fatalf("the output did not end; %q", tp.output())
	}
	return e
}

func TestPTY(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	c, _, _ := ta.session(t)

	t.Run("size term and tty", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{Rows: 33, Cols: 101, Term: "vt100"}, false,
			"sh", "-c", `stty size; echo "$TERM"; test -t 0 && test -t 1 && test -t 2 && echo tty; ls -l "$(tty)" | cut -d' ' -f3; printf end`)
		if e := p.wait(t); e.Code != 0 {
			t.Errorf("exit %+v", e)
		}
		want := "33 101\r\nvt100\r\ntty\r\n" + strings.TrimSpace(output(t, c, "id", "-un")) + "\r\nend"
		if got := p.output(); got != want {
			t.Errorf("output %q, want %q", got, want)
		}
		if p.ID == "" {
			t.Error("no ID")
		}
	})
	t.Run("defaults", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{}, false, "sh", "-c", `stty size; echo "$TERM"`)
		p.wait(t)
		if got := p.output(); got != "24 80\r\nxterm-256color\r\n" {
			t.Errorf("output %q", got)
		}
	})
	t.Run("resize", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{}, true, "sh", "-i")
		in := p.Stdin()
		if err := p.Resize(50, 120); err != nil {
			t.Fatal(err)
		}
		// Sizes out of range are ignored.
		p.Resize(0, 5)
		p.Resize(1001, 7)
		io.WriteString(in, "stty size\n")
		p.waitFor(t, "50 120\r\n")
		in.Close()
		p.wait(t)
		// SIGWINCH reaches the foreground process group.
		w := startTTY(t, c, wire.TTY{}, false, "sh", "-c", `trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 1; done`)
		w.waitFor(t, "ready\r\n")
		w.Resize(10, 20)
		if e := w.wait(t); e.Code != 0 || w.output() != "ready\r\n10 20\r\n" {
			t.Errorf("SIGWINCH: %+v %q", e, w.output())
		}
	})
	t.Run("eof", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{}, true, "cat")
		in := p.Stdin()
		io.WriteString(in, "one\ntwo")
		in.Close()
		e := p.wait(t)
		if e.Code != 0 || strings.Count(p.output(), "one\r\n") != 2 || strings.Count(p.output(), "two") != 2 {
			t.Errorf("cat: %+v %q", e, p.output())
		}
	})
	t.Run("interrupt", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{}, true, "sh", "-i")
		in := p.Stdin()
		io.WriteString(in, "sleep 1000; echo \"status $?\"\n")
		poll.Eventually(t, 10*time.Second, func() (bool, string) {
			return strings.Contains(output(t, c, "ps", "-eo", "args"), "\nsleep 1000\n"), "no sleep 1000"
		})
		io.WriteString(in, "\x03")
		p.waitFor(t, "^C")
		io.WriteString(in, "echo \"status $?\"\n")
		p.waitFor(t, "status 130\r\n")
		in.Close()
		if e := p.wait(t); e.Code != 0 || e.Killed {
			t.Errorf("sh -i: %+v", e)
		}
	})
	t.Run("tail", func(t *testing.T) {
		p := startTTY(t, c, wire.TTY{}, false, "sh", "-c", `seq 1 20000; printf last`)
		p.wait(t)
		var want strings.Builder
		for i := 1; i <= 20000; i++ {
			want.WriteString(strconv.Itoa(i) + "\r\n")
		}
		want.WriteString("last")
		if got := p.output(); got != want.String() {
			t.Errorf("output of %d bytes, want %d; ends %q", len(got), want.Len(), got[max(0, len(got)-40):])
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, tty := range []wire.TTY{{Rows: 1001}, {Cols: 5000}, {Term: "a=b"}, {Term: "x\x00"}, {Term: strings.Repeat("x", 65)}} {
			_, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"true"}, Dir: "/", User: uidSpec(), TTY: &tty})
			if err == nil {
				t.Errorf("%+v: started", tty)
			}
		}
	})
}

// A forged Resize frame is ignored, whatever it holds.
func TestResizeForged(t *testing.T) {
	a := newAgent(io.Discard, nil, &oomScore{})
	for _, d := range []string{`nonsense`, `{"Rows":0,"Cols":5}`, `{"Rows":1001,"Cols":5}`, `{"Rows":-1}`, `{"Rows":10,"Cols":10}`, ``} {
		if err := a.resize(wire.Frame{Kind: wire.Resize, Channel: 7, Data: []byte(d)}); err == nil {
			t.Errorf("resize %q of no command: nil error", d)
		}
	}
}

func TestCheckTTY(t *testing.T) {
	for _, tt := range []wire.TTY{{}, {Rows: 1000, Cols: 1000, Term: "xterm-256color"}, {Rows: 1, Cols: 1, Term: "vt100"}} {
		if err := wire.CheckTTY(tt); err != nil {
			t.Errorf("%+v: %v", tt, err)
		}
	}
	for _, tt := range []wire.TTY{{Rows: 1001}, {Cols: 65535}, {Term: "a b"}, {Term: "a=b"}, {Term: "../x"}, {Term: "\xff"}, {Term: strings.Repeat("x", 65)}} {
		if err := wire.CheckTTY(tt); err == nil {
			t.Errorf("%+v: accepted", tt)
		}
	}
}
