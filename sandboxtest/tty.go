package sandboxtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// screen is a PTY command's output as it comes.
type screen struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the output holds want after from bytes of it, and
// returns where that occurrence ends.
func (s *screen) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	end := 0
	Eventually(t, 30*time.Second, func() (bool, string) {
		out := s.String()
		i := strings.Index(out[min(from, len(out)):], want)
		if i < 0 {
			return false, fmt.Sprintf("no %q in the terminal's output after byte %d: %q", want, from, out)
		}
		end = from + i + len(want)
		return true, ""
	})
	return end
}

// ttyShell starts sh -i on a terminal: its input, its output.
func ttyShell(t *testing.T, sb *sandbox.Sandbox, tty *sandbox.TTY) (*sandbox.Cmd, io.WriteCloser, *screen) {
	t.Helper()
	c := sb.Command(ctxFor(t), "sh", "-i")
	c.TTY = tty
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &screen{}
	c.Stdout = out
	if err := c.Start(); err != nil {
		t.Fatalf("Start(sh -i) on a terminal: %v", err)
	}
	t.Cleanup(func() { in.Close(); c.Wait() })
	return c, in, out
}

func typeIn(t *testing.T, in io.Writer, s string) {
	t.Helper()
	if _, err := io.WriteString(in, s); err != nil {
		t.Fatalf("typing %q: %v", s, err)
	}
}

