package sandbox_test

// Limits against the real engine: memory, PIDs, file size, disk, open
// files, CPUs, ExecTimeout, validation and defaults; with helpers the
// engine tests share (engineClient, prune, execWant). The Lifetime and the
// owner's death are in limits_lifetime_test.go.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Every Limits field is checked here against hostile code in a real
// sandbox. Output limits are covered elsewhere.

// engineClient returns a Docker client for inspecting what the library did
// (shared by the test files of this package).
func engineClient(t testing.TB) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// pruneMu keeps this test process's calls of sandbox.Prune out while a
// test needs a dead helper's containers to end by themselves
// (TestOwnerKilledWith20Sandboxes): a Prune would remove them by force.
var pruneMu sync.Mutex

// prune calls sandbox.Prune n times at once (n = 1 when omitted): Prunes
// that find the same dead owner's objects must all succeed.
func prune(ctx context.Context, n ...int) (int, error) {
	pruneMu.Lock()
	defer pruneMu.Unlock()
	calls := 1
	if len(n) > 0 {
		calls = n[0]
	}
	counts := make([]int, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { counts[i], errs[i] = sandbox.Prune(ctx) })
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	return total, errors.Join(errs...)
}

// workdirVolume returns the name of the volume mounted at the sandbox's
// working directory.
func workdirVolume(t testing.TB, cli *client.Client, sb *sandbox.Sandbox) string {
	t.Helper()
	info, err := cli.ContainerInspect(testCtx(t), sb.ID())
	if err != nil {
		t.Fatalf("inspect %s: %v", sb.ID(), err)
	}
	for _, m := range info.Mounts {
		if m.Destination == "/workspace" {
			return m.Name
		}
	}
	t.Fatalf("no volume at /workspace in %+v", info.Mounts)
	return ""
}

// waitContainerGone polls the engine until container id no longer exists.
func waitContainerGone(t testing.TB, cli *client.Client, id string, within time.Duration) {
	t.Helper()
	sandboxtest.Eventually(t, within, func() (bool, string) {
		_, err := cli.ContainerInspect(testCtx(t), id)
		if err != nil && !engine.IsNotFound(err) {
			t.Fatalf("inspect %s: %v", id, err)
		}
		return engine.IsNotFound(err), fmt.Sprintf("container %s still exists", id)
	})
}

// assertVolumeGone fails the test if the named volume exists.
func assertVolumeGone(t testing.TB, cli *client.Client, name string) {
	t.Helper()
	_, err := cli.VolumeInspect(testCtx(t), name)
	if !engine.IsNotFound(err) {
		t.Errorf("volume %s: want not found, got err=%v", name, err)
	}
}

// execWant runs script and checks its exit code.
func execWant(t testing.TB, sb *sandbox.Sandbox, script string, code int) *sandbox.Result {
	t.Helper()
	r := mustExec(t, sb, script)
	if r.ExitCode != code {
		t.Fatalf("Exec(%q): exit %d, want %d\nstdout: %s\nstderr: %s", script, r.ExitCode, code, r.Stdout, r.Stderr)
	}
	return r
}

// assertAlive checks that the sandbox still runs commands.
func assertAlive(t testing.TB, sb *sandbox.Sandbox) {
	t.Helper()
	if r := execWant(t, sb, "echo ok", 0); r.Stdout != "ok\n" {
		t.Fatalf("echo ok: stdout %q", r.Stdout)
	}
}

