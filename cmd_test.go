package sandbox_test

// Sandbox.Command's Cmd against the real engine: the os/exec API
// (Output, pipes, streaming, exit codes, environment, directory, user),
// its state machine and its corner cases.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

func TestCmdBasics(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)

	t.Run("Output", func(t *testing.T) {
		t.Parallel()
		out, err := sb.Command(ctx, "echo", "hello", "world").Output()
		if err != nil || string(out) != "hello world\n" {
			t.Fatalf("Output = %q, %v; want %q, nil", out, err, "hello world\n")
		}
	})

	t.Run("StdoutStderrApart", func(t *testing.T) {
		t.Parallel()
		var o, e bytes.Buffer
		c := sb.Command(ctx, "sh", "-c", "printf out1; printf err1 >&2; printf out2; printf err2 >&2")
		c.Stdout, c.Stderr = &o, &e
		if err := c.Run(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if o.String() != "out1out2" || e.String() != "err1err2" {
			t.Fatalf("stdout %q stderr %q; want %q %q", o.String(), e.String(), "out1out2", "err1err2")
		}
		r := mustExec(t, sb, "printf out1; printf err1 >&2; printf out2; printf err2 >&2; exit 4")
		if r.Stdout != "out1out2" || r.Stderr != "err1err2" || r.ExitCode != 4 || r.TimedOut || r.Truncated || r.OOMKilled {
			t.Fatalf("Exec = %+v", r)
		}
	})

	t.Run("ExitCodes", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			script string
			code   int
		}{{"exit 1", 1}, {"exit 3", 3}, {"exit 255", 255}, {"kill -9 $$", 137}, {"kill -15 $$", 143}} {
			err := sb.Command(ctx, "sh", "-c", tc.script).Run()
			var ee *sandbox.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("%s: Run = %v; want *ExitError", tc.script, err)
			}
			if ee.Code != tc.code || ee.OOMKilled {
				t.Errorf("%s: Code %d OOMKilled %v; want %d false", tc.script, ee.Code, ee.OOMKilled, tc.code)
			}
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				t.Errorf("%s: plain exit matches a context error: %v", tc.script, err)
			}
			r := mustExec(t, sb, tc.script)
			if r.ExitCode != tc.code || r.TimedOut || r.OOMKilled {
				t.Errorf("Exec(%s) = %+v; want code %d", tc.script, r, tc.code)
			}
		}
		if err := sb.Command(ctx, "true").Run(); err != nil {
			t.Fatalf("true: %v", err)
		}
	})

	t.Run("OutputFillsStderr", func(t *testing.T) {
		t.Parallel()
		out, err := sb.Command(ctx, "sh", "-c", "echo out; echo err >&2; exit 3").Output()
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("Output err = %v; want *ExitError", err)
		}
		if string(out) != "out\n" || ee.Code != 3 || string(ee.Stderr) != "err\n" {
			t.Fatalf("Output = %q, code %d, stderr %q", out, ee.Code, ee.Stderr)
		}
	})

	t.Run("CombinedOutput", func(t *testing.T) {
		t.Parallel()
		out, err := sb.Command(ctx, "sh", "-c", "echo a; echo b >&2; echo c; exit 2").CombinedOutput()
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) || ee.Code != 2 {
			t.Fatalf("CombinedOutput err = %v; want exit 2", err)
		}
		// stdout and stderr travel as separate streams, so only the order
		// within each stream is defined.
		s := string(out)
		if len(s) != 6 || strings.Count(s, "a\n") != 1 || strings.Count(s, "b\n") != 1 ||
			strings.Count(s, "c\n") != 1 || strings.Index(s, "a\n") > strings.Index(s, "c\n") {
			t.Fatalf("CombinedOutput = %q", out)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		out, err := sb.Command(ctx, "no-such-command-xyz", "arg").Output()
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) || ee.Code != 127 {
			t.Fatalf("Output = %q, %v; want *ExitError with Code 127", out, err)
		}
		if len(out) != 0 || !strings.Contains(string(ee.Stderr), "no-such-command-xyz") {
			t.Fatalf("stdout %q stderr %q", out, ee.Stderr)
		}
		r := mustExec(t, sb, "no-such-command-xyz")
		if r.ExitCode != 127 {
			t.Fatalf("Exec = %+v; want exit 127", r)
		}
	})

	t.Run("ArgsIntact", func(t *testing.T) {
		t.Parallel()
		args := []string{
			"", "plain", "two words", "  lead and trail  ", "tab\there",
			`"double"`, `'single'`, `back\slash`, `\n`, "line1\nline2\n", "\n",
			"héllo wörld ✓ 日本語 🙂", "$HOME", "${PATH}", "`id`", "$(id)", "*", "?", "[a]",
			"-n", "--", "a;b|c&d>e<f", "%s %d %%", "end",
		}
		var want strings.Builder
		for _, a := range args {
			want.WriteString("[" + a + "]\n")
		}
		out, err := sb.Command(ctx, "printf", append([]string{"[%s]\n"}, args...)...).Output()
		if err != nil || string(out) != want.String() {
			t.Fatalf("printf args: %q, %v\nwant %q", out, err, want.String())
		}
		// The same through a shell's "$@".
		out, err = sb.Command(ctx, "sh", append([]string{"-c", `printf '[%s]\n' "$@"`, "sh"}, args...)...).Output()
		if err != nil || string(out) != want.String() {
			t.Fatalf(`sh "$@": %q, %v\nwant %q`, out, err, want.String())
		}
		// The script of Exec is passed intact too.
		r := mustExec(t, sb, "printf '%s\\n' 'a  b' \"it's\" 'héllo ✓'")
		if r.Stdout != "a  b\nit's\nhéllo ✓\n" {
			t.Fatalf("Exec = %q", r.Stdout)
		}
	})

	t.Run("Env", func(t *testing.T) {
		t.Parallel()
		c := sb.Command(ctx, "sh", "-c", `printf '%s|%s|%s|%s|%s' "$FOO" "${EMPTY-unset}" "$HOME" "$SPACED" "${AGENTSANDBOX_HOSTVAR-unset}"`)
		c.Env = []string{"FOO=bar", "EMPTY=", "SPACED=a b\nc", "FOO=baz"}
		out, err := c.Output()
		if want := "baz||/workspace|a b\nc|unset"; err != nil || string(out) != want {
			t.Fatalf("Output = %q, %v; want %q", out, err, want)
		}
		c = sb.Command(ctx, "sh", "-c", `printf %s "$HOME"`)
		c.Env = []string{"HOME=/tmp"}
		if out, err := c.Output(); err != nil || string(out) != "/tmp" {
			t.Fatalf("HOME override = %q, %v", out, err)
		}
		// Env is per command.
		if out, err := sb.Command(ctx, "sh", "-c", `printf %s "${FOO-unset}"`).Output(); err != nil || string(out) != "unset" {
			t.Fatalf("FOO leaked into the next command: %q, %v", out, err)
		}
	})

	t.Run("Dir", func(t *testing.T) {
		t.Parallel()
		if r := mustExec(t, sb, "mkdir -p sub/deeper && echo x > sub/deeper/f"); r.ExitCode != 0 {
			t.Fatalf("mkdir: %+v", r)
		}
		for dir, want := range map[string]string{
			"":                      "/workspace\n",
			"sub":                   "/workspace/sub\n",
			"sub/deeper":            "/workspace/sub/deeper\n",
			"./sub/../sub":          "/workspace/sub\n",
			"/tmp":                  "/tmp\n",
			"/workspace/sub/deeper": "/workspace/sub/deeper\n",
		} {
			c := sb.Command(ctx, "pwd")
			c.Dir = dir
			out, err := c.Output()
			if err != nil || string(out) != want {
				t.Errorf("Dir %q: pwd = %q, %v; want %q", dir, out, err, want)
			}
		}
		c := sb.Command(ctx, "cat", "f")
		c.Dir = "sub/deeper"
		if out, err := c.Output(); err != nil || string(out) != "x\n" {
			t.Errorf("relative file in Dir: %q, %v", out, err)
		}
	})

	t.Run("User", func(t *testing.T) {
		t.Parallel()
		for user, want := range map[string]string{
			"1000":      "1000 1000\n",
			"0":         "0 0\n",
			"root":      "0 0\n",
			"1234:4321": "1234 4321\n",
		} {
			c := sb.Command(ctx, "sh", "-c", `echo "$(id -u) $(id -g)"`)
			c.User = user
			out, err := c.Output()
			if err != nil || string(out) != want {
				t.Errorf("User %q: %q, %v; want %q", user, out, err, want)
			}
		}
	})

	t.Run("StdinRoundTrip", func(t *testing.T) {
		t.Parallel()
		data := make([]byte, 1<<20)
		rand.Read(data)
		var out bytes.Buffer
		c := sb.Command(ctx, "cat")
		c.Stdin = bytes.NewReader(data)
		c.Stdout = &out
		if err := c.Run(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("cat round trip: got %d bytes, want %d identical bytes", out.Len(), len(data))
		}
		// Exactly OutputBytes (1 MiB by default) is not truncation.
		c = sb.Command(ctx, "cat")
		c.Stdin = bytes.NewReader(data)
		got, err := c.Output()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("Output of exactly OutputBytes: %d bytes, %v", len(got), err)
		}
		// No Stdin: the command reads EOF at once.
		if out, err := sb.Command(ctx, "wc", "-c").Output(); err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Fatalf("wc -c with no stdin = %q, %v", out, err)
		}
	})

	t.Run("BinaryOutput", func(t *testing.T) {
		t.Parallel()
		var want []byte
		for i := range 256 {
			want = append(want, byte(i))
		}
		want = append(want, 0xc3, 0x28, 0xff, 0xfe, 0xed, 0xa0, 0x80, 0xf0, 0x28, 0x8c, 0x28, 0x00, 0x0a, 0x0d, 0x80)
		// Made inside the sandbox, not echoed back from our stdin.
		h := hex.EncodeToString(want)
		out, err := sb.Command(ctx, "sh", "-c", `printf %s "$1" | xxd -r -p`, "sh", h).Output()
		if err != nil || !bytes.Equal(out, want) {
			t.Fatalf("Output = %x, %v\nwant %x", out, err, want)
		}
		r := mustExec(t, sb, "printf %s "+h+" | xxd -r -p; printf %s "+h+" | xxd -r -p >&2")
		if r.Stdout != string(want) || r.Stderr != string(want) || r.ExitCode != 0 {
			t.Fatalf("Exec = %x / %x (exit %d)\nwant %x", r.Stdout, r.Stderr, r.ExitCode, want)
		}
	})

	t.Run("Pipes", func(t *testing.T) {
		t.Parallel()
		c := sb.Command(ctx, "sh", "-c", "cat; echo e1 >&2; echo done")
		stdin, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr, err := c.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.StdoutPipe(); err == nil {
			t.Error("second StdoutPipe: no error")
		}
		if _, err := c.StdinPipe(); err == nil {
			t.Error("second StdinPipe: no error")
		}
		if _, err := c.StderrPipe(); err == nil {
			t.Error("second StderrPipe: no error")
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var outB, errB []byte
		var outErr, errErr error
		wg.Add(2)
		go func() { defer wg.Done(); outB, outErr = io.ReadAll(stdout) }()
		go func() { defer wg.Done(); errB, errErr = io.ReadAll(stderr) }()
		if _, err := io.WriteString(stdin, "from stdin\n"); err != nil {
			t.Fatal(err)
		}
		if err := stdin.Close(); err != nil {
			t.Fatal(err)
		}
		// As with os/exec: read the pipes to EOF, then Wait.
		wg.Wait()
		if err := c.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if outErr != nil || errErr != nil || string(outB) != "from stdin\ndone\n" || string(errB) != "e1\n" {
			t.Fatalf("stdout %q (%v) stderr %q (%v)", outB, outErr, errB, errErr)
		}
	})

	t.Run("Streaming", func(t *testing.T) {
		t.Parallel()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c := sb.Command(cctx, "sh", "-c", `echo first; read x; echo "got $x"`)
		stdin, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(stdout)
		// The command is blocked in read until we write, so this line can
		// only arrive if output is delivered as it is produced.
		line, err := br.ReadString('\n')
		if err != nil || line != "first\n" {
			t.Fatalf("first line = %q, %v", line, err)
		}
		if _, err := io.WriteString(stdin, "second\n"); err != nil {
			t.Fatal(err)
		}
		stdin.Close()
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "got second\n" {
			t.Fatalf("rest = %q, %v", rest, err)
		}
		if err := c.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	})

	t.Run("StartWaitMisuse", func(t *testing.T) {
		t.Parallel()
		c := sb.Command(ctx, "true")
		if err := c.Wait(); err == nil {
			t.Error("Wait before Start: no error")
		}
		if err := c.Start(); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := c.Start(); err == nil {
			t.Error("second Start: no error")
		}
		if _, err := c.StdoutPipe(); err == nil {
			t.Error("StdoutPipe after Start: no error")
		}
		if err := c.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if err := c.Wait(); err == nil {
			t.Error("second Wait: no error")
		}
		if err := c.Run(); err == nil {
			t.Error("Run of a used Cmd: no error")
		}
		c = sb.Command(ctx, "true")
		c.Stdout = io.Discard
		if _, err := c.Output(); err == nil {
			t.Error("Output with Stdout set: no error")
		}
		if _, err := sb.Command(ctx, "").Output(); err == nil {
			t.Error("empty command: no error")
		}
		var nilCtx context.Context
		if err := sb.Command(nilCtx, "true").Run(); err == nil {
			t.Error("nil context: no error")
		}
	})
}

