package sandbox_test

// Restored sandboxes against the real engine: a restore gets its
// source's settings, hardening, network policy and disk limit (options
// override them), and restores into a pool's sandboxes.

import (
	"fmt"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"strconv"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// probeScript prints what a sandbox's processes can do, and how many
// processes other than the probe's shell and its children run (those are
// left out: whether a pipeline's later process has started, and under
// which name, when ps looks is a race).
const probeScript = `grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
ls /sys/class/net
touch /rootfs-probe 2>&1; echo "root write: $?"
touch /.agentsandbox/probe 2>/dev/null; echo "snapshot dir write: $?"
awk '$2 == "/" {split($4, o, ","); print "root mount:", o[1]}' /proc/mounts
awk '$2 == "/tmp" {print "tmp mount:", $3, $4}' /proc/mounts
cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes /sys/fs/cgroup/pids/pids.max
cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us
ulimit -n; ulimit -f
id -u; id -g; pwd; echo "HOME=$HOME"
ps -o pid,ppid | awk -v me=$$ 'NR > 1 && $1 != me && $2 != me' | wc -l`

// TestSnapshotSettingsAndHardening: a restored sandbox has the source's
// user, working directory, environment, limits and labels, options
// override them, and it is exactly as hardened as a new sandbox.
func TestSnapshotSettingsAndHardening(t *testing.T) {
	testenv.NotOn(t, podmanInspect, testenv.Podman...)
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	opts := []sandbox.Option{
		sandbox.WithUser("1500:1600"),
		sandbox.WithWorkdir("/home/agent"),
		sandbox.WithEnv("FOO=from-source", "BAR=kept"),
		sandbox.WithLimits(sandbox.Limits{Memory: 200 << 20, PIDs: 64, OpenFiles: 300}),
		sandbox.WithLabels(map[string]string{"test.snapshot": "settings"}),
	}
	src := newSandbox(t, opts...)
	snapRun(t, src, "echo data > f", 0)
	fresh := newSandbox(t, opts...)
	sn := takeSnapshot(t, src)
	r := restore(t, sn)

	probe := snapRun(t, r, probeScript, 0)
	if want := snapRun(t, fresh, probeScript, 0); probe != want {
		t.Errorf("restored sandbox differs from a new one:\nrestored:\n%s\nnew:\n%s", probe, want)
	}
	for _, want := range []string{
		"Uid:\t1500\t1500\t1500\t1500\n",
		"Gid:\t1600\t1600\t1600\t1600\n",
		"CapInh:\t0000000000000000\n",
		"CapPrm:\t0000000000000000\n",
		"CapEff:\t0000000000000000\n",
		"CapBnd:\t0000000000000000\n",
		"CapAmb:\t0000000000000000\n",
		"NoNewPrivs:\t1\n",
		"Seccomp:\t2\n",
		"\nlo\ntouch: /rootfs-probe: Read-only file system\nroot write: 1\n",
		"snapshot dir write: 1\n",
		"root mount: ro\n",
		"tmp mount: tmpfs rw,nosuid,nodev,",
		"\n209715200\n209715200\n64\n100000\n300\n",
		"\n1500\n1600\n/home/agent\nHOME=/home/agent\n1\n", // only the agent runs besides the probe
	} {
		if !strings.Contains(probe, want) {
			t.Errorf("restored sandbox: %q missing from\n%s", want, probe)
		}
	}
	if got := snapRun(t, r, `cat f; echo "$FOO $BAR"; stat -c %u:%g f .`, 0); got != "data\nfrom-source kept\n1500:1600\n1500:1600\n" {
		t.Errorf("restored files and env: %q", got)
	}

	// The engine agrees: same hardening and limits as a new sandbox.
	ri, err := cli.ContainerInspect(ctx, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := cli.ContainerInspect(ctx, fresh.ID())
	if err != nil {
		t.Fatal(err)
	}
	type hardening struct {
		CapDrop, CapAdd, SecurityOpt, MaskedPaths, ReadonlyPaths []string
		ReadonlyRootfs, Privileged                               bool
		NetworkMode, IpcMode, PidMode, UsernsMode, Runtime       string
		Init                                                     bool
		Memory, MemorySwap, NanoCPUs, PidsLimit                  int64
		Ulimits                                                  string
		Tmpfs                                                    map[string]string
		Binds                                                    []string
		Devices                                                  int
		User, WorkingDir                                         string
		Env                                                      []string
		Labels                                                   string
	}
	harden := func(i container.InspectResponse) hardening {
		h := i.HostConfig
		labels := map[string]string{}
		for k, v := range i.Config.Labels {
			if k != owner.LabelKind && k != sandbox.LabelSnapshot {
				labels[k] = v
			}
		}
		return hardening{
			h.CapDrop, h.CapAdd, h.SecurityOpt, h.MaskedPaths, h.ReadonlyPaths, h.ReadonlyRootfs, h.Privileged,
			string(h.NetworkMode), string(h.IpcMode), string(h.PidMode), string(h.UsernsMode), h.Runtime, h.Init != nil && *h.Init,
			h.Memory, h.MemorySwap, h.NanoCPUs, *h.PidsLimit, fmt.Sprint(h.Ulimits), h.Tmpfs, h.Binds, len(h.Devices),
			i.Config.User, i.Config.WorkingDir, i.Config.Env, fmt.Sprint(labels),
		}
	}
	if got, want := harden(ri), harden(fi); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("engine settings of the restored sandbox differ from a new one's:\nrestored: %+v\nnew:      %+v", got, want)
	}
	if ri.Config.Labels["test.snapshot"] != "settings" {
		t.Errorf("restored sandbox lost the source's labels: %v", ri.Config.Labels)
	}

	// Options override the source's settings: limits field by field (the
	// rest stay the source's), environment added on top.
	o := restore(t, sn, sandbox.WithLimits(sandbox.Limits{Memory: 128 << 20}), sandbox.WithEnv("FOO=override", "NEW=1"))
	got := snapRun(t, o, `cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max; ulimit -n; echo "$FOO $BAR $NEW"; id -u; cat f`, 0)
	if want := "134217728\n64\n300\noverride kept 1\n1500\ndata\n"; got != want {
		t.Errorf("restored with overrides: %q, want %q", got, want)
	}
}

// TestSnapshotNetworkPolicy: a restored sandbox gets the source's network
// policy — no network, a proxy of its own behind its agent's relay port —
// and an option overrides it. (Nothing here connects anywhere but to the
// proxy: the busybox image cannot resolve names.)
func TestSnapshotNetworkPolicy(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t, sandbox.WithNetwork(sandbox.AllowHosts("example.com")))
	sn := takeSnapshot(t, src)
	r := restore(t, sn)
	ri, err := cli.ContainerInspect(ctx, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	if mode := ri.HostConfig.NetworkMode; mode != "none" {
		t.Errorf("restored sandbox's network %q, want none", mode)
	}
	out := snapRun(t, r, `ls /sys/class/net; env | grep -c '^HTTPS_PROXY=http://127.0.0.1:'`, 0)
	if out != "lo\n1\n" {
		t.Errorf("restored sandbox: interfaces and proxy variable: %q", out)
	}
	// Its proxy answers, with the source's policy: a host not on the
	// allow-list is refused. (nc's input stays open until it is done: a
	// half-closed request is one the client gave up on.)
	out = snapRun(t, r, `p=${HTTP_PROXY#http://}; f=/tmp/.f; mkfifo $f
{ printf 'GET http://denied.invalid/ HTTP/1.0\r\n\r\n'; read x < $f; } | { nc -w 10 ${p%:*} ${p##*:}; echo > $f; } | head -n 1`, 0)
	if !strings.HasPrefix(out, "HTTP/1.0 403") {
		t.Errorf("the restored sandbox's proxy, for a host not on the allow-list: %q, want 403", out)
	}

	// Overridden: no network at all.
	o := restore(t, sn, sandbox.WithNetwork(sandbox.NetworkPolicy{}))
	oi, err := cli.ContainerInspect(ctx, o.ID())
	if err != nil {
		t.Fatal(err)
	}
	if oi.HostConfig.NetworkMode != "none" {
		t.Errorf("restored with the zero policy: network %q", oi.HostConfig.NetworkMode)
	}
	if out := snapRun(t, o, `ls /sys/class/net; env | grep -ci proxy`, 1); out != "lo\n0\n" {
		t.Errorf("restored with the zero policy: %q", out)
	}
}

// TestSnapshotDisk: the disk limit is kept by snapshots and restores, with
// the working directory's contents, and a restore into a disk too small
// for the files fails without leaving anything behind.
func TestSnapshotDisk(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	const disk = 32 << 20
	src := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: disk}))
	sum := snapRun(t, src, "head -c 8388608 /dev/urandom > payload && md5sum payload", 0)
	sn := takeSnapshot(t, src)
	r := restore(t, sn)

	if got := snapRun(t, r, "md5sum payload", 0); got != sum {
		t.Errorf("payload after restore: %q, want %q", got, sum)
	}
	df := snapRun(t, r, `df -k "$HOME" | tail -n 1`, 0)
	f := strings.Fields(df)
	if len(f) < 4 {
		t.Fatalf("df: %q", df)
	}
	size, _ := strconv.ParseInt(f[1], 10, 64)
	if size < 28<<10 || size > 32<<10 {
		t.Errorf("restored workdir is %d KiB, want about %d KiB (df: %q)", size, disk>>10, df)
	}
	res := mustExec(t, r, "dd if=/dev/zero of=big bs=1048576 count=64")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Errorf("writing 64 MiB into the restored 32 MiB disk: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	// The disk is the restored sandbox's own: the source's is untouched.
	if got := snapRun(t, src, "ls", 0); got != "payload\n" {
		t.Errorf("source workdir after the restore filled its disk: %q", got)
	}
	if got := snapRun(t, src, "md5sum payload", 0); got != sum {
		t.Errorf("source payload: %q", got)
	}

	// A disk override smaller than the files: ENOSPC, and nothing is left.
	_, err := sn.New(ctx, sandbox.WithLimits(sandbox.Limits{Disk: 4 << 20}))
	if err == nil {
		t.Fatal("restore of 8 MiB into a 4 MiB disk succeeded")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "no space") {
		t.Errorf("restore into a small disk: %v; want an ENOSPC error", err)
	}
	waitNoForks(t, cli, sn, 1) // only r
}

