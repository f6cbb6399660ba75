package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// execProc is one line of `ps -o pid,ppid,stat,comm` inside a sandbox.
type execProc struct {
	pid, ppid  int
	stat, comm string
}

func (p execProc) String() string {
	return fmt.Sprintf("pid=%d ppid=%d stat=%s comm=%s", p.pid, p.ppid, p.stat, p.comm)
}

// execCheck runs a command that checks something (ps, echo ok, a count)
// and returns its result. In a sandbox with a short ExecTimeout, a loaded
// engine can take all of it to start the command, which is then killed
// before it could answer; such a run says nothing about what is checked,
// so it is run again, for up to testenv.HangGuard.
func execCheck(t testing.TB, sb *sandbox.Sandbox, script string) *sandbox.Result {
	t.Helper()
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		r := mustExec(t, sb, script)
		if !r.TimedOut {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q: killed by the sandbox's ExecTimeout every time for %v: %+v", script, testenv.HangGuard, r)
		}
		t.Logf("%q: killed by the sandbox's ExecTimeout after %v (the engine was slow to run it); again", script, r.Duration)
	}
}

// execProcs lists the processes in the sandbox.
func execProcs(t testing.TB, sb *sandbox.Sandbox) []execProc {
	t.Helper()
	r := execCheck(t, sb, "ps -o pid,ppid,stat,comm")
	if r.ExitCode != 0 {
		t.Fatalf("ps: exit %d, stderr %q", r.ExitCode, r.Stderr)
	}
	var ps []execProc
	for i, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if i == 0 { // header
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			t.Fatalf("ps: unexpected line %q in %q", line, r.Stdout)
		}
		pid, err1 := strconv.Atoi(f[0])
		ppid, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("ps: unexpected line %q", line)
		}
		ps = append(ps, execProc{pid: pid, ppid: ppid, stat: f[2], comm: strings.Join(f[3:], " ")})
	}
	return ps
}

// execLeftovers returns the processes in the sandbox that are neither the
// sandbox's agent (pid 1) nor the ps command that lists them (and the shell
// it runs under). After a kill this must be empty.
func execLeftovers(ps []execProc) []execProc {
	byPID := map[int]execProc{}
	for _, p := range ps {
		byPID[p.pid] = p
	}
	ok := map[int]bool{1: true}
	for _, p := range ps {
		if p.comm != "ps" {
			continue
		}
		// ps and its ancestors up to the exec's entry (ppid 0).
		for q, seen := p, 0; seen < len(ps); seen++ {
			ok[q.pid] = true
			if q.ppid == 0 || q.ppid == 1 {
				break
			}
			if q = byPID[q.ppid]; q.pid == 0 {
				break
			}
		}
	}
	var left []execProc
	for _, p := range ps {
		if !ok[p.pid] {
			left = append(left, p)
		}
	}
	return left
}

