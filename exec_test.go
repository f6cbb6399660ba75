package sandbox_test

// Exec against the real engine: a kill (ExecTimeout, a context's deadline
// or cancel) ends every process of the command and leaves the sandbox
// usable, fork bombs included; concurrent Execs; Exec and Close. The Cmd
// API is in cmd_test.go, output bounds in exec_output_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
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
	var r *sandbox.Result
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		if r = mustExec(t, sb, script); r.TimedOut {
			t.Logf("%q: killed by the sandbox's ExecTimeout after %v (the engine was slow to run it); again", script, r.Duration)
		}
		return !r.TimedOut, fmt.Sprintf("%q: killed by the sandbox's ExecTimeout every time: %+v", script, r)
	})
	return r
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
	polls := 0
	var ps []execProc
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		polls++
		ps = execProcs(t, sb)
		left := execLeftovers(ps)
		return len(left) == 0, fmt.Sprintf("processes left after the kill: %v (all: %v)", left, ps)
	})
	for _, p := range ps {
		if p.comm == "sleep" {
			t.Fatalf("a sleep process remains: %v (all: %v)", p, ps)
		}
	}
	t.Logf("no process left after the kill (seen at poll %d, %v after the kill returned)", polls, time.Since(start).Round(time.Millisecond))
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
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		return execCheck(t, sb, "test -e "+name).ExitCode == 0, name + " did not appear"
	})
}

// startedSleeps is shell that waits until at least n sleep processes exist
// in the sandbox and then prints "started", so that a test knows the
// processes it is about to have killed really ran.
func startedSleeps(n int) string {
	return fmt.Sprintf(`until [ "$(ps -o comm | grep -cx sleep)" -ge %d ]; do :; done; echo started`, n)
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
	var tasks int
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		r := execCheck(t, sb, script)
		var procs int
		if _, err := fmt.Sscanf(r.Stdout, "%d %d", &procs, &tasks); err != nil || r.ExitCode != 0 {
			t.Fatalf("counting processes: %+v", r)
		}
		return procs == tasks, fmt.Sprintf("pids.current = %d but %d tasks of the processes in /proc, after the kill", tasks, procs)
	})
	t.Logf("pids.current = %d = tasks of the processes in /proc", tasks)
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