// A Cmd follows os/exec's rules: one that Sandbox.Command did not make
// gives an error, not a panic; Wait after a failed Start returns an error
// at once.
func TestCmdStateMachine(t *testing.T) {
	t.Parallel()
	for _, c := range []*sandbox.Cmd{{}, {Args: []string{"echo", "hi"}}} {
		if err := c.Run(); err == nil {
			t.Errorf("Run of %+v succeeded", c.Args)
		}
		if _, err := c.Output(); err == nil {
			t.Errorf("Output of %+v succeeded", c.Args)
		}
		if _, err := c.CombinedOutput(); err == nil {
			t.Errorf("CombinedOutput of %+v succeeded", c.Args)
		}
		if err := c.Wait(); err == nil {
			t.Errorf("Wait of %+v succeeded", c.Args)
		}
	}
	sb := newSandbox(t)
	for _, c := range []*sandbox.Cmd{
		sb.Command(testCtx(t), ""), // refused by Start
		func() *sandbox.Cmd { c := sb.Command(testCtx(t), "true"); c.Dir = "/nonexistent"; return c }(), // refused by the agent
	} {
		if err := c.Start(); err == nil {
			t.Fatalf("Start of %q in %q succeeded", c.Args, c.Dir)
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("Wait after a failed Start of %q succeeded", c.Args)
			}
		case <-time.After(testenv.HangGuard):
			t.Fatalf("Wait after a failed Start of %q did not return", c.Args)
		}
	}
}

