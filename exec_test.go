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
)

// execProc is one line of `ps -o pid,ppid,stat,comm` inside a sandbox.
type execProc struct {
	pid, ppid  int
	stat, comm string
}

func (p execProc) String() string {
	return fmt.Sprintf("pid=%d ppid=%d stat=%s comm=%s", p.pid, p.ppid, p.stat, p.comm)
}

// execProcs lists the processes in the sandbox.
func execProcs(t testing.TB, sb *sandbox.Sandbox) []execProc {
	t.Helper()
	r := mustExec(t, sb, "ps -o pid,ppid,stat,comm")
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
// container's init (pid 1), the supervisor (the first child of pid 1), nor
// the ps command that lists them (and the exec shell it runs under). In a
// sandbox made with Limits{Lifetime: -1} the supervisor has no lifetime
// sleep, so after a kill this must be empty.
func execLeftovers(ps []execProc) []execProc {
	byPID := map[int]execProc{}
	supervisor := 0
	for _, p := range ps {
		byPID[p.pid] = p
		if p.ppid == 1 && (supervisor == 0 || p.pid < supervisor) {
			supervisor = p.pid
		}
	}
	ok := map[int]bool{1: true, supervisor: true}
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

// execWaitClean polls (the kernel and docker-init reap asynchronously) until
// only the supervisor's processes remain, and fails the test if that does not
// happen within 5 s. It also fails if any sleep process exists at the end.
func execWaitClean(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps := execProcs(t, sb)
		left := execLeftovers(ps)
		if len(left) == 0 {
			for _, p := range ps {
				if p.comm == "sleep" {
					t.Fatalf("a sleep process remains: %v (all: %v)", p, ps)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left after the kill: %v (all: %v)", left, ps)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execUsable checks that the sandbox still runs commands.
func execUsable(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	r := mustExec(t, sb, "echo ok")
	if r.Stdout != "ok\n" || r.Stderr != "" || r.ExitCode != 0 {
		t.Fatalf("echo ok after kill: %+v", r)
	}
}

// execWaitFile polls until name exists in the sandbox.
func execWaitFile(t testing.TB, sb *sandbox.Sandbox, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := mustExec(t, sb, "test -e "+name)
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
			"":          "1000 1000\n",
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
// cancel) ends the command and everything it started, returns promptly, and
// leaves the sandbox usable with nothing but the supervisor running. Every
// sandbox here has no Lifetime, so the supervisor runs no sleep of its own
// and any sleep process found afterwards is a survivor.
func TestExecKill(t *testing.T) {
	t.Parallel()
	noLifetime := sandbox.Limits{Lifetime: -1}

	t.Run("ExecTimeout", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, ExecTimeout: time.Second}))
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
		if took > 3*time.Second {
			t.Fatalf("Exec took %v with a 1s ExecTimeout", took)
		}
		t.Logf("ExecTimeout 1s: Exec returned after %v (Result.Duration %v)", took, r.Duration)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("ContextDeadline", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		const deadline = 2 * time.Second
		ctx, cancel := context.WithTimeout(testCtx(t), deadline)
		defer cancel()
		var out bytes.Buffer
		c := sb.Command(ctx, "sh", "-c", "sleep 1000 & sleep 1000 & echo started; wait")
		c.Stdout = &out
		start := time.Now()
		err := c.Run()
		took := time.Since(start)
		var ee *sandbox.ExitError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Run = %v; want *ExitError Code 137 matching DeadlineExceeded", err)
		}
		if out.String() != "started\n" {
			t.Fatalf("stdout = %q", out.String())
		}
		if took > deadline+2*time.Second {
			t.Fatalf("Run took %v with a %v deadline", took, deadline)
		}
		t.Logf("ctx deadline %v: Run returned after %v: %v", deadline, took, err)
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
		case <-time.After(10 * time.Second):
			t.Fatal("Exec did not return within 10s of cancel")
		}
		took := time.Since(start)
		if !errors.Is(got.err, context.Canceled) {
			t.Fatalf("Exec err = %v; want context.Canceled", got.err)
		}
		if got.r == nil || got.r.ExitCode != 137 || got.r.TimedOut {
			t.Fatalf("Result = %+v; want exit 137, not TimedOut", got.r)
		}
		if took > 3*time.Second {
			t.Fatalf("Exec returned %v after cancel", took)
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
		if took > 3*time.Second {
			t.Fatalf("Wait returned %v after cancel", took)
		}
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
		if took > 3*time.Second {
			t.Fatalf("Wait returned %v after cancel", took)
		}
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("HoldsStdout", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		// The shell exits at once, but the sleep it left behind keeps
		// stdout open, so the stream does not end with the shell. (Docker
		// itself closes an exec's streams 2 s after its main process exits,
		// so the deadline must come before that to be what ends the wait.)
		const deadline = 1500 * time.Millisecond
		ctx, cancel := context.WithTimeout(testCtx(t), deadline)
		defer cancel()
		var out bytes.Buffer
		c := sb.Command(ctx, "sh", "-c", "(sleep 1000 &); echo started; exit 0")
		c.Stdout = &out
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
		if took > deadline+2*time.Second {
			t.Fatalf("Run took %v with a %v deadline", took, deadline)
		}
		t.Logf("stdout held open: Run returned after %v: %v", took, err)
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("OtherUser", func(t *testing.T) {
		t.Parallel()
		// Commands of another user than the supervisor's are killed by a
		// one-off exec as that user.
		sb := newSandbox(t, sandbox.WithLimits(noLifetime))
		took, err := execCancelAfterStart(t, sb, "0",
			"sleep 1000 & setsid sleep 1000 >/dev/null 2>&1 </dev/null & "+startedSleeps(2)+"; wait")
		var ee *sandbox.ExitError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ee) || ee.Code != 137 {
			t.Fatalf("Wait = %v; want *ExitError Code 137 matching Canceled", err)
		}
		if took > 3*time.Second {
			t.Fatalf("Wait returned %v after cancel", took)
		}
		execWaitClean(t, sb)
		execUsable(t, sb)
	})

	t.Run("Repeated", func(t *testing.T) {
		t.Parallel()
		// Several kills in a row in one sandbox, each leaving it clean.
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, ExecTimeout: 2 * time.Second}))
		for i := range 3 {
			r := mustExec(t, sb, "sleep 1000 & sleep 1000 & echo started; wait")
			if !r.TimedOut || r.ExitCode != 137 || r.Stdout != "started\n" {
				t.Fatalf("round %d: %+v", i, r)
			}
			execWaitClean(t, sb)
			execUsable(t, sb)
		}
	})
}

func TestExecForkBombKill(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, PIDs: 64, ExecTimeout: 2 * time.Second}))
	start := time.Now()
	r, err := sb.Exec(testCtx(t), "f(){ f & f & }; f; wait")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	// The bomb's first shell may well have exited (0) once its direct
	// children did; its descendants kept the streams open until the kill.
	if !r.TimedOut || (r.ExitCode != 0 && r.ExitCode != 137) {
		t.Fatalf("fork bomb: exit %d TimedOut %v (stderr %q); want TimedOut", r.ExitCode, r.TimedOut, r.Stderr)
	}
	if !strings.Contains(r.Stderr, "fork") {
		t.Errorf("fork bomb never hit the PIDs limit? stderr %q", r.Stderr)
	}
	if took > 10*time.Second {
		t.Fatalf("fork bomb: Exec took %v with a 2s ExecTimeout", took)
	}
	t.Logf("fork bomb killed: Exec returned after %v, exit %d, stderr %d bytes, first line %q",
		took, r.ExitCode, len(r.Stderr), strings.SplitN(r.Stderr, "\n", 2)[0])
	execWaitClean(t, sb)
	execUsable(t, sb)
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