// TestSnapshotPool: with WithPool, New and Fork restore into the pool's
// sandboxes (already started): the files are there, the sandboxes are
// the pool's, Fork takes more than the pool holds by waiting for it to
// refill; a pool of other settings is refused, naming the setting, and
// the sandbox it handed out is closed.
func TestSnapshotPool(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	opts := []sandbox.Option{sandbox.WithImage(busyboxImage), sandbox.WithEnv("ROLE=pooled")}
	pool, err := sandbox.NewPool(ctx, 2, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	src := newSandbox(t, sandbox.WithEnv("ROLE=pooled"))
	snapRun(t, src, "echo saved > f", 0)
	sn := takeSnapshot(t, src)

	r, err := sn.New(ctx, sandbox.WithPool(pool))
	if err != nil {
		t.Fatalf("New with a pool: %v", err)
	}
	defer r.Close()
	if got := snapRun(t, r, `cat f; echo "$ROLE"`, 0); got != "saved\npooled\n" {
		t.Errorf("restored into a pool's sandbox: %q", got)
	}
	if st := pool.Stats(); st.Handed != 1 {
		t.Errorf("pool stats after one restore: %+v", st)
	}
	forks, err := sn.Fork(ctx, 3, sandbox.WithPool(pool))
	if err != nil {
		t.Fatalf("Fork(3) from a pool of 2: %v", err)
	}
	for i, f := range forks {
		defer f.Close()
		snapRun(t, f, fmt.Sprintf("test \"$(cat f)\" = saved && echo %d > f", i), 0)
	}
	if st := pool.Stats(); st.Handed != 4 {
		t.Errorf("pool stats after Fork(3): %+v", st)
	}

	// Other settings: refused, and the sandbox handed out is removed.
	other, err := sandbox.NewPool(ctx, 1, sandbox.WithImage(busyboxImage), sandbox.WithEnv("ROLE=other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if sb, err := sn.New(ctx, sandbox.WithPool(other)); err == nil || !strings.Contains(err.Error(), "environment") {
		sb.Close()
		t.Errorf("restore into a pool of other settings: %v; want an error naming the environment", err)
	}
	if st := other.Stats(); st.Handed != 1 {
		t.Errorf("the other pool's stats: %+v", st)
	}
	if _, err := sn.Fork(ctx, 1, sandbox.WithPool(nil)); err == nil {
		t.Error("WithPool(nil) accepted")
	}
}