// execWaitClean polls (the kernel and the agent reap asynchronously) until
// only the agent remains, and fails the test if that does not
// happen within testenv.HangGuard (a process that survived the kill stays
// for good; one that is merely slow to be reaped goes within milliseconds
// of getting CPU). It also fails if any sleep process exists at the end.
func execWaitClean(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(testenv.HangGuard)
	for polls := 1; ; polls++ {
		ps := execProcs(t, sb)
		left := execLeftovers(ps)
		if len(left) == 0 {
			for _, p := range ps {
				if p.comm == "sleep" {
					t.Fatalf("a sleep process remains: %v (all: %v)", p, ps)
				}
			}
			t.Logf("no process left after the kill (seen at poll %d, %v after the kill returned)", polls, time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left %v after the kill: %v (all: %v)", testenv.HangGuard, left, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execUsable checks that the sandbox still runs commands.
func execUsable(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	r := execCheck(t, sb, "echo ok")
	if r.Stdout != "ok\n" || r.Stderr != "" || r.ExitCode != 0 {
		t.Fatalf("echo ok after kill: %+v", r)
	}
}

// execWaitFile polls until name exists in the sandbox (hang guard:
// testenv.HangGuard; the engine may take seconds to start each exec).
func execWaitFile(t testing.TB, sb *sandbox.Sandbox, name string) {
	t.Helper()
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		r := execCheck(t, sb, "test -e "+name)
		if r.ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startedSleeps is shell that waits until at least n sleep processes exist
// in the sandbox and then prints "started", so that a test knows the
// processes it is about to have killed really ran.
func startedSleeps(n int) string {
	return fmt.Sprintf(`until [ "$(ps -o comm | grep -cx sleep)" -ge %d ]; do :; done; echo started`, n)
}

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

// execCancelAfterStart runs script as user, waits for its "started" line,
// then cancels its context. It returns Wait's error and how long Wait took
// after the cancel, and checks that nothing more was written to stdout.
func execCancelAfterStart(t *testing.T, sb *sandbox.Sandbox, user, script string) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	c := sb.Command(ctx, "sh", "-c", script)
	c.User = user
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	start := time.Now()
	cancel()
	rest, _ := io.ReadAll(br)
	err = c.Wait()
	took := time.Since(start)
	if len(rest) != 0 {
		t.Errorf("unexpected output after started: %q", rest)
	}
	return took, err
}

// TestExecKill checks that a kill (ExecTimeout, context deadline, context
// cancel) ends the command and everything it started, makes Wait return,
// and leaves the sandbox usable with nothing but the agent running; any
// sleep process found afterwards is a survivor.
//
// How long a kill takes depends on the machine's load (the engine alone can
// take seconds to start an exec), so durations are reported with t.Logf and
// never asserted; testCtx and testenv.HangGuard only catch hangs. The lower
// bounds kept are guaranteed: a kill cannot come before the deadline that
// caused it.
func TestExecKill(t *testing.T) {
	t.Parallel()
	noLifetime := sandbox.Limits{Lifetime: -1}

	t.Run("ExecTimeout", func(t *testing.T) {
		t.Parallel()
		const timeout = time.Second
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, ExecTimeout: timeout}))
		start := time.Now()
		r, err := sb.Exec(testCtx(t), "sleep 1000 & sleep 1000 & echo started; wait")
		took := time.Since(start)
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		// On a loaded host the engine may take most of the second to start
		// the command, so it may not have got as far as the echo.
		if !r.TimedOut || r.ExitCode != 137 || (r.Stdout != "started\n" && r.Stdout != "") || r.OOMKilled {
			t.Fatalf("Result = %+v; want TimedOut, exit 137", r)
		}
		if took < timeout {
			t.Fatalf("Exec returned after %v, before its %v ExecTimeout", took, timeout)
		}
		t.Logf("ExecTimeout %v: Exec returned after %v (Result.Duration %v, stdout %q)", timeout, took, r.Duration, r.Stdout)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("ContextDeadline", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		const deadline = 2 * time.Second
		start := time.Now()
		ctx, cancel := context.WithTimeout(testCtx(t), deadline)
		defer cancel()
		var out bytes.Buffer
		c := sb.Command(ctx, "sh", "-c", "sleep 1000 & sleep 1000 & echo started; wait")
		c.Stdout = &out
		err := c.Run()
		took := time.Since(start)
		var ee *sandbox.ExitError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Run = %v; want *ExitError Code 137 matching DeadlineExceeded", err)
		}
		// "" when the engine took the whole deadline to start the command.
		if out.String() != "started\n" && out.String() != "" {
			t.Fatalf("stdout = %q", out.String())
		}
		if took < deadline {
			t.Fatalf("Run returned after %v, before its %v deadline", took, deadline)
		}
		t.Logf("ctx deadline %v: Run returned after %v (stdout %q): %v", deadline, took, out.String(), err)
		// Exec reports a context deadline as TimedOut, not as an error.
		ctx2, cancel2 := context.WithTimeout(testCtx(t), time.Second)
		defer cancel2()
		r, err := sb.Exec(ctx2, "sleep 1000")
		if err != nil || !r.TimedOut || r.ExitCode != 137 {
			t.Fatalf("Exec with deadline = %+v, %v; want TimedOut exit 137, nil error", r, err)
		}
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("ContextCancel", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		type ret struct {
			r   *sandbox.Result
			err error
		}
		done := make(chan ret, 1)
		go func() {
			r, err := sb.Exec(ctx, "sleep 1000 & sleep 1000 & "+startedSleeps(2)+" > /tmp/started; wait")
			done <- ret{r, err}
		}()
		execWaitFile(t, sb, "/tmp/started")
		start := time.Now()
		cancel()
		var got ret
		select {
		case got = <-done:
		case <-time.After(testenv.HangGuard):
			t.Fatalf("hang: Exec did not return within %v of cancel", testenv.HangGuard)
		}
		took := time.Since(start)
		if !errors.Is(got.err, context.Canceled) {
			t.Fatalf("Exec err = %v; want context.Canceled", got.err)
		}
		if got.r == nil || got.r.ExitCode != 137 || got.r.TimedOut {
			t.Fatalf("Result = %+v; want exit 137, not TimedOut", got.r)
		}
		t.Logf("cancel: Exec returned %v after cancel", took)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("Daemons", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		// A child in a new session, a nohup-style child ignoring HUP, and a
		// double fork into a new session re-parented to init, all with
		// output redirected; the kill comes once all three sleep.
		script := `setsid sleep 1000 </dev/null >/dev/null 2>&1 &
(trap '' HUP; exec sleep 1000) </dev/null >/dev/null 2>&1 &
(setsid sh -c 'sleep 1000 & wait' </dev/null >/dev/null 2>&1 &)
` + startedSleeps(3) + `
sleep 1000`
		took, err := execCancelAfterStart(t, sb, "", script)
		var ee *sandbox.ExitError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Wait = %v; want *ExitError Code 137 matching Canceled", err)
		}
		t.Logf("daemons: Wait returned %v after cancel", took)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("TrapTERM", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		script := `trap '' TERM INT HUP QUIT
sh -c 'trap "" TERM INT HUP QUIT; sleep 1000 & wait' &
` + startedSleeps(1) + `
wait`
		took, err := execCancelAfterStart(t, sb, "", script)
		var ee *sandbox.ExitError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Wait = %v; want *ExitError Code 137 matching Canceled", err)
		}
		t.Logf("signals trapped: Wait returned %v after cancel", took)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("HoldsStdout", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		// The shell exits at once, but the sleep it left behind keeps
		// stdout open, so the stream does not end with the shell: the
		// deadline has to end the wait and kill the sleep. Docker itself
		// closes an exec's streams 2 s after its main process exits, so
		// the deadline must pass within those 2 s to be what ends the
		// wait. A clock deadline set before Start cannot promise that on a
		// loaded machine (the engine may take longer than the deadline to
		// start the command, and the kill then lands before the shell's
		// exit), so the deadline passes when "started" arrives: just as the
		// shell exits, whatever the engine's speed.
		ctx, expire := testenv.ManualDeadline(testCtx(t))
		defer expire()
		out := &execLines{onLine: func(line string) {
			if line == "started" {
				expire()
			}
		}}
		c := sb.Command(ctx, "sh", "-c", "(sleep 1000 &); echo started; exit 0")
		c.Stdout = out
		start := time.Now()
		err := c.Run()
		took := time.Since(start)
		var ee *sandbox.ExitError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ee) {
			t.Fatalf("Run = %v; want *ExitError matching DeadlineExceeded", err)
		}
		if out.String() != "started\n" {
			t.Fatalf("stdout = %q", out.String())
		}
		// The exit status is the shell's: 0 when it had exited and the
		// kill took the sleep that held its stdout (the case at hand), 137
		// when the kill overtook the shell between its echo and its exit.
		switch ee.Code {
		case 0:
			t.Logf("stdout held open after the shell exited: Run returned %v after Start: %v", took, err)
		case 137:
			t.Logf("the kill overtook the shell before its exit: Run returned %v after Start: %v", took, err)
		default:
			t.Fatalf("Run = %v; want exit status 0 (the shell's) or 137 (killed)", err)
		}
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("OtherUser", func(t *testing.T) {
		t.Parallel()
		// Commands of another user than the sandbox's (here root, still
		// without capabilities) are killed the same way.
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		took, err := execCancelAfterStart(t, sb, "0",
			"sleep 1000 & setsid sleep 1000 >/dev/null 2>&1 </dev/null & "+startedSleeps(2)+"; wait")
		var ee *sandbox.ExitError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Wait = %v; want *ExitError Code 137 matching Canceled", err)
		}
		t.Logf("other user: Wait returned %v after cancel", took)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("Repeated", func(t *testing.T) {
		t.Parallel()
		// Several kills in a row in one sandbox, each leaving it clean.
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, ExecTimeout: 2 * time.Second}))
		for i := range 3 {
			r := mustExec(t, sb, "sleep 1000 & sleep 1000 & echo started; wait")
			// Stdout is "" when the engine took the whole timeout to start
			// the command.
			if !r.TimedOut || r.ExitCode != 137 || (r.Stdout != "started\n" && r.Stdout != "") {
				t.Fatalf("round %d: %+v", i, r)
			}
			t.Logf("round %d: killed after %v", i, r.Duration)
			execWaitClean(t, sb)
			execUsable(t, sb)
		}
	})
}

// execLines is an io.Writer that calls onLine with each complete line
// written to it (without the newline) and keeps everything.
type execLines struct {
	onLine func(string)

	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
}

func (w *execLines) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.partial = append(w.partial, p...)
	var lines []string
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		lines = append(lines, string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	w.mu.Unlock()
	for _, l := range lines {
		w.onLine(l)
	}
	return len(p), nil
}

func (w *execLines) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// execBombScript runs a fork bomb that cannot die out by itself, then waits
// for it to fill the PIDs limit and never ends by itself either.
//
// Busybox sh exits when a fork fails, so a bomb of shells (f(){ f & f & })
// drains to nothing on its own once it hits the limit, and under load it
// may do so before a timeout comes. Here every member is an awk that loops
// forever on system("awk ... &"): awk's system() returns -1 when the fork
// is refused and the loop goes on, so no member ever ends and the bomb
// stays at the limit, re-forking into every slot that frees up.
//
// The command's own shell uses builtins only once the bomb runs (it could
// not fork any more): it polls the PIDs controller's count of refused
// forks until it rises, prints "saturated", and replaces itself with a
// long sleep (exec needs no new process).
const execBombScript = `ev=/sys/fs/cgroup/pids/pids.events
[ -r $ev ] || ev=/sys/fs/cgroup/pids.events
refused() { r=0; while read -r k v; do [ "$k" = max ] && r=$v; done <$ev; }
echo 'BEGIN { while (1) system("awk -f /tmp/bomb.awk </dev/null >/dev/null 2>&1 &") }' >/tmp/bomb.awk
refused; r0=$r
awk -f /tmp/bomb.awk </dev/null >/dev/null 2>&1 &
until refused; [ "$r" -gt "$r0" ]; do :; done
echo saturated
exec sleep 1000`

// TestExecForkBombKill: a fork bomb that never dies out, killed by
// ExecTimeout, leaves no process behind (neither in ps nor in the PIDs
// controller's count), and the sandbox runs commands again.
func TestExecForkBombKill(t *testing.T) {
	t.Parallel()
	const timeout = 5 * time.Second
	// Bounded: 64 processes at most, half a CPU, 5 s per round.
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, PIDs: 64, CPUs: 0.5, ExecTimeout: timeout}))
	const rounds = 3
	for round := 1; round <= rounds; round++ {
		start := time.Now()
		r, err := sb.Exec(testCtx(t), execBombScript)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("Exec: %v", err)
		}
		// The command never ends by itself: only the timeout can end it.
		if !r.TimedOut || r.ExitCode != 137 || r.OOMKilled {
			t.Fatalf("fork bomb: %+v; want TimedOut, exit 137", r)
		}
		if took < timeout {
			t.Fatalf("fork bomb: Exec returned after %v, before its %v ExecTimeout", took, timeout)
		}
		saturated := r.Stdout == "saturated\n"
		if !saturated && r.Stdout != "" {
			t.Fatalf("fork bomb: stdout %q", r.Stdout)
		}
		t.Logf("round %d: fork bomb killed by its %v ExecTimeout; Exec returned after %v (Duration %v); bomb at the PIDs limit before the kill: %v",
			round, timeout, took, r.Duration, saturated)
		execWaitClean(t, sb)
		execPIDsSettled(t, sb)
		execUsable(t, sb)
		if saturated {
			return
		}
		// The engine took most of the timeout to start the command, and
		// the kill came before the bomb filled the limit: again, so that
		// the kill is also seen against a full bomb.
	}
	t.Logf("in %d rounds the engine never started the command early enough for the bomb to fill the PIDs limit before the timeout; every kill was checked, none against a full bomb", rounds)
}