// TestExecOutputBounded runs `yes` until ExecTimeout kills it and checks that
// Exec keeps exactly OutputBytes while the host's memory stays flat. It is not
// parallel so that no other test's allocations blur the measurement.
func TestExecOutputBounded(t *testing.T) {
	const limit = 64 << 10
	rec := &execRecorder{}
	sb := newSandbox(t,
		sandbox.WithLimits(sandbox.Limits{OutputBytes: limit, ExecTimeout: 10 * time.Second}),
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

	start := time.Now()
	r, err := sb.Exec(testCtx(t), "yes")
	took := time.Since(start)
	close(stop)
	<-sampled
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
	if produced < 16*limit {
		t.Fatalf("the command produced only %d bytes; the test needs far more than the %d-byte limit", produced, limit)
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
// seconds and reports the throughput. Not parallel, for a clean figure.
func TestExecStreamThroughput(t *testing.T) {
	sb := newSandbox(t)
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Second)
	defer cancel()
	var w execCountWriter
	c := sb.Command(ctx, "yes")
	c.Stdout = &w
	start := time.Now()
	err := c.Run()
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v; want DeadlineExceeded", err)
	}
	n := w.n.Load()
	if n < 1<<20 {
		t.Fatalf("streamed %d bytes", n)
	}
	t.Logf("streamed %d MiB in %v: %.0f MiB/s", n>>20, took.Round(time.Millisecond), float64(n)/(1<<20)/took.Seconds())
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
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return within 10s of Close")
	}
	took := time.Since(start)
	if !errors.Is(werr, sandbox.ErrClosed) {
		t.Fatalf("Wait = %v for a command whose sandbox was closed; want ErrClosed", werr)
	}
	t.Logf("Close with a running command: Close+Wait took %v, Wait: %v", took, werr)
	if took > 5*time.Second {
		t.Fatalf("Wait returned %v after Close", took)
	}

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