// tty checks commands on a pseudo-terminal (Cmd.TTY): a shell that keeps
// its state across inputs, the size and TERM, Resize seen by stty and as
// SIGWINCH, C-c interrupting the foreground job only, job control, the end
// of input ending cat, output exact to its last byte after the exit, and
// the settings refused.
func (c conformance) tty(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)

	t.Run("repl", func(t *testing.T) {
		cmd, in, out := ttyShell(t, sb, &sandbox.TTY{Rows: 30, Cols: 100, Term: "vt100"})
		if cmd.ID() == "" {
			t.Error("a started command has no ID")
		}
		typeIn(t, in, "x=41; PS1='$ '\n")
		typeIn(t, in, "echo \"v$((x+1))\" \"$TERM\"; stty size\n")
		at := out.waitFor(t, 0, "v42 vt100\r\n30 100\r\n")
		if err := cmd.Resize(45, 132); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		typeIn(t, in, "stty size; test -t 0 && test -t 2 && echo tty; ls -ln \"$(tty)\" | awk '{print \"owner\", $3}'; id -u\n")
		at = out.waitFor(t, at, "45 132\r\ntty\r\nowner ")
		// The owner's uid, then the user's: both lines, whole.
		ids := regexp.MustCompile(`^(\d+)\r\n(\d+)\r\n`)
		var m []string
		Eventually(t, 30*time.Second, func() (bool, string) {
			m = ids.FindStringSubmatch(out.String()[at:])
			return m != nil, fmt.Sprintf("the owner and id -u: %q", out.String()[at:])
		})
		if m[1] != m[2] {
			t.Errorf("the terminal is not its user's: owner %s, user %s", m[1], m[2])
		}
		at += len(m[0])
		// C-c interrupts the foreground job, not the shell.
		typeIn(t, in, "sleep 1000\n")
		Eventually(t, 30*time.Second, func() (bool, string) {
			ps := run(t, sb, psScript).Stdout
			return strings.Contains(ps, "\nsleep 1000 \n"), "no sleep 1000 yet:\n" + ps
		})
		typeIn(t, in, "\x03")
		typeIn(t, in, "echo \"status $?\"\n")
		at = out.waitFor(t, at, "status 130\r\n")
		// Job control: a job in the background, brought back and ended.
		typeIn(t, in, "set -m; sleep 1001 & jobs; kill -9 %1; wait; echo \"jobs done\"\n")
		at = out.waitFor(t, at, "jobs done\r\n")
		// The foreground job sees the resize as SIGWINCH.
		typeIn(t, in, "sh -c 'trap \"stty size; exit 0\" WINCH; echo armed; while :; do sleep 1; done'\n")
		at = out.waitFor(t, at, "armed\r\n")
		if err := cmd.Resize(20, 60); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		out.waitFor(t, at, "20 60\r\n")
		typeIn(t, in, "exit 3\n")
		in.Close()
		var ee *sandbox.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.Code != 3 || cmd.ProcessState.Killed() {
			t.Errorf("Wait after exit 3: %v; output %q", err, out.String())
		}
	})

	t.Run("eof", func(t *testing.T) {
		cmd := sb.Command(ctx, "cat")
		cmd.TTY = &sandbox.TTY{}
		cmd.Stdin = strings.NewReader("one\ntwo")
		out, err := cmd.Output()
		if err != nil || strings.Count(string(out), "one\r\n") != 2 || strings.Count(string(out), "two") != 2 {
			t.Errorf("cat on a terminal, input ending without a newline: %q, %v", out, err)
		}
		// No Stdin: end of file at once.
		cmd = sb.Command(ctx, "cat")
		cmd.TTY = &sandbox.TTY{}
		if out, err := cmd.Output(); err != nil || len(out) != 0 {
			t.Errorf("cat on a terminal without stdin: %q, %v", out, err)
		}
	})

	t.Run("exact", func(t *testing.T) {
		const n = 30000
		cmd := sb.Command(ctx, "sh", "-c", fmt.Sprintf("seq 1 %d; echo err >&2; printf last; exit 5", n))
		cmd.TTY = &sandbox.TTY{}
		var want strings.Builder
		for i := 1; i <= n; i++ {
			want.WriteString(strconv.Itoa(i) + "\r\n")
		}
		want.WriteString("err\r\nlast")
		out, err := cmd.Output()
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) || ee.Code != 5 || len(ee.Stderr) != 0 {
			t.Errorf("exit: %v", err)
		}
		if string(out) != want.String() {
			t.Errorf("output of %d bytes, want %d; it ends %q", len(out), want.Len(), out[max(0, len(out)-40):])
		}
	})

	t.Run("refused", func(t *testing.T) {
		cmd := sb.Command(ctx, "true")
		cmd.TTY = &sandbox.TTY{}
		cmd.Stderr = io.Discard
		if err := cmd.Run(); !errors.Is(err, sandbox.ErrTTYStderr) {
			t.Errorf("Stderr with TTY: %v, want ErrTTYStderr", err)
		}
		for _, tty := range []sandbox.TTY{{Rows: -1}, {Cols: sandbox.MaxTTYSize + 1}, {Term: "a b"}, {Term: "x=y"}, {Term: strings.Repeat("t", 100)}} {
			cmd := sb.Command(ctx, "true")
			cmd.TTY = &tty
			if err := cmd.Run(); !errors.Is(err, sandbox.ErrBadTTY) {
				t.Errorf("TTY %+v: %v, want ErrBadTTY", tty, err)
			}
		}
		cmd = sb.Command(ctx, "true")
		if err := cmd.Resize(10, 10); !errors.Is(err, sandbox.ErrNoTTY) {
			t.Errorf("Resize without TTY: %v, want ErrNoTTY", err)
		}
		cmd = sb.Command(ctx, "cat")
		cmd.TTY = &sandbox.TTY{}
		if err := cmd.Resize(10, 10); !errors.Is(err, sandbox.ErrNotStarted) {
			t.Errorf("Resize before Start: %v, want ErrNotStarted", err)
		}
		in, _ := cmd.StdinPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for _, sz := range [][2]int{{0, 10}, {10, 0}, {sandbox.MaxTTYSize + 1, 10}, {-5, 5}} {
			if err := cmd.Resize(sz[0], sz[1]); !errors.Is(err, sandbox.ErrBadTTY) {
				t.Errorf("Resize(%d, %d): %v, want ErrBadTTY", sz[0], sz[1], err)
			}
		}
		in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("cat: %v", err)
		}
		if err := cmd.Resize(10, 10); err != nil {
			t.Errorf("Resize after the end: %v, want nil", err)
		}
	})
}
