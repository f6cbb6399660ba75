package sandbox_test

// Snapshots, restores and forks against the real engine: what is captured,
// that restored sandboxes are as hardened and limited as new ones, that
// forks are isolated and all-or-nothing, long snapshot chains, the life of
// snapshot images (Remove, Prune), bad input and the audit log.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// takeSnapshot snapshots sb; the snapshot is removed when the test ends.
func takeSnapshot(t testing.TB, sb *sandbox.Sandbox) *sandbox.Snapshot {
	t.Helper()
	sn, err := sb.Snapshot(testCtx(t))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() {
		if err := sn.Remove(context.Background()); err != nil {
			t.Errorf("Remove snapshot: %v", err)
		}
	})
	return sn
}

// restore starts a sandbox from sn, closed when the test ends (before the
// snapshot is removed).
func restore(t testing.TB, sn *sandbox.Snapshot, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	sb, err := sn.New(testCtx(t), opts...)
	if err != nil {
		t.Fatalf("Snapshot.New: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("Close restored sandbox: %v", err)
		}
	})
	return sb
}

// snapRun runs script and checks its exit code.
func snapRun(t testing.TB, sb *sandbox.Sandbox, script string, code int) string {
	t.Helper()
	r := mustExec(t, sb, script)
	if r.ExitCode != code {
		t.Fatalf("Exec(%q) in %.12s: exit %d, want %d\nstdout: %s\nstderr: %s",
			script, sb.ID(), r.ExitCode, code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// manifestScript lists every entry under the working directory with its
// type, mode, owner, size, link count and (but for directories, whose
// mtime changes as they are filled) mtime; the targets of symbolic links;
// and checksums of regular files.
const manifestScript = `cd "$HOME" && me="$(id -u):$(id -g)" &&
find . ! -type d -exec stat -c '%n|%F|%a|%u:%g|%s|%h|%Y' {} \; | sed "s/|$me|/|me|/" | sort &&
find . -type d -exec stat -c '%n|%F|%a|%u:%g' {} \; | sed "s/|$me\$/|me/" | sort &&
find . -type l -exec sh -c 'printf "%s -> %s\n" "$1" "$(readlink "$1")"' _ {} \; | sort &&
find . -type f -exec md5sum {} \; | sort`

func manifest(t testing.TB, sb *sandbox.Sandbox) string {
	t.Helper()
	return snapRun(t, sb, manifestScript, 0)
}

// odd is a file name with a space and a newline in it.
const odd = "odd name\nwith newline"

// treeScript fills the working directory with what a snapshot must keep.
const treeScript = `set -e
mkdir -p a/b/c empty private sticky .hidden
echo deep > a/b/c/deep.txt
printf secret > private/key && chmod 600 private/key && chmod 700 private
printf '#!/bin/sh\necho tool ran\n' > tool.sh && chmod 755 tool.sh
echo ro > readonly && chmod 444 readonly
chmod 1777 sticky
echo dot > .hidden/.rc
ln -s a/b/c/deep.txt rel-link
ln -s /etc/passwd abs-link
ln -s does/not/exist dangling
ln -s a dirlink
ln -s ../tmp cache
ln -s ../../etc/passwd a/up-and-out
mkdir locked && echo in > locked/f && chmod 555 locked
printf none > unreadable && chmod 000 unreadable
ln a/b/c/deep.txt hard
printf spaces > 'name with spaces'
printf newline > "$(printf 'odd name\nwith newline')"
touch -d '2001-02-03 04:05:06' old
head -c 1048576 /dev/urandom > random.bin
`

// TestSnapshotContent: the whole working directory survives a snapshot and
// a restore (types, modes, owners, links, odd names, contents, mtimes),
// while the source keeps running, unchanged; /tmp and processes are not
// captured.
func TestSnapshotContent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t)
	snapRun(t, src, treeScript, 0)
	before := manifest(t, src)
	for _, want := range []string{
		"./private|directory|700|me",
		"./private/key|regular file|600|me|6|1|",
		"./sticky|directory|1777|me",
		"./tool.sh|regular file|755|me|",
		"./readonly|regular file|444|me|",
		"./a/b/c/deep.txt|regular file|644|me|5|2|",
		"./old|regular empty file|644|me|0|1|981173106",
		"./rel-link -> a/b/c/deep.txt",
		"./abs-link -> /etc/passwd",
		"./dangling -> does/not/exist",
		"./cache -> ../tmp",
		"./a/up-and-out -> ../../etc/passwd",
		"./locked|directory|555|me",
		"./unreadable|regular file|0|me|4|1|",
		"./odd name\n", // sort splits the line with the newline
		"\nwith newline|regular file|644|me|7|1|",
	} {
		if !strings.Contains(before, want) {
			t.Fatalf("the source's manifest lacks %q:\n%s", want, before)
		}
	}

	// A process keeps running in the source across the snapshot, writing
	// to /tmp (not captured) so that the working directory stays still.
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	ticker := src.Command(bctx, "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.05; done")
	if err := ticker.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, "test -s /tmp/ticks")

	sn := takeSnapshot(t, src)
	if sn.ID() == "" {
		t.Fatal("snapshot has no ID")
	}

	// The source is running, not paused, and its files are as they were.
	info, err := cli.ContainerInspect(ctx, src.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !info.State.Running || info.State.Paused {
		t.Fatalf("source after Snapshot: running=%v paused=%v", info.State.Running, info.State.Paused)
	}
	if after := manifest(t, src); after != before {
		t.Fatalf("Snapshot changed the source's files:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	n := snapRun(t, src, "wc -l < /tmp/ticks", 0)
	waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %s", strings.TrimSpace(n)))

	// Its image, made on demand, is the base image plus one layer, and
	// carries the library's labels for this process.
	imgID, err := sn.Image(ctx)
	if err != nil {
		t.Fatalf("Image: %v", err)
	}
	if again, err := sn.Image(ctx); err != nil || again != imgID {
		t.Errorf("Image again: %s, %v; want the same image %s", again, err, imgID)
	}
	img, err := cli.ImageInspect(ctx, imgID)
	if err != nil {
		t.Fatalf("inspect snapshot image: %v", err)
	}
	base, err := cli.ImageInspect(ctx, busyboxImage)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(img.RootFS.Layers), len(base.RootFS.Layers)+1; got != want {
		t.Errorf("snapshot image has %d layers, want %d (base + 1)", got, want)
	}
	l := img.Config.Labels
	if l[owner.LabelManaged] != "true" || l[owner.LabelOwner] != owner.ID() || l[owner.LabelKind] != "snapshot" {
		t.Errorf("snapshot image labels: %v", l)
	}
	// The image holds the same files, under /.agentsandbox/workdir.
	fromImage, err := sandbox.New(ctx, sandbox.WithImage(imgID))
	if err != nil {
		t.Fatal(err)
	}
	defer fromImage.Close()
	const sums = "cd %s && md5sum random.bin hard && readlink cache"
	if got, want := snapRun(t, fromImage, fmt.Sprintf(sums, "/.agentsandbox/workdir"), 0), snapRun(t, src, fmt.Sprintf(sums, "."), 0); got != want {
		t.Errorf("the image's files:\n%s\nthe source's:\n%s", got, want)
	}

	r := restore(t, sn)
	if got := manifest(t, r); got != before {
		t.Fatalf("restored files differ:\nsource:\n%s\nrestored:\n%s", before, got)
	}
	for name, want := range map[string]string{odd: "newline", "name with spaces": "spaces", "rel-link": "deep\n", "hard": "deep\n"} {
		got, err := r.ReadFile(ctx, name)
		if err != nil || string(got) != want {
			t.Errorf("ReadFile(%q) in the restored sandbox = %q, %v; want %q", name, got, err, want)
		}
	}
	// Hard links are still one file.
	snapRun(t, r, `test "$(stat -c %i hard)" = "$(stat -c %i a/b/c/deep.txt)"`, 0)
	if out := snapRun(t, r, "./tool.sh", 0); out != "tool ran\n" {
		t.Errorf("tool.sh in the restored sandbox: %q", out)
	}
	// The restored working directory is writable by the user, like the
	// source's.
	// Each is its own user's (the restored sandbox has a user of its own).
	snapRun(t, r, `touch new && stat -c '%a %u:%g' . && test -w "$HOME"`, 0)
	const own = `stat -c '%a %u:%g' . | grep -cx "755 $(id -u):$(id -g)"`
	if got, want := snapRun(t, r, own, 0), snapRun(t, src, own, 0); got != "1\n" || got != want {
		t.Errorf("restored workdir is its user's: %q, the source's: %q", got, want)
	}
	if a, b := snapRun(t, r, "id -u", 0), snapRun(t, src, "id -u", 0); a == b {
		t.Errorf("the restored sandbox shares its source's user %s", a)
	}
	// Neither /tmp nor processes are captured.
	snapRun(t, r, "test ! -e /tmp/ticks", 0)
	if ps := snapRun(t, r, "ps -o args", 0); strings.Contains(ps, "ticks") {
		t.Errorf("the source's process runs in the restored sandbox:\n%s", ps)
	}

	stop()
	if err := ticker.Wait(); err == nil {
		t.Error("the ticker ended on its own")
	}
}

// waitExec polls until script exits 0 in sb.
func waitExec(t testing.TB, sb *sandbox.Sandbox, script string) {
	t.Helper()
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		if r := mustExec(t, sb, script); r.ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q still fails after %v", script, testenv.HangGuard)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

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

// listForks lists the containers of this process started from sn.
func listForks(ctx context.Context, cli *client.Client, sn *sandbox.Snapshot) ([]container.Summary, error) {
	return cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", owner.LabelOwner+"="+owner.ID()),
		filters.Arg("label", sandbox.LabelSnapshot+"="+sn.ID()),
	)})
}

// forkContainers lists the containers of this process started from sn.
func forkContainers(t testing.TB, cli *client.Client, sn *sandbox.Snapshot) []container.Summary {
	t.Helper()
	cs, err := listForks(testCtx(t), cli, sn)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// waitNoForks polls the engine until exactly want containers of sn exist.
func waitNoForks(t testing.TB, cli *client.Client, sn *sandbox.Snapshot, want int) {
	t.Helper()
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		cs := forkContainers(t, cli, sn)
		if len(cs) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d containers of snapshot %.19s, want %d", len(cs), sn.ID(), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// volumeOf returns the name of the volume at the sandbox's working
// directory.
func volumeOf(t testing.TB, cli *client.Client, sb *sandbox.Sandbox) string {
	t.Helper()
	info, err := cli.ContainerInspect(testCtx(t), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range info.Mounts {
		if m.Type == "volume" && m.Destination == info.Config.WorkingDir {
			return m.Name
		}
	}
	t.Fatalf("no workdir volume in %+v", info.Mounts)
	return ""
}

// TestSnapshotFork: forks are isolated from each other and from the
// source, and closing them leaves nothing behind.
func TestSnapshotFork(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t, sandbox.WithEnv("ROLE=source"))
	snapRun(t, src, "echo shared > common", 0)
	sn := takeSnapshot(t, src)
	snapRun(t, src, "echo late > late && rm common", 0)

	const n = 3
	forks, err := sn.Fork(ctx, n)
	if err != nil {
		t.Fatalf("Fork(%d): %v", n, err)
	}
	closed := false
	defer func() {
		if !closed {
			for _, f := range forks {
				f.Close()
			}
		}
	}()
	if len(forks) != n {
		t.Fatalf("Fork returned %d sandboxes", len(forks))
	}
	ids := map[string]bool{src.ID(): true}
	var vols []string
	for _, f := range forks {
		if ids[f.ID()] {
			t.Fatalf("fork ID %s repeated", f.ID())
		}
		ids[f.ID()] = true
		vols = append(vols, volumeOf(t, cli, f))
	}
	if len(forkContainers(t, cli, sn)) != n {
		t.Errorf("engine lists %d containers of the snapshot, want %d", len(forkContainers(t, cli, sn)), n)
	}
	var wg sync.WaitGroup
	for i, f := range forks {
		wg.Go(func() {
			if err := f.WriteFile(ctx, fmt.Sprintf("mine-%d", i), []byte("x"), 0o644); err != nil {
				t.Errorf("fork %d: WriteFile: %v", i, err)
			}
		})
	}
	wg.Wait()
	for i, f := range forks {
		want := fmt.Sprintf("common\nmine-%d\nshared\nsource\n", i)
		if got := snapRun(t, f, `ls; cat common; echo "$ROLE"`, 0); got != want {
			t.Errorf("fork %d sees %q, want %q", i, got, want)
		}
	}
	if got := snapRun(t, src, "ls", 0); got != "late\n" {
		t.Errorf("source sees %q after the forks wrote", got)
	}

	for _, f := range forks {
		if err := f.Close(); err != nil {
			t.Errorf("Close fork: %v", err)
		}
	}
	closed = true
	waitNoForks(t, cli, sn, 0)
	for _, v := range vols {
		if _, err := cli.VolumeInspect(ctx, v); !engine.IsNotFound(err) {
			t.Errorf("volume %s of a closed fork: %v", v, err)
		}
	}
	// The snapshot is still usable after its forks are gone.
	if got := snapRun(t, restore(t, sn), "cat common", 0); got != "shared\n" {
		t.Errorf("restore after forks closed: %q", got)
	}
}

// waitImageGone polls the engine until the image is deleted.
func waitImageGone(t testing.TB, cli *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(testenv.HangGuard)
	for {
		_, err := cli.ImageInspect(testCtx(t), id)
		if engine.IsNotFound(err) {
			return
		}
		if err != nil {
			t.Fatalf("inspect image %.19s: %v", id, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("image %.19s still exists after %v", id, testenv.HangGuard)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSnapshotRemoveWhileForkRuns: Remove with a fork running deletes the
// snapshot's image at once; the fork keeps working (it needs nothing of
// the snapshot once restored), and new restores and Image fail.
func TestSnapshotRemoveWhileForkRuns(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t)
	snapRun(t, src, "echo v1 > state", 0)
	sn, err := src.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img, err := sn.Image(ctx)
	if err != nil {
		sn.Remove(ctx)
		t.Fatal(err)
	}
	forks, err := sn.Fork(ctx, 1)
	if err != nil {
		sn.Remove(ctx)
		t.Fatal(err)
	}
	fork := forks[0]
	defer fork.Close()

	if err := sn.Remove(ctx); err != nil {
		t.Fatalf("Remove with a fork running: %v", err)
	}
	if err := sn.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	waitImageGone(t, cli, img)
	if got := snapRun(t, fork, "cat state; echo v2 > state; cat state", 0); got != "v1\nv2\n" {
		t.Errorf("fork after Remove: %q", got)
	}
	// A restore of a removed snapshot is refused, and makes nothing.
	for name, f := range map[string]func() error{
		"New":   func() error { sb, err := sn.New(ctx); sb.Close(); return err },
		"Fork":  func() error { _, err := sn.Fork(ctx, 2); return err },
		"Image": func() error { _, err := sn.Image(ctx); return err },
	} {
		if err := f(); !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "removed") {
			t.Errorf("%s of a removed snapshot: %v, want ErrImageNotFound saying it was removed", name, err)
		}
	}
	waitNoForks(t, cli, sn, 1)
}

// TestSnapshotBadInput: a closed sandbox, Fork counts out of range, an
// image deleted behind the library's back.
func TestSnapshotBadInput(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)

	closed, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	if sn, err := closed.Snapshot(ctx); !errors.Is(err, sandbox.ErrClosed) || sn != nil {
		t.Errorf("Snapshot of a closed sandbox: %v, %v; want ErrClosed", sn, err)
	}

	src := newSandbox(t)
	sn := takeSnapshot(t, src)
	for _, n := range []int{0, -1, sandbox.MaxFork + 1, 1 << 40} {
		forks, err := sn.Fork(ctx, n)
		if err == nil || forks != nil || !strings.Contains(err.Error(), fmt.Sprintf("n = %d", n)) ||
			!strings.Contains(err.Error(), strconv.Itoa(sandbox.MaxFork)) {
			t.Errorf("Fork(%d): %d sandboxes, %v; want an error naming n and the cap", n, len(forks), err)
		}
	}
	waitNoForks(t, cli, sn, 0)

	// All or nothing: a fork that cannot start (an invalid option) fails
	// the whole Fork and names the step.
	forks, err := sn.Fork(ctx, 3, sandbox.WithLimits(sandbox.Limits{PIDs: 2}))
	if err == nil || forks != nil || !strings.Contains(err.Error(), "PIDs") {
		t.Errorf("Fork with invalid limits: %d, %v", len(forks), err)
	}
	// A fork whose restore fails (files larger than its disk): the whole
	// Fork fails, names the sandbox and the step, and the forks already
	// made are removed.
	big := newSandbox(t)
	snapRun(t, big, "head -c 3145728 /dev/urandom > fill", 0) // zeros would be restored as a hole
	bsn := takeSnapshot(t, big)
	forks, err = bsn.Fork(ctx, 4, sandbox.WithLimits(sandbox.Limits{Disk: 2 << 20}))
	if err == nil || forks != nil || !strings.Contains(err.Error(), "of 4") || !strings.Contains(err.Error(), "restore") {
		t.Errorf("Fork into too small disks: %d, %v; want an error naming the fork and the restore step", len(forks), err)
	}
	waitNoForks(t, cli, bsn, 0)

	// Its image deleted behind the library's back: restores do not need
	// it, and Remove finds it gone without an error.
	gone := takeSnapshot(t, src)
	img, err := gone.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.ImageRemove(ctx, img, image.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	snapRun(t, restore(t, gone), "true", 0)
	if err := gone.Remove(ctx); err != nil {
		t.Errorf("Remove of a snapshot whose image was deleted outside the library: %v", err)
	}
}

// TestSnapshotForkCancel: a context cancelled while Fork is creating
// sandboxes makes Fork fail, and nothing it made remains. Not parallel:
// it checks that the set of this process's containers and volumes is the
// same after the Fork as before it.
func TestSnapshotForkCancel(t *testing.T) {
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t)
	snapRun(t, src, "echo x > f", 0)
	sn := takeSnapshot(t, src)
	owned := func() []string {
		f := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+owner.ID()))
		cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
		if err != nil {
			t.Fatal(err)
		}
		vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range cs {
			names = append(names, "container "+c.ID)
		}
		for _, v := range vs.Volumes {
			names = append(names, "volume "+v.Name)
		}
		slices.Sort(names)
		return names
	}
	before := owned()

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan int, 1)
	go func() { // cancel once the first fork's container exists
		defer cancel()
		for fctx.Err() == nil {
			if cs, err := listForks(fctx, cli, sn); err == nil && len(cs) > 0 {
				watched <- len(cs)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		watched <- 0
	}()
	forks, err := sn.Fork(fctx, 16)
	if err == nil {
		for _, f := range forks {
			f.Close()
		}
		t.Fatal("Fork(16) succeeded despite the cancelled context")
	}
	if seen := <-watched; seen == 0 {
		t.Fatalf("Fork failed before any fork container existed: %v", err)
	}
	if !errors.Is(err, context.Canceled) || forks != nil {
		t.Errorf("cancelled Fork: %d, %v; want context.Canceled", len(forks), err)
	}
	t.Logf("cancelled Fork: %v", err)

	deadline := time.Now().Add(testenv.HangGuard)
	for {
		after := owned()
		if slices.Equal(after, before) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left by the cancelled Fork:\nbefore: %v\nafter:  %v", before, after)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The snapshot still works.
	if got := snapRun(t, restore(t, sn), "cat f", 0); got != "x\n" {
		t.Errorf("restore after a cancelled Fork: %q", got)
	}
}

// TestSnapshotChain150: snapshot → restore → change → snapshot, 150 times
// in a row, far past the overlay's depth limit (~125) had each snapshot
// been committed on top of the previous one; the last one's image is
// base + one layer. Every intermediate snapshot is removed as the chain
// moves on; -short runs 20 steps.
func TestSnapshotChain150(t *testing.T) {
	t.Parallel()
	steps := 150
	if testing.Short() {
		steps = 20
	}
	// The chain's length depends on the machine's load (a step took 20 s
	// with other test runs busy), so its only bound is a hang guard: the
	// test binary's own -timeout, less a minute to report which step hung.
	deadline, ok := t.Deadline()
	if !ok { // -timeout 0
		deadline = time.Now().Add(time.Hour)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-time.Minute))
	defer cancel()
	cli := engineClient(t)
	start := time.Now()

	// A small disk: every sandbox of the chain has one of its own.
	lim := sandbox.WithLimits(sandbox.Limits{Disk: 16 << 20})
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), lim)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := sb.Exec(ctx, "echo 0 > counter"); err != nil || r.ExitCode != 0 {
		sb.Close()
		t.Fatalf("write counter: %v %+v", err, r)
	}
	prev, err := sb.Snapshot(ctx)
	if err != nil {
		sb.Close()
		t.Fatal(err)
	}
	var (
		ids     = []string{prev.ID()}
		cleanup sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
	)
	// Closing a step's sandbox and removing the snapshot before it run in
	// the background, off the chain's critical path.
	retire := func(sb *sandbox.Sandbox, sn *sandbox.Snapshot) {
		cleanup.Go(func() {
			err := sb.Close()
			if sn != nil {
				err = errors.Join(err, sn.Remove(context.Background()))
			}
			if err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		})
	}
	defer func() {
		cleanup.Wait()
		if prev != nil {
			prev.Remove(context.Background())
		}
	}()
	retire(sb, nil)
	for i := 1; i <= steps; i++ {
		next, err := prev.New(ctx)
		if err != nil {
			t.Fatalf("step %d: restore: %v", i, err)
		}
		r, err := next.Exec(ctx, fmt.Sprintf(`test "$(cat counter)" = %d && echo %d > counter`, i-1, i))
		if err != nil || r.ExitCode != 0 {
			next.Close()
			t.Fatalf("step %d: counter: %v %+v", i, err, r)
		}
		sn, err := next.Snapshot(ctx)
		if err != nil {
			next.Close()
			t.Fatalf("step %d: snapshot: %v", i, err)
		}
		ids = append(ids, sn.ID())
		retire(next, prev)
		prev = sn
	}
	chain := time.Since(start)

	last := restore(t, prev)
	if got := snapRun(t, last, "cat counter", 0); got != fmt.Sprintf("%d\n", steps) {
		t.Errorf("counter after %d steps: %q", steps, got)
	}
	cleanup.Wait()
	if len(errs) > 0 {
		t.Errorf("closing and removing along the chain: %v", errors.Join(errs...))
	}
	// Its image is base + one layer, however long the chain.
	imgID, err := prev.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img, err := cli.ImageInspect(ctx, imgID)
	if err != nil {
		t.Fatal(err)
	}
	base, err := cli.ImageInspect(ctx, busyboxImage)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.RootFS.Layers) != len(base.RootFS.Layers)+1 {
		t.Errorf("snapshot %d has %d layers, base %d", steps, len(img.RootFS.Layers), len(base.RootFS.Layers))
	}
	if len(slices.Compact(slices.Sorted(slices.Values(ids)))) != steps+1 {
		t.Errorf("the chain's %d snapshots have repeated IDs: %v", steps+1, ids)
	}
	t.Logf("%d chained steps (restore, exec, snapshot) in %v: %v per step", steps, chain.Round(time.Millisecond), (chain / time.Duration(steps)).Round(time.Millisecond))
}