func TestLimitsMemoryOOM(t *testing.T) {
	t.Parallel()
	const limit = 128 << 20
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{Memory: limit}))

	r := execWant(t, sb, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes", 0)
	if got := strings.TrimSpace(r.Stdout); got != strconv.Itoa(limit) {
		t.Errorf("memory.limit_in_bytes = %s, want %d", got, limit)
	}
	// No swap: the memory+swap limit equals the memory limit.
	r = execWant(t, sb, "cat /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes", 0)
	if got := strings.TrimSpace(r.Stdout); got != strconv.Itoa(limit) {
		t.Errorf("memory.memsw.limit_in_bytes = %s, want %d", got, limit)
	}

	// Up to 1 GiB in 16 MiB chunks, each one written to (so really resident).
	r = execWant(t, sb, `python3 -c '
chunks = []
for i in range(64):
    chunks.append(b"x" * (16 << 20))
print("survived")
'`, 137)
	if !r.OOMKilled {
		t.Errorf("OOMKilled = false after the memory bomb; stderr %q", r.Stderr)
	}
	if strings.Contains(r.Stdout, "survived") || r.TimedOut {
		t.Errorf("bomb result %+v", r)
	}
	// The kernel counted it, and the next command sees no new kill.
	r = execWant(t, sb, "cat /sys/fs/cgroup/memory/memory.oom_control", 0)
	if !strings.Contains(r.Stdout, "oom_kill 1\n") {
		t.Errorf("memory.oom_control after one OOM kill:\n%s", r.Stdout)
	}
	assertAlive(t, sb)
	r = execWant(t, sb, "exit 137", 137)
	if r.OOMKilled {
		t.Error("a plain exit 137 was reported as OOMKilled")
	}

	// Cmd reports it too, in the *ExitError.
	c := sb.Command(testCtx(t), "python3", "-c", "x = bytearray(b'y' * (512 << 20))")
	err := c.Run()
	var ee *sandbox.ExitError
	if !errors.As(err, &ee) || ee.Code != 137 || !ee.OOMKilled {
		t.Errorf("Cmd.Run of a memory bomb: %v (%+v)", err, ee)
	}
	assertAlive(t, sb)
}