// Stdin written a byte at a time (many tiny frames to the agent) arrives
// whole, and its end reaches the command.
func TestCmdStdinSmallWrites(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	c := sb.Command(testCtx(t), "wc", "-c")
	w, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c.Stdout = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for range 20000 {
		if _, err := w.Write([]byte{'x'}); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if err := c.Wait(); err != nil || strings.TrimSpace(out.String()) != "20000" {
		t.Errorf("wc -c of 20000 single-byte writes: %q, %v", out.String(), err)
	}
}

// After Wait, the Cmd's ProcessState says how the command ended.
func TestCmdProcessState(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	c := sb.Command(testCtx(t), "sh", "-c", "exit 3")
	if c.ProcessState != nil {
		t.Fatal("ProcessState before Run")
	}
	if err := c.Run(); err == nil {
		t.Fatal("exit 3 gave no error")
	}
	if ps := c.ProcessState; ps == nil || ps.ExitCode() != 3 || ps.Success() || ps.TimedOut() || ps.Killed() || ps.Duration() <= 0 {
		t.Errorf("ProcessState after exit 3: %v", ps)
	}
	ctx, expire := testenv.ManualDeadline(testCtx(t))
	c = sb.Command(ctx, "sh", "-c", "echo started; sleep 1000")
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "started\n" {
		t.Fatalf("first line %q", line)
	}
	expire()
	c.Wait()
	if ps := c.ProcessState; ps == nil || ps.ExitCode() != 137 || !ps.TimedOut() || !ps.Killed() || ps.Success() {
		t.Errorf("ProcessState after a deadline kill: %v", ps)
	} else {
		t.Logf("ProcessState: %v", ps)
	}
}

// plainCounter is a writer that is not safe for concurrent use.
type plainCounter struct{ n int }

func (c *plainCounter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// Stdout and Stderr the same writer: its Write is called by one goroutine
// at a time, as os/exec does (the race detector checks), and every byte of
// both streams arrives.
func TestCmdSameWriter(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	cmd := sb.Command(context.Background(), "sh", "-c", "head -c 3000000 /dev/zero & head -c 2000000 /dev/zero >&2; wait")
	var w plainCounter
	cmd.Stdout, cmd.Stderr = &w, &w
	if err := cmd.Run(); err != nil || w.n != 5000000 {
		t.Errorf("Run: %v, %d bytes; want 5000000", err, w.n)
	}
}