// snapHelperEnv makes TestSnapshotHelperProcess act.
const snapHelperEnv = "AGENTSANDBOX_SNAPSHOT_HELPER"

// TestSnapshotHelperProcess is not a test: run as a child process by
// TestSnapshotPrune, it makes a sandbox and a snapshot of it, prints the
// snapshot's image, and when its stdin closes exits at once, closing and
// removing nothing.
func TestSnapshotHelperProcess(t *testing.T) {
	if os.Getenv(snapHelperEnv) != "1" {
		t.Skip("helper process for TestSnapshotPrune")
	}
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if r, err := sb.Exec(ctx, "echo orphan > f"); err != nil || r.ExitCode != 0 {
		fmt.Fprintln(os.Stderr, err, r)
		os.Exit(2)
	}
	sn, err := sb.Snapshot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	img, err := sn.Image(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("SNAPSHOT=%s\n", img)
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestSnapshotPrune: the snapshot of a process that died without removing
// it is removed by Prune, with its sandbox's leftovers; this process's
// snapshot survives.
func TestSnapshotPrune(t *testing.T) {
	if os.Getenv(snapHelperEnv) != "" {
		t.Skip("in the helper process")
	}
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSnapshotHelperProcess$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), snapHelperEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var orphan string
	for sc := bufio.NewScanner(stdout); orphan == "" && sc.Scan(); {
		orphan, _ = strings.CutPrefix(sc.Text(), "SNAPSHOT=")
	}
	if orphan == "" {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("the helper printed no snapshot; stderr:\n%s", stderr.String())
	}
	// While the helper lives, no Prune (of any test) may touch its objects.
	img, err := cli.ImageInspect(ctx, orphan)
	if err != nil {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("the helper's snapshot: %v", err)
	}
	helperOwner := img.Config.Labels[owner.LabelOwner]
	byOwner := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+helperOwner))
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: byOwner})
	if err != nil || len(vs.Volumes) != 1 {
		t.Errorf("the live helper's volumes: %d, %v; want its sandbox's workdir", len(vs.Volumes), err)
	}
	if helperOwner == "" || helperOwner == owner.ID() || owner.Dead(helperOwner) {
		t.Errorf("the live helper's owner label %q (mine %q, dead %v)", helperOwner, owner.ID(), owner.Dead(helperOwner))
	}
	// Now it exits without closing or removing anything.
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, stderr.String())
	}
	if !owner.Dead(helperOwner) {
		t.Fatalf("owner.Dead(%q) = false after the helper exited", helperOwner)
	}

	src := newSandbox(t)
	snapRun(t, src, "echo mine > f", 0)
	mine := takeSnapshot(t, src)
	mineImg, err := mine.Image(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Three Prunes at once find the same orphans: each must succeed
	// (removed by another is removed).
	if _, err := prune(ctx, 3); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	// Another test may prune at the same time (from the helper's exit on):
	// check the result, not the count.
	if _, err := cli.ImageInspect(ctx, orphan); !engine.IsNotFound(err) {
		t.Errorf("the dead helper's snapshot after Prune: %v", err)
	}
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: byOwner})
	if err != nil || len(cs) != 0 {
		t.Errorf("the dead helper's containers after Prune: %d, %v", len(cs), err)
	}
	vs, err = cli.VolumeList(ctx, volume.ListOptions{Filters: byOwner})
	if err != nil || len(vs.Volumes) != 0 {
		t.Errorf("the dead helper's volumes after Prune: %d, %v", len(vs.Volumes), err)
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: byOwner})
	if err != nil || len(is) != 0 {
		t.Errorf("the dead helper's images after Prune: %d, %v", len(is), err)
	}
	if _, err := cli.ImageInspect(ctx, mineImg); err != nil {
		t.Fatalf("Prune removed a live process's snapshot: %v", err)
	}
	if got := snapRun(t, restore(t, mine), "cat f", 0); got != "mine\n" {
		t.Errorf("restore of the surviving snapshot: %q", got)
	}
}