// TestLimitsMemoryAgentSpared: memory that no process owns cannot make the
// agent the OOM killer's victim. System V shared memory segments, filled
// and detached over and over past the limit, are destroyed as they are
// detached (shm_rmid_forced in the sandbox's IPC namespace) and bounded by
// TmpSize in all; a process holding segments attached past the limit is
// the one killed; memory held by files in /dev/shm and /tmp (a tmpfs)
// makes the command that asks for more the victim, not the agent, even
// when the agent's own memory is larger. Afterwards the sandbox works. The
// kernel's oom_score_adj shows commands at 1000 and the agent below them,
// at the floor no command may go under.
func TestLimitsMemoryAgentSpared(t *testing.T) {
	t.Parallel()
	l := sandbox.Limits{Memory: 96 << 20, TmpSize: 64 << 20}
	if testenv.Caps(t).Disk != driver.DiskExt4 {
		l.Disk = -1 // a tmpfs working directory of the default size does not fit in 96 MiB (not root on the engine's host)
	}
	sb := newPython(t, sandbox.WithLimits(l))
	// The agent holds the commands' value while it starts one, until the
	// start is confirmed: the command reads the agent's once Start has
	// returned (the line on its stdin says so).
	in, feed := io.Pipe()
	var out strings.Builder
	c := sb.Command(testCtx(t), "sh", "-c", `read started; cat /proc/1/oom_score_adj /proc/self/oom_score_adj; echo $(( $(cat /proc/1/oom_score_adj) - 1 )) > /proc/self/oom_score_adj || echo refused`)
	c.Stdin, c.Stdout = in, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(feed, "started\n")
	feed.Close()
	if err := c.Wait(); err != nil {
		t.Fatalf("%v; output %q", err, out.String())
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 2 {
		t.Fatalf("output %q", out.String())
	}
	agentAdj, cmdAdj := lines[0], lines[1]
	if a, err := strconv.Atoi(agentAdj); err != nil || a >= 1000 || cmdAdj != "1000" || !strings.HasSuffix(out.String(), "\nrefused\n") {
		t.Errorf("oom_score_adj of the agent, a command, and a command going below the agent: %q; want below 1000, 1000, refused", out.String())
	}
	t.Logf("oom_score_adj: agent %s, commands %s", agentAdj, cmdAdj)
	const shm = `python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = []
for i in range(%d):
    id = libc.shmget(0, 16 << 20, 0o1000 | 0o600)
    if id < 0:
        print("shmget", ctypes.get_errno())
        break
    addr = libc.shmat(id, None, 0)
    ctypes.memset(addr, 1, 16 << 20)
    if %s:
        libc.shmdt(ctypes.c_void_p(addr))
    else:
        held.append(addr)
print("done", i)
'`
	// 40 × 16 MiB, detached: each is destroyed at once, nothing adds up.
	r := execWant(t, sb, fmt.Sprintf(shm, 40, "True"), 0)
	if r.Stdout != "done 39\n" {
		t.Errorf("fill and detach 640 MiB of segments: %q %q", r.Stdout, r.Stderr)
	}
	if r := execWant(t, sb, "wc -l < /proc/sysvipc/shm", 0); r.Stdout != "1\n" {
		t.Errorf("segments left after their last detach: %q lines (1 is the header)", r.Stdout)
	}
	// Held attached: beyond TmpSize in all, shmget refuses (ENOSPC, 28);
	// the holder is charged and killed if it reaches the limit first.
	r = execWant(t, sb, fmt.Sprintf(shm, 40, "False")+"; echo exit $?", 0)
	if !strings.Contains(r.Stdout, "shmget 28") && !strings.Contains(r.Stdout, "exit 137") {
		t.Errorf("holding 640 MiB of segments: %q %q; want ENOSPC past TmpSize, or the holder killed", r.Stdout, r.Stderr)
	}
	assertAlive(t, sb)
	// Files in RAM: 60 MiB in /dev/shm and /tmp, then a command that asks
	// for more than is left is killed; the agent is not.
	execWant(t, sb, "head -c 30M /dev/zero > /dev/shm/a; head -c 30M /dev/zero > /tmp/b", 0)
	r = execWant(t, sb, `python3 -c 'x = bytearray(64 << 20)'`, 137)
	if !r.OOMKilled {
		t.Errorf("the command past the limit: %+v; want OOMKilled", r)
	}
	assertAlive(t, sb)
	execWant(t, sb, "rm /dev/shm/a /tmp/b", 0)
	assertAlive(t, sb)
}

// TestLimitsMemoryOOMEvent: the engine's record of the OOM killer acting
// in a sandbox, which the library reads to say a sandbox that stopped ran
// out of memory.
func TestLimitsMemoryOOMEvent(t *testing.T) {
	testenv.NotOn(t, podmanEvents, testenv.Podman...)
	t.Parallel()
	start := time.Now()
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{Memory: 64 << 20}))
	cli := engineClient(t)
	ctx := testCtx(t)
	if engine.DiedOfOOM(ctx, cli, sb.ID(), start) {
		t.Error("an OOM before any")
	}
	if r := execWant(t, sb, `python3 -c 'x = bytearray(256 << 20)'`, 137); !r.OOMKilled {
		t.Fatalf("memory bomb: %+v", r)
	}
	if !engine.DiedOfOOM(ctx, cli, sb.ID(), start) {
		t.Error("the engine's events hold no OOM of the sandbox after an OOM kill")
	}
}

