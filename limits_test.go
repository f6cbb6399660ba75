package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/engine"
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
	deadline := time.Now().Add(within)
	for {
		_, err := cli.ContainerInspect(testCtx(t), id)
		if engine.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("inspect %s: %v", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still exists %v later", id, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
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

func TestLimitsPIDsForkBomb(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{PIDs: 64, ExecTimeout: 3 * time.Second}))

	// The bomb runs in the background; the foreground loop uses only shell
	// builtins (it cannot fork any more) to sample the cgroup's task count
	// and the count of refused forks, printing them until ExecTimeout kills
	// everything.
	start := time.Now()
	r := mustExec(t, sb, `
cg=/sys/fs/cgroup/pids
read max < $cg/pids.max
bomb() { bomb | bomb & }
bomb >/dev/null 2>&1
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
`)
	elapsed := time.Since(start)
	if !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("fork bomb: TimedOut=%v exit=%d, want a kill by ExecTimeout; stderr %q", r.TimedOut, r.ExitCode, r.Stderr)
	}
	if elapsed > 10*time.Second {
		t.Errorf("the kill of the bomb took %v after a 3s ExecTimeout", elapsed)
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	last := lines[len(lines)-1]
	var max, peak, refused int
	if _, err := fmt.Sscanf(last, "max=%d peak=%d refused=%d", &max, &peak, &refused); err != nil {
		t.Fatalf("bomb output %q: %v", r.Stdout, err)
	}
	t.Logf("fork bomb: pids.max=%d, peak pids.current=%d, forks refused=%d, %d samples lines", max, peak, refused, len(lines))
	if max != 64 {
		t.Errorf("pids.max = %d, want 64", max)
	}
	if peak > 64 || peak < 32 {
		t.Errorf("peak pids.current = %d, want the bomb to reach but never pass 64", peak)
	}
	if refused == 0 {
		t.Error("pids.events max = 0: the bomb never hit the limit")
	}

	// Everything the bomb started is gone and the sandbox answers.
	assertAlive(t, sb)
	r = execWant(t, sb, `n=0; for d in /proc/[0-9]*; do read -r l < $d/cmdline 2>/dev/null; n=$((n+1)); done; read c < /sys/fs/cgroup/pids/pids.current; echo "$n $c"`, 0)
	var procs, tasks int
	fmt.Sscanf(r.Stdout, "%d %d", &procs, &tasks)
	// docker-init, the supervisor, its lifetime timer (sh + sleep), this
	// command's shell: at most 5, and nothing of the bomb.
	if procs > 5 || tasks > 5 {
		out := execWant(t, sb, "ps -o pid,ppid,args", 0).Stdout
		t.Errorf("after the kill: %d processes, pids.current %d; ps:\n%s", procs, tasks, out)
	}
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
	if fi.Size() >= 32<<20 || fi.Size() < 16<<20 {
		t.Errorf("big is %d bytes, want less than the 32 MiB disk and more than half of it", fi.Size())
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
		// Short, but long enough for the checks below to run on a loaded
		// machine.
		sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: 3 * time.Second}))
		r := mustExec(t, sb, "echo started; sleep 30; echo not reached")
		if !r.TimedOut || r.ExitCode != 137 || r.Stdout != "started\n" {
			t.Errorf("sleep 30 with a 3s ExecTimeout: %+v", r)
		}
		if r.Duration < 3*time.Second || r.Duration > 6*time.Second {
			t.Errorf("killed after %v, want about 3s", r.Duration)
		}
		// The kill took the sleep with it.
		if out := execWant(t, sb, "ps -o args", 0).Stdout; strings.Contains(out, "sleep 30") {
			t.Errorf("sleep 30 survived its timeout:\n%s", out)
		}
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
		// Longer than the 3s above.
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

func TestLimitsLifetime(t *testing.T) {
	t.Parallel()
	cli := engineClient(t)
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: 2 * time.Second}))
	vol := workdirVolume(t, cli, sb)
	assertAlive(t, sb)

	// The container ends itself, and the engine removes it.
	waitContainerGone(t, cli, sb.ID(), 20*time.Second)

	start := time.Now()
	_, err := sb.Exec(testCtx(t), "echo ok")
	if !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Errorf("Exec after the lifetime: %v, want ErrSandboxGone", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Exec took %v to notice the sandbox was gone", d)
	}
	if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Errorf("WriteFile after the lifetime: %v, want ErrSandboxGone", err)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("Close after the lifetime: %v", err)
	}
	assertVolumeGone(t, cli, vol)
}