// snapRecorder keeps the audit records it is given.
type snapRecorder struct {
	mu      sync.Mutex
	records []snapRecord
}

type snapRecord struct {
	msg   string
	level slog.Level
	attrs map[string]string
}

func (h *snapRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *snapRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *snapRecorder) WithGroup(string) slog.Handler            { return h }
func (h *snapRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := snapRecord{msg: r.Message, level: r.Level, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// find returns the records with message msg.
func (h *snapRecorder) find(msg string) []snapRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []snapRecord
	for _, r := range h.records {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// TestSnapshotAudit: snapshot, restore, fork and remove each leave one
// record in the audit log.
func TestSnapshotAudit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rec, forkRec := &snapRecorder{}, &snapRecorder{}
	src := newSandbox(t, sandbox.WithLogger(slog.New(rec)))
	sn, err := src.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Remove(ctx)
	if r := rec.find("sandbox.snapshot"); len(r) != 1 || r[0].attrs["sandbox"] != src.ID() || r[0].attrs["duration"] == "" || r[0].attrs["error"] != "" {
		t.Errorf("sandbox.snapshot records: %+v", r)
	}

	r := restore(t, sn) // logs to the source's logger
	if recs := rec.find("sandbox.restore"); len(recs) != 1 || recs[0].attrs["sandbox"] != r.ID() || recs[0].attrs["snapshot"] != sn.ID() {
		t.Errorf("sandbox.restore records: %+v", recs)
	}
	forks, err := sn.Fork(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		f.Close()
	}
	if recs := rec.find("sandbox.fork"); len(recs) != 1 || recs[0].attrs["snapshot"] != sn.ID() || recs[0].attrs["n"] != "2" {
		t.Errorf("sandbox.fork records: %+v", recs)
	}
	// Forks given their own logger: the fork record goes there.
	forks, err = sn.Fork(ctx, 1, sandbox.WithLogger(slog.New(forkRec)))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		f.Close()
	}
	if recs := forkRec.find("sandbox.fork"); len(recs) != 1 || recs[0].attrs["n"] != "1" {
		t.Errorf("sandbox.fork records in the forks' logger: %+v", recs)
	}
	if recs := forkRec.find("sandbox.close"); len(recs) != 1 {
		t.Errorf("the fork's close went to %d records of its logger", len(recs))
	}

	if err := sn.Remove(ctx); err != nil { // r still runs: it needs nothing of sn
		t.Fatal(err)
	}
	if recs := rec.find("sandbox.snapshot.remove"); len(recs) != 1 || recs[0].attrs["snapshot"] != sn.ID() || recs[0].attrs["deferred"] != "false" {
		t.Errorf("sandbox.snapshot.remove records: %+v", recs)
	}
}

// TestSnapshotProcesses: Snapshot stops the sandbox's processes while it
// reads the files and resumes them afterwards: a file rewritten without
// pause is captured whole (one generation, never torn), a fork bomb does
// not keep the snapshot from finishing, a process its user stopped stays
// stopped, and files and directories the user closed to themselves are
// captured with their modes.
func TestSnapshotProcesses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newSandbox(t, sandbox.WithLimits(sandbox.Limits{PIDs: 64}))
	snapRun(t, src, "mkdir closed && echo inside > closed/f && chmod 000 closed/f closed", 0)

	// A process that stopped itself (the user's SIGSTOP).
	stopped := src.Command(ctx, "sh", "-c", `echo $$ > /tmp/stopped.pid; kill -STOP $$; echo resumed > /tmp/resumed`)
	if err := stopped.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, `test -s /tmp/stopped.pid && grep -q '^State:.*T' /proc/$(cat /tmp/stopped.pid)/status`)

	// A writer that rewrites f, 256 KiB of one letter, then the other.
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	writer := src.Command(wctx, "sh", "-c", `c=a; while :; do head -c 262144 /dev/zero | tr '\0' $c > f; if [ $c = a ]; then c=b; else c=a; fi; done`)
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, "test -s f")
	for i := range 4 {
		sn := takeSnapshot(t, src)
		r := restore(t, sn)
		out := snapRun(t, r, `n=$(wc -c < f); a=$(tr -d a < f | wc -c); b=$(tr -d b < f | wc -c); echo "$n $a $b"`, 0)
		var n, notA, notB int
		fmt.Sscan(out, &n, &notA, &notB)
		if notA != 0 && notB != 0 {
			t.Errorf("snapshot %d: f of %d bytes is torn: %d bytes not 'a', %d not 'b'", i, n, notA, notB)
		}
		if i == 0 {
			if got := snapRun(t, r, `stat -c %a closed; chmod 700 closed; stat -c %a closed/f; chmod 600 closed/f; cat closed/f`, 0); got != "0\n0\ninside\n" {
				t.Errorf("the closed directory and file restored: %q", got)
			}
		}
	}
	// The source's own closed files keep their modes.
	if got := snapRun(t, src, "stat -c %a closed", 0); got != "0\n" {
		t.Errorf("the source's closed directory after the snapshots: mode %q", got)
	}
	// The writer was resumed: it still runs and still writes.
	snapRun(t, src, `s=$(stat -c %Y.%s f; md5sum < f); i=0; while [ "$(stat -c %Y.%s f; md5sum < f)" = "$s" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ $i -lt 200 ]`, 0)

	// A fork bomb (bounded by the PIDs limit) does not hold the snapshot
	// up; afterwards it is killed like any command.
	bctx, stopBomb := context.WithCancel(ctx)
	bomb := src.Command(bctx, "sh", "-c", `b() { echo x; b & b; }; b`)
	forking := make(chan struct{})
	bomb.Stdout = &firstWrite{c: forking}
	if err := bomb.Start(); err != nil {
		t.Fatal(err)
	}
	<-forking
	sn, err := src.Snapshot(ctx)
	if err != nil {
		t.Errorf("Snapshot during a fork bomb: %v", err)
	} else {
		sn.Remove(ctx)
	}
	stopBomb()
	bomb.Wait()
	stopWriter()
	writer.Wait()

	// Still stopped, never resumed by a snapshot.
	if got := snapRun(t, src, `grep '^State:' /proc/$(cat /tmp/stopped.pid)/status | cut -c8; test ! -e /tmp/resumed`, 0); got != "T\n" {
		t.Errorf("the user's stopped process after the snapshots: state %q", got)
	}
	snapRun(t, src, `kill -CONT $(cat /tmp/stopped.pid)`, 0)
	if err := stopped.Wait(); err != nil {
		t.Errorf("the stopped process, resumed: %v", err)
	}
}