func TestLimitsPIDsForkBomb(t *testing.T) {
	t.Parallel()
	const pids = 64
	// After the kill nothing but the agent may run (execWaitClean).
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{PIDs: pids, CPUs: 0.5, Lifetime: -1, ExecTimeout: -1}))

	// The bomb runs in the background: awks that loop forever re-forking,
	// so it never dies out (see execBombScript). The foreground loop uses
	// only shell builtins (it cannot fork any more) to sample the cgroup's
	// task count and the count of refused forks, printing them every 10
	// samples. Once a line shows the bomb at the limit with forks refused,
	// the test lets the command's deadline pass: whenever the engine got
	// round to starting it.
	const script = `
cg=/sys/fs/cgroup/pids
read max < $cg/pids.max
echo 'BEGIN { while (1) system("awk -f /tmp/bomb.awk </dev/null >/dev/null 2>&1 &") }' >/tmp/bomb.awk
awk -f /tmp/bomb.awk </dev/null >/dev/null 2>&1 &
peak=0 i=0
while :; do
	read c < $cg/pids.current
	[ "$c" -gt "$peak" ] && peak=$c
	i=$((i + 1))
	if [ $((i % 10)) = 0 ]; then
		while read k v; do [ "$k" = max ] && ev=$v; done < $cg/pids.events
		echo "max=$max peak=$peak refused=$ev"
	fi
done
`
	ctx, expire := testenv.ManualDeadline(testCtx(t))
	defer expire()
	// Hang guard: a bomb that never fills the limit is killed anyway, and
	// the checks below say so.
	guard := time.AfterFunc(testenv.HangGuard, expire)
	defer guard.Stop()
	var (
		mu      sync.Mutex
		samples []string
		bad     []string
	)
	out := &execLines{onLine: func(line string) {
		var max, peak, refused int
		if _, err := fmt.Sscanf(line, "max=%d peak=%d refused=%d", &max, &peak, &refused); err != nil {
			mu.Lock()
			bad = append(bad, line)
			mu.Unlock()
			expire()
			return
		}
		mu.Lock()
		samples = append(samples, line)
		mu.Unlock()
		if peak >= max && refused > 0 {
			expire()
		}
	}}
	c := sb.Command(ctx, "sh", "-c", script)
	c.Stdout = out
	start := time.Now()
	err := c.Run()
	took := time.Since(start)
	var ee *sandbox.ExitError
	if !errors.As(err, &ee) || ee.Code != 137 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fork bomb: %v, want *ExitError 137 matching DeadlineExceeded (a kill at the deadline)", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 || len(samples) == 0 {
		t.Fatalf("bomb output: samples %q, unexpected lines %q", samples, bad)
	}
	var max, peak, refused int
	for _, line := range samples {
		fmt.Sscanf(line, "max=%d peak=%d refused=%d", &max, &peak, &refused)
		if peak > max {
			t.Errorf("pids.current %d above pids.max %d: %q", peak, max, line)
		}
	}
	t.Logf("fork bomb: pids.max=%d, peak pids.current=%d, forks refused=%d, %d sample lines; killed, Run returned %v after Start",
		max, peak, refused, len(samples), took)
	if max != pids {
		t.Errorf("pids.max = %d, want %d", max, pids)
	}
	if peak != max || refused == 0 {
		t.Errorf("last sample peak=%d refused=%d: the bomb never hit the limit", peak, refused)
	}

	// Everything the bomb started is gone: neither ps nor the PIDs
	// controller sees anything but the agent and the command looking; and
	// the sandbox answers.
	execWaitClean(t, sb)
	execPIDsSettled(t, sb)
	assertAlive(t, sb)
}

func TestLimitsFileSize(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{FileSize: 1 << 20}))

	r := execWant(t, sb, "ulimit -f", 0)
	// Shells report RLIMIT_FSIZE in 512-byte blocks.
	if got := strings.TrimSpace(r.Stdout); got != "2048" {
		t.Errorf("ulimit -f = %q, want 2048 (1 MiB)", got)
	}
	r = execWant(t, sb, `dd if=/dev/zero of=big bs=64k count=32; echo "rc=$?"; wc -c < big`, 0)
	if !strings.Contains(r.Stderr, "File too large") {
		t.Errorf("dd past the limit: stderr %q, want EFBIG (File too large)", r.Stderr)
	}
	if r.Stdout != "rc=1\n1048576\n" {
		t.Errorf("dd past the limit: stdout %q, want rc=1 and a file of exactly 1048576 bytes", r.Stdout)
	}
	// A writer that does not handle errors itself is not killed by SIGXFSZ
	// either: head fails and the file stops at the limit.
	r = execWant(t, sb, `head -c 2097152 /dev/zero > big2; echo "rc=$?"; wc -c < big2`, 0)
	if r.Stdout != "rc=1\n1048576\n" {
		t.Errorf("head -c 2 MiB: stdout %q stderr %q, want rc=1 and 1048576 bytes", r.Stdout, r.Stderr)
	}
	fi, err := sb.Stat(testCtx(t), "big")
	if err != nil || fi.Size() != 1<<20 {
		t.Errorf("Stat(big) = %v, %v; want 1 MiB", fi, err)
	}
	// Files up to the limit are fine.
	execWant(t, sb, "head -c 1048576 /dev/zero > exact", 0)
}