// helperEnv makes the test binary, run as a child, act as a host process
// owning a sandbox (see TestHelperProcess).
const helperEnv = "AGENTSANDBOX_TEST_HELPER"

// TestHelperProcess is not a test: run as a child process by
// TestLimitsLifetimeOwnerKilled, it creates a sandbox, prints its ID and
// blocks until stdin closes (or it is killed).
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestLimitsLifetimeOwnerKilled")
	}
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: time.Hour}))
	if r := mustExec(t, sb, "echo hi > note"); r.ExitCode != 0 {
		t.Fatalf("exec: %+v", r)
	}
	fmt.Printf("ID=%s\n", sb.ID())
	io.Copy(io.Discard, os.Stdin)
}

func TestLimitsLifetimeOwnerKilled(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("in the helper process")
	}
	t.Parallel()
	cli := engineClient(t)
	ctx := testCtx(t)
	t0 := time.Now()

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v=false")
	// The child's TestMain needs no image build: it gets the python image
	// this process already has.
	cmd.Env = append(os.Environ(), helperEnv+"=1", "SANDBOX_IMAGE="+pythonImage)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id := ""
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if s, ok := strings.CutPrefix(sc.Text(), "ID="); ok {
			id = s
			break
		}
	}
	if id == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the helper printed no sandbox ID; its stderr:\n%s", stderr.String())
	}
	info, err := cli.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	owner := info.Config.Labels[engine.LabelOwner]
	if owner == "" || owner == engine.Owner() {
		t.Fatalf("helper's owner label %q (mine %q)", owner, engine.Owner())
	}
	ownerFilter := filters.NewArgs(filters.Arg("label", engine.LabelOwner+"="+owner))
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: ownerFilter})
	if err != nil || len(vs.Volumes) != 1 {
		t.Fatalf("helper's volumes: %d, %v; want its workdir", len(vs.Volumes), err)
	}

	// SIGKILL: no Close, no cleanup of any kind.
	t.Logf("%v: helper's sandbox %.12s is up", time.Since(t0), id)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	io.Copy(io.Discard, stdout)

	// Its attach stream closed, so the container ends and is auto-removed,
	// although its Lifetime is an hour.
	waitContainerGone(t, cli, id, 30*time.Second)
	t.Logf("%v: its container is gone", time.Since(t0))

	// The workdir volume is left behind for Prune.
	vs, err = cli.VolumeList(ctx, volume.ListOptions{Filters: ownerFilter})
	if err != nil || len(vs.Volumes) != 1 {
		t.Fatalf("after the helper's death: %d volumes of its owner, %v; want its leftover workdir", len(vs.Volumes), err)
	}
	if !engine.OwnerDead(owner) {
		t.Fatalf("OwnerDead(%q) = false after the helper was killed", owner)
	}

	// Prune takes the leftovers of the dead process and leaves this live
	// process's sandbox alone.
	mine := newSandbox(t)
	mineVol := workdirVolume(t, cli, mine)
	n, err := sandbox.Prune(ctx)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if n < 1 {
		t.Errorf("Prune removed %d objects, want at least the helper's volume", n)
	}
	vs, err = cli.VolumeList(ctx, volume.ListOptions{Filters: ownerFilter})
	if err != nil || len(vs.Volumes) != 0 {
		t.Errorf("after Prune: %d volumes of the dead owner, %v", len(vs.Volumes), err)
	}
	assertAlive(t, mine)
	if _, err := cli.VolumeInspect(ctx, mineVol); err != nil {
		t.Errorf("Prune touched the live sandbox's volume: %v", err)
	}
	if err := mine.WriteFile(ctx, "still", []byte("here"), 0o644); err != nil {
		t.Errorf("WriteFile after Prune: %v", err)
	}
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
	if disk <= 900<<10 || disk > d.Disk>>10 {
		t.Errorf("workdir filesystem is %d KiB, want about %d", disk, d.Disk>>10)
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
	r := mustExec(t, sb, `echo made > out.txt && cat in.txt && stat -c '%u:%g' . && awk '$2 == "/workspace" {print $3}' /proc/mounts`)
	if want := "from host1000:1000\ntmpfs\n"; r.ExitCode != 0 || r.Stdout != want {
		t.Fatalf("got %+v, want stdout %q", r, want)
	}
	got, err := sb.ReadFile(ctx, "out.txt")
	if err != nil || string(got) != "made\n" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
}