// execPIDsSettled polls until the sandbox's PIDs controller counts exactly
// the tasks (threads, the agent's included) of the processes visible in
// /proc (nothing hidden or half-dead is left of a kill), and fails the test
// if that does not happen within testenv.HangGuard.
func execPIDsSettled(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	const script = `n=0; for d in /proc/[0-9]*; do
	while read -r k v; do [ "$k" = Threads: ] && n=$((n + v)); done <$d/status 2>/dev/null
done
for f in /sys/fs/cgroup/pids/pids.current /sys/fs/cgroup/pids.current; do [ -r $f ] && { read -r c <$f; break; }; done
echo "$n $c"`
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		r := execCheck(t, sb, script)
		var procs, tasks int
		if _, err := fmt.Sscanf(r.Stdout, "%d %d", &procs, &tasks); err != nil || r.ExitCode != 0 {
			t.Fatalf("counting processes: %+v", r)
		}
		if procs == tasks {
			t.Logf("pids.current = %d = tasks of the processes in /proc", tasks)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pids.current = %d but %d tasks of the processes in /proc, %v after the kill", tasks, procs, testenv.HangGuard)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execRecorder is a slog.Handler keeping the attributes of sandbox.exec
// records, to read how many bytes a command wrote.
type execRecorder struct {
	mu   sync.Mutex
	recs []map[string]slog.Value
}

func (h *execRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *execRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *execRecorder) WithGroup(string) slog.Handler            { return h }
func (h *execRecorder) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sandbox.exec" {
		return nil
	}
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	h.mu.Lock()
	h.recs = append(h.recs, m)
	h.mu.Unlock()
	return nil
}