func TestLimitsDisk(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 32 << 20, TmpSize: 8 << 20}))

	r := execWant(t, sb, `dd if=/dev/zero of=big bs=1M count=64; echo "rc=$?"`, 0)
	if !strings.Contains(r.Stderr, "No space left on device") || r.Stdout != "rc=1\n" {
		t.Fatalf("64 MiB into a 32 MiB workdir: stdout %q stderr %q, want ENOSPC", r.Stdout, r.Stderr)
	}
	fi, err := sb.Stat(testCtx(t), "big")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a 32 MiB disk took %d bytes before ENOSPC", fi.Size())
	// At most the disk: a tmpfs (a docker-group user's working directory)
	// holds exactly its size, ext4 a little less (its own metadata).
	if fi.Size() > 32<<20 || fi.Size() < 16<<20 {
		t.Errorf("big is %d bytes, want at most the 32 MiB disk and more than half of it", fi.Size())
	}
	assertAlive(t, sb)
	// Deleting the file gives the space back.
	r = execWant(t, sb, "rm big && dd if=/dev/zero of=again bs=1M count=16 2>/dev/null && wc -c < again", 0)
	if r.Stdout != "16777216\n" {
		t.Errorf("16 MiB after freeing the disk: %q %q", r.Stdout, r.Stderr)
	}

	// The root filesystem takes nothing.
	for _, script := range []string{": > /rootfile", "touch /etc/x", "mkdir /newdir"} {
		r = mustExec(t, sb, script)
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, "Read-only file system") {
			t.Errorf("%s: exit %d stderr %q, want a read-only error", script, r.ExitCode, r.Stderr)
		}
	}

	// /tmp is a tmpfs of TmpSize.
	r = execWant(t, sb, `dd if=/dev/zero of=/tmp/big bs=1M count=16; echo "rc=$?"; wc -c < /tmp/big`, 0)
	if !strings.Contains(r.Stderr, "No space left on device") || r.Stdout != "rc=1\n8388608\n" {
		t.Errorf("16 MiB into an 8 MiB /tmp: stdout %q stderr %q, want ENOSPC at 8388608 bytes", r.Stdout, r.Stderr)
	}
	execWant(t, sb, "rm /tmp/big && echo x > /tmp/small", 0)
}

func TestLimitsOpenFiles(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithLimits(sandbox.Limits{OpenFiles: 64}))

	if r := execWant(t, sb, "ulimit -n; ulimit -Hn", 0); r.Stdout != "64\n64\n" {
		t.Errorf("ulimit -n/-Hn = %q, want 64 (soft and hard)", r.Stdout)
	}
	r := execWant(t, sb, `python3 -c '
import os, resource
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print(max(fds), e.errno, e.strerror)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    print("raised")
except ValueError as e:
    print("cannot raise")
'`, 0)
	if r.Stdout != "63 24 Too many open files\ncannot raise\n" {
		t.Errorf("opening files past the limit: %q (stderr %q), want fd 63 the last and EMFILE, and no raising", r.Stdout, r.Stderr)
	}
	// The same from a plain shell (busybox sh takes fds above 9).
	bb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{OpenFiles: 64}))
	r = mustExec(t, bb, "exec 63</dev/null && echo 63 ok; exec 64</dev/null && echo 64 ok")
	if r.Stdout != "63 ok\n" || r.ExitCode == 0 {
		t.Errorf("exec redirections: exit %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
}

func TestLimitsCPUs(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{CPUs: 0.5}))

	r := execWant(t, sb, "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us", 0)
	var quota, period float64
	if _, err := fmt.Sscanf(r.Stdout, "%g\n%g", &quota, &period); err != nil || period <= 0 {
		t.Fatalf("cfs quota/period %q: %v", r.Stdout, err)
	}
	if quota/period != 0.5 {
		t.Errorf("cfs_quota_us/cfs_period_us = %v/%v = %v, want 0.5", quota, period, quota/period)
	}
}

