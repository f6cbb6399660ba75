package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/docker"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// The sandbox's agent (PID 1) is out of reach of the code it runs: its file
// descriptors (the library's stream), environment and memory cannot be
// opened, it cannot be signalled, stopped or killed, and what it runs has no
// capabilities at all, whatever the user. Root in the sandbox may send
// signals to PID 1 without an error, but the kernel delivers to a PID
// namespace's init only the signals it handles, and the agent drops those:
// it must still answer, and must not be stopped.
func TestAgentUntouchable(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	const opens = `
for f in /proc/1/fd/0 /proc/1/fd/1 /proc/1/fd/2 /proc/1/environ /proc/1/mem /proc/1/root/ /proc/1/task/*/fd/0 /proc/1/task/*/mem; do
	( : <$f ) 2>/dev/null && echo "opened $f"
done
( : >/proc/1/fd/0 ) 2>/dev/null && echo "opened the agent's stdin for writing"
echo done`
	const signals = `
for s in STOP KILL TERM INT QUIT HUP USR1 USR2 PIPE ALRM TSTP SEGV ABRT TRAP ILL SYS BUS FPE XCPU VTALRM PROF PWR; do
	kill -$s 1 2>/dev/null && echo "sent $s"
done
# Every thread too: those that run file operations take on the sandbox
# user's effective identity, but keep root as real and saved user.
for t in /proc/1/task/*; do
	kill -STOP ${t##*/} 2>/dev/null && echo "stopped thread ${t##*/}"
done
echo done`
	// A file operation first: a worker thread takes on the sandbox user.
	if err := sb.WriteFile(testCtx(t), "warm", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"", "0", "1234:1234"} {
		run := func(script string) string {
			c := sb.Command(testCtx(t), "sh", "-c", script)
			c.User = user
			out, err := c.CombinedOutput()
			if err != nil {
				t.Fatalf("as user %q: %q: %v", user, out, err)
			}
			return string(out)
		}
		if out := run(opens); out != "done\n" {
			t.Errorf("as user %q: the agent's files: %q; want only \"done\"", user, out)
		}
		out := run(signals)
		if user != "0" && out != "done\n" {
			t.Errorf("as user %q: signals to the agent: %q; want all refused", user, out)
		}
		if st := run("grep State: /proc/1/status"); !strings.Contains(st, "S (sleeping)") && !strings.Contains(st, "R (running)") {
			t.Errorf("as user %q, after signals (%q): the agent is %q", user, out, st)
		}
		assertAlive(t, sb)
		// File operations (the agent's worker threads) still work.
		if err := sb.WriteFile(testCtx(t), "alive", []byte(user), 0o644); err != nil {
			t.Errorf("as user %q, after signals: WriteFile: %v", user, err)
		}
		if got, err := sb.ReadFile(testCtx(t), "alive"); err != nil || string(got) != user {
			t.Errorf("as user %q, after signals: ReadFile: %q, %v", user, got, err)
		}
		out = run(`grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			if (k == "NoNewPrivs" && v != "1") || (k != "NoNewPrivs" && v != "0000000000000000") {
				t.Errorf("as user %q: %s = %s", user, k, v)
			}
		}
		if n := strings.Count(out, "\n"); n != 6 {
			t.Errorf("as user %q: %d capability lines: %q", user, n, out)
		}
	}
}

// Processes that try to get away from a kill — a new session and a cleared
// environment after a double fork; one that keeps starting itself anew
// under new PIDs and sessions; one that makes itself non-dumpable — all die
// with the command, and Wait returns. A background process another command
// left running (after it exited normally) survives, and so does a command
// still running beside the killed one.
func TestAgentKillEscapes(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{Lifetime: -1, ExecTimeout: -1}))
	ctx := testCtx(t)

	// Left behind by a command that exited normally: must survive.
	if r := execWant(t, sb, "setsid sleep 2001 >/dev/null 2>&1 </dev/null & echo ok", 0); r.Stdout != "ok\n" {
		t.Fatalf("background service: %+v", r)
	}
	// A command running beside the killed one: must survive.
	beside := sb.Command(ctx, "sh", "-c", "sleep 2002 & wait")
	if err := beside.Start(); err != nil {
		t.Fatal(err)
	}
	// Readiness is told by files: the script's own text names the
	// processes, so looking for them would find the script itself.
	const escapes = `
( setsid env -i sh -c ': >/tmp/a.ready; exec sleep 3001' >/dev/null 2>&1 </dev/null & )
cat >/tmp/hop.sh <<'EOF2'
: >/tmp/hop.ready
setsid sh /tmp/hop.sh >/dev/null 2>&1 </dev/null &
exec sleep 0.2
EOF2
( setsid sh /tmp/hop.sh >/dev/null 2>&1 </dev/null & )
( python3 -c '
import ctypes, os, time
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
os.setsid()
if os.fork() == 0:
    open("/tmp/py.ready", "w").close()
    time.sleep(3002)
' >/dev/null 2>&1 </dev/null & )
until [ -e /tmp/a.ready ] && [ -e /tmp/hop.ready ] && [ -e /tmp/py.ready ]; do :; done
echo started
sleep 3003`
	took, err := execCancelAfterStart(t, sb, "", escapes)
	var ee *sandbox.ExitError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ee) || ee.Code != 137 {
		t.Fatalf("Wait after the cancel: %v; want *ExitError 137 matching context.Canceled", err)
	}
	t.Logf("Wait returned %v after the cancel", took)

	// Nothing of the killed command is left, now or a moment later (the
	// hopper would have started a new generation within 0.2 s).
	for i := range 3 {
		r := execWant(t, sb, "sleep 0.3; ps -eo pid,args", 0)
		for _, gone := range []string{"sleep 3001", "hop.sh", "sleep 0.2", "time.sleep", "sleep 3003"} {
			if strings.Contains(r.Stdout, gone) {
				t.Errorf("check %d: %q survived the kill:\n%s", i, gone, r.Stdout)
			}
		}
		for _, alive := range []string{"sleep 2001", "sleep 2002"} {
			if !strings.Contains(r.Stdout, alive) {
				t.Errorf("check %d: %q (not the killed command's) was killed too:\n%s", i, alive, r.Stdout)
			}
		}
	}
	cancelBeside(t, sb, beside)
}

// cancelBeside ends a command started beside a test's own.
func cancelBeside(t *testing.T, sb *sandbox.Sandbox, c *sandbox.Cmd) {
	t.Helper()
	execWant(t, sb, "pkill -f 'sleep 200[2]'; true", 0)
	if err := c.Wait(); err != nil {
		t.Logf("the command beside: %v", err)
	}
}

// A process whose main thread has called exit(2) while another thread
// runs on shows state Z (its leader is a zombie) but is alive: the kill
// takes it too, whether it is a child of the command's shell or the
// command itself, and an interpreter whose driver does this is killed and
// restarted at its timeout. Afterwards no thread of it writes anymore.
func TestAgentKillZombieLeader(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: 3 * time.Second}))
	const z = `import ctypes, os, sys, threading, time
def beat():
    while True:
        with open("/tmp/z.beat", "w") as f:
            f.write(repr(time.monotonic()))
        time.sleep(0.02)
threading.Thread(target=beat).start()
time.sleep(0.1)
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the main thread only
`
	if err := sb.WriteFile(testCtx(t), "z.py", []byte(z), 0o644); err != nil {
		t.Fatal(err)
	}
	stopped := func(what string) {
		t.Helper()
		r := execWant(t, sb, "a=$(cat /tmp/z.beat); sleep 0.3; b=$(cat /tmp/z.beat); [ \"$a\" = \"$b\" ] && echo still; ps -eo stat,args | grep '[p]ython3 z.py'; true", 0)
		if r.Stdout != "still\n" {
			t.Errorf("%s: a thread of z.py still runs after the kill: %q", what, r.Stdout)
		}
	}
	for _, script := range []string{"python3 z.py; sleep 1000", "exec python3 z.py"} {
		r, err := sb.Exec(testCtx(t), script)
		if err != nil {
			t.Fatalf("Exec(%q): %v", script, err)
		}
		t.Logf("Exec(%q) returned after %v", script, r.Duration)
		if !r.TimedOut || r.ExitCode != 137 {
			t.Errorf("Exec(%q): %+v; want timed out, 137", script, r)
		}
		stopped(script)
	}
	py := newInterp(t, sb, "python")
	run(t, py, "kept = 1")
	ex := run(t, py, "exec(open('z.py').read())")
	if !ex.StateLost || !ex.TimedOut || ex.Error == nil || ex.Error.Name != "TimeoutError" {
		t.Errorf("a run whose main thread exits: %+v %+v; want state lost, timed out", ex, ex.Error)
	}
	stopped("Interpreter.Run")
	if got := plain(t, run(t, py, "6 * 7")); got != "42" {
		t.Errorf("after the restart: %q", got)
	}
}

// TestAgentVolumeRefilled: the volume holding the agent is a cache the
// library fills once per engine. Removed behind the library's back (docker
// volume rm), or made anew empty, it is filled again by the next New in
// the same process, which works.
func TestAgentVolumeRefilled(t *testing.T) {
	testenv.NotOn(t, podmanAgentVolume, testenv.Podman...)
	t.Parallel()
	cli := engineClient(t)
	name := "agentsandbox-agent-test-" + randomHex(4)
	defer cli.VolumeRemove(context.Background(), name, true)
	d := docker.New(docker.Config{AgentVolume: name})
	defer d.Close()
	opt := sandbox.WithDriver(d)
	for _, step := range []string{"first", "after docker volume rm", "after an empty volume of its name was made"} {
		sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), opt)
		if err != nil {
			t.Fatalf("New %s: %v", step, err)
		}
		assertAlive(t, sb)
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
		// Close returns once the container is removed.
		if err := cli.VolumeRemove(testCtx(t), name, false); err != nil {
			t.Fatalf("%s: docker volume rm: %v", step, err)
		}
		if step == "after docker volume rm" {
			if _, err := cli.VolumeCreate(testCtx(t), volume.CreateOptions{Name: name}); err != nil {
				t.Fatal(err)
			}
		}
	}
}