func (h *execRecorder) last() map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recs) == 0 {
		return nil
	}
	return h.recs[len(h.recs)-1]
}

// vmRSS returns this process's resident set size in bytes.
func vmRSS(t testing.TB) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestExecOutputBounded runs `yes` until a deadline kills it and checks that
// Exec keeps exactly OutputBytes while the host's memory stays flat. It is not
// parallel so that no other test's allocations blur the measurement.
//
// However slowly the engine starts the command, far more than the limit
// passes through before the kill: the command marks the point where it has
// written `enough` bytes, and only then does the test let the deadline pass.
func TestExecOutputBounded(t *testing.T) {
	const limit = 64 << 10
	const enough = 128 << 20
	rec := &execRecorder{}
	sb := newSandbox(t,
		sandbox.WithLimits(sandbox.Limits{OutputBytes: limit, ExecTimeout: -1}),
		sandbox.WithLogger(slog.New(rec)))

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0, sys0, rss0 := ms.HeapAlloc, ms.Sys, vmRSS(t)
	var peakHeap, peakRSS atomic.Uint64
	peakHeap.Store(heap0)
	peakRSS.Store(rss0)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peakHeap.Load() {
				peakHeap.Store(m.HeapAlloc)
			}
			if r := vmRSS(t); r > peakRSS.Load() {
				peakRSS.Store(r)
			}
		}
	}()

	ctx, expire := testenv.ManualDeadline(testCtx(t))
	defer expire()
	type ret struct {
		r   *sandbox.Result
		err error
	}
	done := make(chan ret, 1)
	start := time.Now()
	go func() {
		// head writes `enough` bytes of yes to stdout, then the mark, then
		// cat passes the rest of yes on until the kill.
		r, err := sb.Exec(ctx, fmt.Sprintf("yes | { head -c %d; touch /tmp/enough; exec cat; }", enough))
		done <- ret{r, err}
	}()
	execWaitFile(t, sb, "/tmp/enough")
	expire()
	var got ret
	select {
	case got = <-done:
	case <-time.After(testenv.HangGuard):
		t.Fatalf("hang: Exec did not return within %v of its deadline", testenv.HangGuard)
	}
	took := time.Since(start)
	close(stop)
	<-sampled
	r, err := got.r, got.err
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	runtime.ReadMemStats(&ms)
	if !r.Truncated || !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("Result: Truncated %v TimedOut %v exit %d; want true true 137", r.Truncated, r.TimedOut, r.ExitCode)
	}
	if len(r.Stdout) != limit || r.Stdout != strings.Repeat("y\n", limit/2) {
		t.Fatalf("len(Stdout) = %d; want exactly %d bytes of y lines", len(r.Stdout), limit)
	}
	if r.Stderr != "" {
		t.Fatalf("Stderr = %q", r.Stderr)
	}
	produced := int64(-1)
	if m := rec.last(); m != nil {
		produced = m["stdout_bytes"].Int64()
	}
	const mib = 1 << 20
	heapGrowth := int64(peakHeap.Load()) - int64(heap0)
	rssGrowth := int64(peakRSS.Load()) - int64(rss0)
	t.Logf("yes for %v: %d MiB produced (%.0f MiB/s), kept %d bytes; host heap peak +%.1f MiB, RSS peak +%.1f MiB, Sys %d -> %d MiB",
		took.Round(time.Millisecond), produced/mib, float64(produced)/mib/took.Seconds(), len(r.Stdout),
		float64(heapGrowth)/mib, float64(rssGrowth)/mib, sys0/mib, ms.Sys/mib)
	// head's writes block until the host reads, so by the mark the host had
	// read all of `enough` but what the pipes and sockets on the way hold
	// (far less than half).
	if produced < enough/2 {
		t.Fatalf("the audit log counts %d bytes of stdout; the command wrote %d before the kill", produced, enough)
	}
	if heapGrowth > 64*mib || rssGrowth > 64*mib {
		t.Fatalf("host memory grew while %d MiB passed through: heap +%d MiB, RSS +%d MiB", produced/mib, heapGrowth/mib, rssGrowth/mib)
	}
	execUsable(t, sb)
}