func TestLimitsExecTimeout(t *testing.T) {
	t.Parallel()
	t.Run("default applies", func(t *testing.T) {
		t.Parallel()
		// Short; a check below that the timeout kills before it answers
		// (the engine was slow to start it) is run again (execCheck).
		const timeout = 3 * time.Second
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: timeout}))
		start := time.Now()
		r := mustExec(t, sb, "echo started; sleep 30; echo not reached")
		took := time.Since(start)
		// Stdout is "" if the engine took the whole timeout to start the
		// command.
		if !r.TimedOut || r.ExitCode != 137 || (r.Stdout != "started\n" && r.Stdout != "") {
			t.Errorf("sleep 30 with a 3s ExecTimeout: %+v", r)
		}
		// Guaranteed: the timeout starts within Exec. How much later the
		// kill comes depends on the machine's load.
		if took < timeout {
			t.Errorf("killed after %v, before the %v ExecTimeout", took, timeout)
		}
		t.Logf("ExecTimeout %v: Exec returned after %v (Result.Duration %v)", timeout, took, r.Duration)
		// The kill took the sleep with it (polled: the kernel reaps it
		// asynchronously).
		sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
			r := execCheck(t, sb, "ps -o stat,args")
			if r.ExitCode != 0 {
				t.Fatalf("ps: %+v", r)
			}
			return !strings.Contains(r.Stdout, "sleep 30"), "sleep 30 survived its timeout:\n" + r.Stdout
		})
		// Cmd obeys it too, and says why.
		err := sb.Command(testCtx(t), "sleep", "30").Run()
		var ee *sandbox.ExitError
		if !errors.As(err, &ee) || ee.Code != 137 || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Cmd.Run past ExecTimeout: %v", err)
		}
	})
	t.Run("negative means none", func(t *testing.T) {
		t.Parallel()
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: -1}))
		// Longer than the 3s above. The lower bound on Duration is the
		// sleep's: guaranteed.
		r := execWant(t, sb, "sleep 3.5; echo done", 0)
		if r.TimedOut || r.Stdout != "done\n" || r.Duration < 3500*time.Millisecond {
			t.Errorf("sleep 3.5 without ExecTimeout: %+v", r)
		}
		// The caller's context still bounds the command.
		ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
		defer cancel()
		r, err := sb.Exec(ctx, "sleep 30")
		if err != nil || !r.TimedOut || r.ExitCode != 137 {
			t.Errorf("ctx deadline without ExecTimeout: %+v, %v", r, err)
		}
	})
}

func TestLimitsValidation(t *testing.T) {
	t.Parallel()
	// An engine that does not exist: an error about it would mean New got
	// as far as connecting.
	const nowhere = "unix:///nonexistent/agentsandbox-limits.sock"
	for _, tc := range []struct {
		l    sandbox.Limits
		want string
	}{
		{sandbox.Limits{Memory: 1 << 20}, "Limits.Memory"},
		{sandbox.Limits{PIDs: 2}, "Limits.PIDs"},
		{sandbox.Limits{Lifetime: time.Millisecond}, "Limits.Lifetime"},
		{sandbox.Limits{TmpSize: -1}, "Limits.TmpSize"},
	} {
		sb, err := sandbox.New(testCtx(t), sandbox.WithHost(nowhere), sandbox.WithLimits(tc.l))
		if err == nil {
			sb.Close()
			t.Errorf("New with %+v: no error", tc.l)
			continue
		}
		if errors.Is(err, sandbox.ErrEngineUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %+v: %v, want an error about %s before touching the engine", tc.l, err, tc.want)
		}
		if sb != nil {
			t.Errorf("New returned a sandbox with its error")
		}
	}

	want := sandbox.Limits{
		CPUs:        1,
		Memory:      512 << 20,
		PIDs:        256,
		Disk:        1 << 30,
		FileSize:    256 << 20,
		OpenFiles:   1024,
		ExecTimeout: 60 * time.Second,
		OutputBytes: 1 << 20,
		Lifetime:    time.Hour,
		TmpSize:     64 << 20,
	}
	if got := sandbox.DefaultLimits(); got != want {
		t.Errorf("DefaultLimits() = %+v, want %+v", got, want)
	}
}