// TestSnapshotCancel: a snapshot whose context ends while the files are
// read fails with the context's error, and leaves no process of the
// source stopped. The deadline grows until a snapshot gets through.
func TestSnapshotCancel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newSandbox(t)
	snapRun(t, src, "head -c 67108864 /dev/urandom > big", 0)
	tctx, stopTicker := context.WithCancel(ctx)
	defer stopTicker()
	ticker := src.Command(tctx, "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.01; done")
	if err := ticker.Start(); err != nil {
		t.Fatal(err)
	}
	defer ticker.Wait()
	defer stopTicker()
	waitExec(t, src, "test -s /tmp/ticks")
	cancelled := 0
	for d := time.Millisecond; ; d *= 2 {
		sctx, cancel := context.WithTimeout(ctx, d)
		sn, err := src.Snapshot(sctx)
		cancel()
		if err == nil {
			sn.Remove(ctx)
			break
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Snapshot with a deadline of %v: %v; want context.DeadlineExceeded", d, err)
		}
		cancelled++
		// Nothing is left stopped: no process in state T, and the ticker
		// ticks on.
		n := snapRun(t, src, "wc -l < /tmp/ticks", 0)
		if got := snapRun(t, src, `grep -l '^State:.*T' /proc/[0-9]*/status 2>/dev/null | wc -l`, 0); got != "0\n" {
			t.Fatalf("after a Snapshot cut at %v: %s processes stopped", d, strings.TrimSpace(got))
		}
		waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %s", strings.TrimSpace(n)))
		if d > time.Minute {
			t.Fatal("no snapshot got through")
		}
	}
	if cancelled == 0 {
		t.Error("no snapshot was cut short")
	}
	t.Logf("%d snapshots cut short before one got through", cancelled)
}

// firstWrite closes c at its first write.
type firstWrite struct {
	c    chan struct{}
	once sync.Once
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.c) })
	return len(p), nil
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