// execCountWriter counts the bytes written to it.
type execCountWriter struct{ n atomic.Int64 }

func (w *execCountWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// TestExecStreamThroughput streams `yes` into a counting writer for a few
// seconds from its first byte, and reports the throughput (a figure, not a
// claim: the machine may be busy). Not parallel, for a clean figure.
func TestExecStreamThroughput(t *testing.T) {
	const measure = 3 * time.Second
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: -1}))
	// The deadline passes `measure` after the first byte, however long the
	// engine took to start the command.
	ctx, expire := testenv.ManualDeadline(testCtx(t))
	defer expire()
	var w execCountWriter
	c := sb.Command(ctx, "yes")
	c.Stdout = &w
	start := time.Now()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	for w.n.Load() == 0 {
		if time.Since(start) > testenv.HangGuard {
			expire()
			c.Wait()
			t.Fatalf("hang: no output from yes within %v", testenv.HangGuard)
		}
		time.Sleep(time.Millisecond)
	}
	first := time.Now()
	n0 := w.n.Load()
	time.AfterFunc(measure, expire)
	err := c.Wait()
	took := time.Since(first)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v; want DeadlineExceeded", err)
	}
	n := w.n.Load()
	if n <= n0 {
		t.Fatalf("streamed %d bytes in all, nothing after the first %d", n, n0)
	}
	t.Logf("first byte %v after Start; then streamed %d MiB in %v: %.0f MiB/s",
		first.Sub(start).Round(time.Millisecond), n>>20, took.Round(time.Millisecond), float64(n)/(1<<20)/took.Seconds())
}