func TestLimitsDefaultsApplied(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	r := execWant(t, sb, `cg=/sys/fs/cgroup
cat $cg/memory/memory.limit_in_bytes $cg/memory/memory.memsw.limit_in_bytes $cg/pids/pids.max $cg/cpu/cpu.cfs_quota_us $cg/cpu/cpu.cfs_period_us
ulimit -n; ulimit -f
df -k /workspace /tmp | tail -n +2 | while read fs size rest; do echo $size; done`, 0)
	f := strings.Fields(r.Stdout)
	if len(f) != 9 {
		t.Fatalf("defaults inside: %q", r.Stdout)
	}
	d := sandbox.DefaultLimits()
	want := []string{strconv.FormatInt(d.Memory, 10), strconv.FormatInt(d.Memory, 10),
		strconv.FormatInt(d.PIDs, 10), "100000", "100000", strconv.FormatInt(d.OpenFiles, 10),
		strconv.FormatInt(d.FileSize/512, 10)}
	for i, w := range want {
		if f[i] != w {
			t.Errorf("default limits inside: field %d = %s, want %s (all: %q)", i, f[i], w, f)
		}
	}
	// The disk's ext4 takes some of the 1 GiB for itself; /tmp is exact.
	disk, _ := strconv.ParseInt(f[7], 10, 64)
	// A working directory in memory (a docker-group user's tmpfs) is
	// shrunk to fit Memory instead (TestDiskTmpfsFitsMemory).
	if testenv.Caps(t).Disk == driver.DiskExt4 {
		if disk <= 900<<10 || disk > d.Disk>>10 {
			t.Errorf("workdir filesystem is %d KiB, want about %d", disk, d.Disk>>10)
		}
	} else if disk <= 0 || disk >= d.Memory>>10 {
		t.Errorf("workdir tmpfs is %d KiB, want less than Memory's %d", disk, d.Memory>>10)
	}
	if f[8] != strconv.FormatInt(d.TmpSize>>10, 10) {
		t.Errorf("/tmp is %s KiB, want %d", f[8], d.TmpSize>>10)
	}
}

// TestLimitsDiskUnlimited: with Disk < 0 the workdir is a tmpfs volume the
// sandbox user owns, so it is writable, and files round-trip through it.
func TestLimitsDiskUnlimited(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: -1}))
	ctx := testCtx(t)
	if err := sb.WriteFile(ctx, "in.txt", []byte("from host"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustExec(t, sb, `echo made > out.txt && cat in.txt && stat -c '%u:%g' . | grep -cx "$(id -u):$(id -g)" && awk '$2 == "/workspace" {print $3}' /proc/mounts`)
	if want := "from host1\ntmpfs\n"; r.ExitCode != 0 || r.Stdout != want {
		t.Fatalf("got %+v, want stdout %q", r, want)
	}
	got, err := sb.ReadFile(ctx, "out.txt")
	if err != nil || string(got) != "made\n" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
}

// At the smallest PIDs limit allowed, the agent's own threads (started
// before any command) leave it able to run a command, kill a fork bomb that
// took every slot left, and run commands again.
func TestLimitsPIDsMinimum(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{PIDs: 16, Lifetime: -1, ExecTimeout: -1}))
	assertAlive(t, sb)
	ctx, expire := testenv.ManualDeadline(testCtx(t))
	c := sb.Command(ctx, "sh", "-c", execBombScript)
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "saturated\n" {
		t.Fatalf("the bomb never filled the limit: %q, %v", line, err)
	}
	expire()
	var ee *sandbox.ExitError
	if err := c.Wait(); !errors.As(err, &ee) || ee.Code != 137 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait after the kill: %v; want exit 137 matching DeadlineExceeded", err)
	}
	execWaitClean(t, sb)
	assertAlive(t, sb)
}