func TestExecOutputTruncated(t *testing.T) {
	t.Parallel()
	const limit = 1000
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{OutputBytes: limit}))
	ctx := testCtx(t)
	want := strings.Repeat("y\n", limit/2)

	out, err := sb.Command(ctx, "sh", "-c", "yes | head -c 5000").Output()
	if !errors.Is(err, sandbox.ErrOutputTruncated) || string(out) != want {
		t.Fatalf("Output = %d bytes, %v; want exactly %d bytes and ErrOutputTruncated", len(out), err, limit)
	}
	var ee *sandbox.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("successful command reported as %v", ee)
	}
	out, err = sb.Command(ctx, "sh", "-c", "yes | head -c 600; yes | head -c 600 >&2").CombinedOutput()
	if !errors.Is(err, sandbox.ErrOutputTruncated) || len(out) != limit {
		t.Fatalf("CombinedOutput = %d bytes, %v", len(out), err)
	}
	// Exactly the limit is not truncation.
	out, err = sb.Command(ctx, "sh", "-c", fmt.Sprintf("yes | head -c %d", limit)).Output()
	if err != nil || string(out) != want {
		t.Fatalf("Output of exactly %d bytes = %d bytes, %v", limit, len(out), err)
	}
	// Stderr kept by Output in the ExitError is bounded too.
	out, err = sb.Command(ctx, "sh", "-c", "echo x; yes | head -c 5000 >&2; exit 1").Output()
	if !errors.As(err, &ee) || ee.Code != 1 || string(ee.Stderr) != want || string(out) != "x\n" {
		t.Fatalf("Output = %q, %v (stderr %d bytes)", out, err, len(ee.Stderr))
	}
	// Exec: each stream bounded, Truncated set.
	r := mustExec(t, sb, "yes | head -c 5000; yes n | head -c 3000 >&2")
	if !r.Truncated || r.Stdout != want || r.Stderr != strings.Repeat("n\n", limit/2) || r.ExitCode != 0 {
		t.Fatalf("Exec: Truncated %v, %d/%d bytes, exit %d", r.Truncated, len(r.Stdout), len(r.Stderr), r.ExitCode)
	}
	r = mustExec(t, sb, "yes | head -c 1000; yes | head -c 1000 >&2")
	if r.Truncated || len(r.Stdout) != limit || len(r.Stderr) != limit {
		t.Fatalf("Exec at the limit: Truncated %v, %d/%d bytes", r.Truncated, len(r.Stdout), len(r.Stderr))
	}
	// A streamed writer sees everything.
	var w execCountWriter
	c := sb.Command(ctx, "sh", "-c", "yes | head -c 5000")
	c.Stdout = &w
	if err := c.Run(); err != nil || w.n.Load() != 5000 {
		t.Fatalf("streamed %d bytes, %v; want 5000", w.n.Load(), err)
	}
}

func TestExecConcurrent(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf("i=%d; seq $i $((i+100)); echo err-$i >&2; exit $((i %% 7))", i)
			r, err := sb.Exec(ctx, script)
			if err != nil {
				errs[i] = err
				return
			}
			var want strings.Builder
			for k := i; k <= i+100; k++ {
				fmt.Fprintf(&want, "%d\n", k)
			}
			if r.Stdout != want.String() || r.Stderr != fmt.Sprintf("err-%d\n", i) || r.ExitCode != i%7 {
				errs[i] = fmt.Errorf("exec %d got stdout %q stderr %q exit %d", i, r.Stdout, r.Stderr, r.ExitCode)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestExecClose(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	c := sb.Command(ctx, "sh", "-c", "echo started; sleep 1000")
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	waited := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, br)
		waited <- c.Wait()
	}()
	start := time.Now()
	if err := sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var werr error
	select {
	case werr = <-waited:
	case <-time.After(testenv.HangGuard):
		t.Fatalf("hang: Wait did not return within %v of Close", testenv.HangGuard)
	}
	took := time.Since(start)
	if !errors.Is(werr, sandbox.ErrClosed) {
		t.Fatalf("Wait = %v for a command whose sandbox was closed; want ErrClosed", werr)
	}
	t.Logf("Close with a running command: Close+Wait took %v, Wait: %v", took, werr)

	if err := sb.Command(ctx, "true").Run(); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Command.Run after Close = %v; want ErrClosed", err)
	}
	if _, err := sb.Command(ctx, "true").Output(); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Command.Output after Close = %v; want ErrClosed", err)
	}
	if r, err := sb.Exec(ctx, "echo hi"); !errors.Is(err, sandbox.ErrClosed) || r != nil {
		t.Errorf("Exec after Close = %v, %v; want nil, ErrClosed", r, err)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
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
