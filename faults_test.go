package sandbox_test

// Fault injection against the real engine: containers killed, removed or
// paused behind the library's back; an engine that stops answering (frozen
// by internal/faultproxy) or disappears (cut) in the middle of a call; and
// the caller's context cancelled at every engine request of a call. Each
// test asserts that the call fails with the documented error, that no call
// hangs, and that nothing is left behind.
//
// Promptness is reported (t.Logf "took ..."), not asserted tightly: the
// machine running the tests is shared and loaded. A test fails on time only
// past a hang guard, and then logs every goroutine's stack.
//
// None of these tests calls t.Parallel: they compare the set of engine
// objects carrying this process's owner label before and after a call, so
// they must not overlap with other tests of this package (Go runs all
// serial top-level tests before the parallel ones).

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/faultproxy"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// faultBound is the per-sandbox wait bound (WithTestTimeout) of New in
// TestFaultEngineFrozenNew, where the engine stops answering.
const faultBound = 2 * time.Second

// sandboxBound is the per-sandbox bound of the other fault tests' sandboxes:
// shorter than DefaultTimeout, so that a wait that runs into it shows, but
// long enough for a loaded engine to start a container (measured here with
// the docker CLI at load average 16-20 on 2 cores: 3.7-5.5 s per start).
const sandboxBound = 10 * time.Second

// hangGuard is how long a call may take before a test calls it hung.
const hangGuard = 60 * time.Second

// startFaultProxy returns a proxy in front of the real engine, closed when
// the test ends.
func startFaultProxy(t testing.TB) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start("")
	if err != nil {
		t.Fatalf("fault proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// settleAtEnd checks, once the test and its deferred calls are done, that
// this process owns on the engine what it owned when the test began.
func settleAtEnd(t testing.TB, cli *client.Client) {
	t.Helper()
	before := takeInventory(t, cli)
	t.Cleanup(func() { settle(t, cli, before, 30*time.Second, "the end of the test") })
}

// newFaultSandbox makes a busybox sandbox for a fault test; the test closes
// it. Their sandboxes have a bound shorter than DefaultTimeout, which
// the engine of a loaded machine can miss while merely starting a
// container: such a New is retried (up to 3 tries), and the retry logged.
func newFaultSandbox(t testing.TB, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	for try := 1; ; try++ {
		start := time.Now()
		sb, err := sandbox.New(testCtx(t), append([]sandbox.Option{sandbox.WithImage(busyboxImage)}, opts...)...)
		if err == nil {
			return sb
		}
		slow := errors.Is(err, sandbox.ErrUnresponsive) || strings.Contains(err.Error(), "timeout awaiting response headers") ||
			strings.Contains(err.Error(), "no answer")
		if !slow || try == 3 {
			t.Fatalf("New: %v", err)
		}
		t.Logf("SLOW ENGINE: New failed after %v (try %d), retrying: %v", time.Since(start).Round(time.Millisecond), try, err)
	}
}

// viaProxy is the option that sends a sandbox's engine traffic through p.
func viaProxy(p *faultproxy.Proxy) sandbox.Option { return sandbox.WithHost("unix://" + p.Path) }

// timed runs f, logs how long it took, and fails the test, with every
// goroutine's stack in the log, if it has not returned within guard.
func timed(t testing.TB, what string, guard time.Duration, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		d := time.Since(start)
		t.Logf("%s: took %v: %v", what, d.Round(time.Millisecond), err)
		return d, err
	case <-time.After(guard):
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("HANG: %s has not returned after %v; goroutines:\n%s", what, guard, buf)
		return 0, nil
	}
}

// inventory is what this process owns on the engine (objects carrying its
// owner label) and the loop devices it holds open.
type inventory struct {
	objects []string // "container ID (state)", "volume NAME", "network ID", "image ID"
	loops   []string // loop devices open in this process
}

func (i inventory) equal(o inventory) bool {
	return slices.Equal(i.objects, o.objects) && slices.Equal(i.loops, o.loops)
}

// minus returns the entries of i not in o.
func (i inventory) minus(o inventory) []string {
	var d []string
	for _, s := range i.objects {
		if !slices.Contains(o.objects, s) {
			d = append(d, s)
		}
	}
	for _, s := range i.loops {
		if !slices.Contains(o.loops, s) {
			d = append(d, "loop fd "+s)
		}
	}
	return d
}

// takeInventory lists this process's engine objects (by the owner label,
// the same test as sandboxtest.Main) and its open loop devices. A loop
// device the library made stays attached only while this process holds its
// file descriptor or a volume mounts it, and a volume is counted here, so
// the process's own descriptors are what to compare: the global count in
// /sys/block (see attachedLoops) also moves with other processes' tests.
// Container states are left out (a container being removed changes state),
// except "paused", which matters.
func takeInventory(t testing.TB, cli *client.Client) inventory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+owner.ID()))
	var inv inventory
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatalf("list containers: %v", err)
	}
	for _, c := range cs {
		s := "container " + shortID(c.ID) + " " + c.Labels[owner.LabelKind]
		if c.State == "paused" {
			s += " (paused)"
		}
		inv.objects = append(inv.objects, s)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Fatalf("list volumes: %v", err)
	}
	for _, v := range vs.Volumes {
		inv.objects = append(inv.objects, "volume "+v.Name)
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		t.Fatalf("list networks: %v", err)
	}
	for _, n := range ns {
		inv.objects = append(inv.objects, "network "+shortID(n.ID))
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatalf("list images: %v", err)
	}
	for _, i := range is {
		inv.objects = append(inv.objects, "image "+shortID(strings.TrimPrefix(i.ID, "sha256:")))
	}
	slices.Sort(inv.objects)
	inv.loops = ownLoops()
	return inv
}

// ownLoops returns the loop devices this process holds open.
func ownLoops() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var loops []string
	for _, e := range ents {
		dst, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(dst, "/dev/loop") && dst != "/dev/loop-control" {
			loops = append(loops, dst)
		}
	}
	slices.Sort(loops)
	return loops
}

// attachedLoops counts the loop devices attached on this host, by anyone.
func attachedLoops() int {
	m, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	return len(m)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// settle waits up to wait for this process's inventory to be want again
// (auto-removed containers and their volumes go away asynchronously). If
// it is not, it fails the test naming what is left over, and removes that
// through the real engine socket so that later checks start clean.
func settle(t testing.TB, cli *client.Client, want inventory, wait time.Duration, what string) {
	t.Helper()
	loopsBefore := attachedLoops()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var got inventory
	if err := sandboxtest.Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		got = takeInventory(t, cli)
		return got.equal(want), ""
	}); err != nil {
		t.Errorf("LEFT after %s: %v (host loop devices attached: %d)", what, got.minus(want), loopsBefore)
		removeExtra(t, cli, want)
	}
}

// removeExtra removes, through the real socket, this process's objects that
// are not in keep (unpausing paused containers first).
func removeExtra(t testing.TB, cli *client.Client, keep inventory) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+owner.ID()))
	kept := func(s string) bool {
		return slices.ContainsFunc(keep.objects, func(k string) bool { return strings.HasPrefix(k, s) })
	}
	cs, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	for _, c := range cs {
		if !kept("container " + shortID(c.ID)) {
			if c.State == "paused" {
				cli.ContainerUnpause(ctx, c.ID)
			}
			if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !engine.IsNotFound(err) {
				t.Logf("cleanup: remove container %s: %v", shortID(c.ID), err)
			}
		}
	}
	vs, _ := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	for _, v := range vs.Volumes {
		if !kept("volume " + v.Name) {
			// A removed container may still hold it for a moment.
			vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := sandboxtest.Poll(vctx, 100*time.Millisecond, func() (bool, string) {
				err := cli.VolumeRemove(ctx, v.Name, true)
				return err == nil || engine.IsNotFound(err), fmt.Sprint(err)
			})
			cancel()
			if err != nil {
				t.Logf("cleanup: remove volume %s: %v", v.Name, err)
			}
		}
	}
	ns, _ := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	for _, n := range ns {
		if !kept("network " + shortID(n.ID)) {
			cli.NetworkRemove(ctx, n.ID)
		}
	}
	is, _ := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	for _, i := range is {
		if !kept("image " + shortID(strings.TrimPrefix(i.ID, "sha256:"))) {
			cli.ImageRemove(ctx, i.ID, image.RemoveOptions{Force: true, PruneChildren: true})
		}
	}
}

// waitProcess waits until a process whose command line contains cmd runs
// in container id.
func waitProcess(t testing.TB, cli *client.Client, id, cmd string) {
	t.Helper()
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		top, err := cli.ContainerTop(context.Background(), id, nil)
		if err != nil {
			return false, fmt.Sprintf("%q never ran in %s: %v", cmd, shortID(id), err)
		}
		for _, p := range top.Processes {
			if strings.Contains(strings.Join(p, " "), cmd) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%q never ran in %s: %v", cmd, shortID(id), top.Processes)
	})
}

// A fault done to a sandbox's container behind the library's back, through
// the real engine socket.
type fault struct {
	name  string
	gone  bool // the container does not come back: calls must fail with ErrSandboxGone
	apply func(ctx context.Context, cli *client.Client, id string) error
}

var containerFaults = []fault{
	{"kill", true, func(ctx context.Context, cli *client.Client, id string) error {
		return cli.ContainerKill(ctx, id, "KILL")
	}},
	{"remove", true, func(ctx context.Context, cli *client.Client, id string) error {
		return cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	}},
	{"pause", false, func(ctx context.Context, cli *client.Client, id string) error {
		return cli.ContainerPause(ctx, id)
	}},
}

// checkFaultErr checks the error of a call made after (or while) fault f
// hit the sandbox: ErrSandboxGone for a gone container; for a paused one,
// an error that says so (mentions "paused", or ErrUnresponsive).
func checkFaultErr(t testing.TB, f fault, op string, err error) {
	t.Helper()
	switch {
	case f.gone && !errors.Is(err, sandbox.ErrSandboxGone):
		t.Errorf("WRONG ERROR: %s after %s: %v; want ErrSandboxGone", op, f.name, err)
	case !f.gone && err == nil:
		t.Errorf("WRONG ERROR: %s on a paused sandbox succeeded", op)
	case !f.gone && !errors.Is(err, sandbox.ErrUnresponsive) && !strings.Contains(strings.ToLower(err.Error()), "paused"):
		t.Errorf("WRONG ERROR: %s on a paused sandbox: %v; want an error mentioning \"paused\" or ErrUnresponsive", op, err)
	}
}

// fileOp is a call on a sandbox, with the engine request that shows it is
// under way (for "during" faults, applied when that request goes by).
type fileOp struct {
	name   string
	method string // request that marks "during"
	suffix string // path element after /containers/ID
	call   func(ctx context.Context, sb *sandbox.Sandbox) error
}

var faultOps = []fileOp{
	{name: "Exec", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		r, err := sb.Exec(ctx, "echo hi")
		if err == nil {
			return fmt.Errorf("no error, exit code %d, stdout %q (%w)", r.ExitCode, r.Stdout, errNoError)
		}
		return err
	}},
	{name: "WriteFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		return sb.WriteFile(ctx, "g", []byte("y"), 0o644)
	}},
	{name: "ReadFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		_, err := sb.ReadFile(ctx, "f")
		return err
	}},
	{name: "ReadDir", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		_, err := sb.ReadDir(ctx, ".")
		return err
	}},
	{name: "CopyIn", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		return sb.CopyIn(ctx, "in", fstest.MapFS{"a/b.txt": {Data: []byte("b"), Mode: 0o644}})
	}},
	{name: "CopyOut", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		dir, err := os.MkdirTemp("", "faults-copyout-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		return sb.CopyOut(ctx, "f", dir)
	}},
	{name: "Snapshot", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
		sn, err := sb.Snapshot(ctx)
		if err == nil {
			sn.Remove(context.Background())
			return fmt.Errorf("snapshot %s made (%w)", shortID(sn.ID()), errNoError)
		}
		return err
	}},
}

// sourceAndSnapshot makes a sandbox with opts holding the file "f" ("x")
// and a snapshot of it; the caller closes and removes them.
func sourceAndSnapshot(t *testing.T, opts ...sandbox.Option) (*sandbox.Sandbox, *sandbox.Snapshot) {
	t.Helper()
	src, err := sandbox.New(testCtx(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.WriteFile(testCtx(t), "f", []byte("x"), 0o644); err != nil {
		src.Close()
		t.Fatal(err)
	}
	sn, err := src.Snapshot(testCtx(t))
	if err != nil {
		src.Close()
		t.Fatal(err)
	}
	return src, sn
}

// errNoError marks a call that succeeded where it was expected to fail.
var errNoError = errors.New("call succeeded")

// TestFaultContainerBehindOurBack: the sandbox's container is killed,
// removed or paused through the real engine, before a call or while the
// call's engine request is on its way (the fault proxy applies the fault
// when the request goes by, before the engine sees it). The call, and the
// next one, fail with ErrSandboxGone (killed, removed) or an error saying
// the container is paused; Close returns; nothing is left.
func TestFaultContainerBehindOurBack(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	p := startFaultProxy(t)
	for _, f := range containerFaults {
		for _, op := range faultOps {
			for _, when := range []string{"before", "during"} {
				if when == "during" && op.method == "" {
					// No engine request: commands and file operations go to
					// the sandbox's agent over its attach stream
					// (TestFaultContainerDuringExec, TestFaultPausedExec and
					// TestFaultContainerDuringCopyIn fault one under way).
					continue
				}
				t.Run(f.name+"/"+op.name+"/"+when, func(t *testing.T) {
					faultCase(t, cli, p, f, op, when)
				})
			}
		}
	}
}

func faultCase(t *testing.T, cli *client.Client, p *faultproxy.Proxy, f fault, op fileOp, when string) {
	before := takeInventory(t, cli)
	sb := newFaultSandbox(t, viaProxy(p), sandbox.WithTestTimeout(sandboxBound))
	closed := false
	defer func() {
		if !closed {
			sb.Close()
		}
	}()
	if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := sb.ID()
	var fired atomic.Bool
	switch when {
	case "before":
		if err := f.apply(testCtx(t), cli, id); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	case "during":
		want := "/containers/" + id + op.suffix
		p.OnRequest(func(r faultproxy.Request) {
			if r.Method == op.method && strings.Contains(r.Path, want) && !fired.Swap(true) {
				if err := f.apply(context.Background(), cli, id); err != nil {
					t.Errorf("%s at %s: %v", f.name, r, err)
				}
			}
		})
		defer p.OnRequest(nil)
	}
	_, err := timed(t, op.name, hangGuard, func() error { return op.call(context.Background(), sb) })
	if when == "during" && !fired.Load() {
		t.Logf("%s sent no %s .../%s request: the fault never landed", op.name, op.method, op.suffix)
		if err := f.apply(testCtx(t), cli, id); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
	}
	if errors.Is(err, errNoError) {
		err = nil
	}
	if f.gone && err == nil && when == "during" && op.method == "GET" {
		// The read was on its way when the container died: the engine
		// serves reads from a stopped container that is not removed yet,
		// and what it returns is what the files held.
		t.Logf("%s during %s read the files of the stopped container", op.name, f.name)
	} else {
		checkFaultErr(t, f, op.name, err)
	}
	// The next call says the same.
	_, err = timed(t, "next Exec", hangGuard, func() error {
		_, err := sb.Exec(context.Background(), "true")
		return err
	})
	checkFaultErr(t, f, "next Exec", err)
	_, err = timed(t, "Close", hangGuard, sb.Close)
	closed = true
	if err != nil {
		t.Logf("Close: %v", err)
	}
	settle(t, cli, before, 20*time.Second, "Close")
}

// TestFaultContainerDuringExec: a command (sleep 30) runs when the
// container is killed or removed; Exec returns ErrSandboxGone promptly.
// (A container paused during an Exec is TestFaultPausedExec.)
func TestFaultContainerDuringExec(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for _, f := range containerFaults[:2] {
		for _, api := range []string{"Exec", "Cmd.Run"} {
			t.Run(f.name+"/"+api, func(t *testing.T) {
				before := takeInventory(t, cli)
				sb := newFaultSandbox(t, sandbox.WithTestTimeout(sandboxBound))
				defer func() {
					timed(t, "Close", hangGuard, sb.Close)
					settle(t, cli, before, 20*time.Second, "Close")
				}()
				done := make(chan error, 1)
				var res *sandbox.Result
				go func() {
					if api == "Exec" {
						var err error
						res, err = sb.Exec(context.Background(), "sleep 30")
						done <- err
					} else {
						done <- sb.Command(context.Background(), "sleep", "30").Run()
					}
				}()
				waitProcess(t, cli, sb.ID(), "sleep 30")
				if err := f.apply(testCtx(t), cli, sb.ID()); err != nil {
					t.Fatal(err)
				}
				_, err := timed(t, api+" after "+f.name, hangGuard, func() error { return <-done })
				if !errors.Is(err, sandbox.ErrSandboxGone) {
					if res != nil {
						t.Errorf("WRONG ERROR: %s when the container got %s: %v, result %+v; want ErrSandboxGone", api, f.name, err, *res)
					} else {
						t.Errorf("WRONG ERROR: %s when the container got %s: %v; want ErrSandboxGone", api, f.name, err)
					}
				}
			})
		}
	}
}

// TestFaultForkFromKilledSource: a snapshot does not depend on its source
// sandbox: after the source is killed, Fork still works.
func TestFaultForkFromKilledSource(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	before := takeInventory(t, cli)
	src, sn := sourceAndSnapshot(t, sandbox.WithImage(busyboxImage))
	defer src.Close()
	if err := cli.ContainerKill(testCtx(t), src.ID(), "KILL"); err != nil {
		t.Fatal(err)
	}
	var forks []*sandbox.Sandbox
	_, err := timed(t, "Fork(2) from a killed source's snapshot", hangGuard, func() error {
		var err error
		forks, err = sn.Fork(context.Background(), 2)
		return err
	})
	if err != nil {
		t.Errorf("Fork from the snapshot of a killed sandbox: %v", err)
	}
	for _, fk := range forks {
		if got, err := fk.ReadFile(testCtx(t), "f"); err != nil || string(got) != "x" {
			t.Errorf("fork's f: %q, %v", got, err)
		}
		fk.Close()
	}
	_, err = timed(t, "source Exec", hangGuard, func() error { _, err := src.Exec(context.Background(), "true"); return err })
	checkFaultErr(t, containerFaults[0], "source Exec", err)
	src.Close()
	if err := sn.Remove(testCtx(t)); err != nil {
		t.Errorf("Remove snapshot: %v", err)
	}
	settle(t, cli, before, 20*time.Second, "Close and Remove")
}

// TestFaultForkKilledWhileForking: one of the new sandboxes is killed,
// removed or paused as soon as it runs, while Fork starts its agent or
// restores the snapshot's 32 MiB into it. Fork fails naming the fork
// (ErrSandboxGone for kill/remove) or, for pause, at least returns;
// nothing is left.
func TestFaultForkKilledWhileForking(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	// A bound long enough for a loaded engine to start the forks.
	src := newFaultSandbox(t, sandbox.WithTestTimeout(sandboxBound))
	defer src.Close()
	if r, err := src.Exec(testCtx(t), "head -c 33554432 /dev/urandom > f"); err != nil || r.ExitCode != 0 {
		t.Fatalf("fill: %v %+v", err, r)
	}
	sn, err := src.Snapshot(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Remove(context.Background())
	forksOf := filters.NewArgs(filters.Arg("label", sandbox.LabelSnapshot+"="+sn.ID()), filters.Arg("status", "running"))
	for _, f := range containerFaults {
		t.Run(f.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			var forks []*sandbox.Sandbox
			var victim string
			for try := 1; ; try++ {
				wctx, stop := context.WithCancel(context.Background())
				hit := make(chan string, 1)
				go func() { // the first fork seen running gets the fault
					defer close(hit)
					_ = sandboxtest.Poll(wctx, 2*time.Millisecond, func() (bool, string) {
						cs, err := cli.ContainerList(wctx, container.ListOptions{Filters: forksOf})
						if err != nil || len(cs) == 0 {
							return false, ""
						}
						if err := f.apply(context.Background(), cli, cs[0].ID); err != nil {
							t.Errorf("%s %s: %v", f.name, shortID(cs[0].ID), err)
						}
						hit <- cs[0].ID
						return true, ""
					})
				}()
				_, err = timed(t, "Fork(2)", hangGuard, func() error {
					var err error
					forks, err = sn.Fork(context.Background(), 2)
					return err
				})
				stop()
				victim = <-hit
				if victim != "" && (err != nil || !f.gone) {
					break
				}
				for _, fk := range forks {
					fk.Close()
				}
				if try == 5 {
					t.Fatalf("the fault never landed while Fork ran: %v", err)
				}
				t.Logf("try %d: the fault came after Fork was done (%v), again", try, err)
			}
			switch {
			case f.gone && !errors.Is(err, sandbox.ErrSandboxGone):
				t.Errorf("WRONG ERROR: Fork with fork %s %sed: %v; want ErrSandboxGone", shortID(victim), f.name, err)
			case err == nil:
				t.Logf("Fork with a fork paused as it started succeeded")
				for _, fk := range forks {
					_, err := timed(t, "Exec in fork", hangGuard, func() error { _, err := fk.Exec(context.Background(), "true"); return err })
					if fk.ID() == victim {
						checkFaultErr(t, f, "Exec in the paused fork", err)
					}
				}
			default:
				t.Logf("Fork with fork %s %sed: %v", shortID(victim), f.name, err)
			}
			for _, fk := range forks {
				timed(t, "Close fork", hangGuard, fk.Close)
			}
			settle(t, cli, before, 20*time.Second, "Fork")
		})
	}
}

// TestFaultContainerDuringCopyIn: the container is killed, removed or
// paused while a CopyIn's upload is under way (its source blocks until the
// fault has landed). CopyIn returns ErrSandboxGone, or an error saying the
// container is paused, within the sandbox's bound; Close removes
// everything.
func TestFaultContainerDuringCopyIn(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for _, f := range containerFaults {
		t.Run(f.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			sb := newFaultSandbox(t, sandbox.WithTestTimeout(sandboxBound))
			defer func() {
				timed(t, "Close", hangGuard, sb.Close)
				settle(t, cli, before, 20*time.Second, "Close")
			}()
			release := make(chan struct{})
			src := newBlockingFS(release)
			done := make(chan error, 1)
			go func() { done <- sb.CopyIn(context.Background(), "in", src) }()
			<-src.reading
			if err := f.apply(testCtx(t), cli, sb.ID()); err != nil {
				close(release)
				t.Fatal(err)
			}
			close(release)
			_, err := timed(t, "CopyIn after "+f.name, hangGuard, func() error { return <-done })
			checkFaultErr(t, f, "CopyIn", err)
		})
	}
}

// TestFaultPausedExec: the container is paused (docker pause) while a
// command (sleep 30) runs; the command's context deadline, or ExecTimeout,
// still ends Exec and Cmd.Run within the sandbox's bound of it, with
// TimedOut or an error saying the container is paused; Close of the still
// paused sandbox removes everything.
func TestFaultPausedExec(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for _, api := range []string{"Exec", "Cmd.Run"} {
		for _, bound := range []string{"ctx deadline", "ExecTimeout"} {
			t.Run(api+"/"+bound, func(t *testing.T) {
				before := takeInventory(t, cli)
				opts := []sandbox.Option{sandbox.WithImage(busyboxImage), sandbox.WithTestTimeout(sandboxBound)}
				// The command's own bound; long enough for the pause to land
				// before it even when starting an exec takes seconds.
				const limit = 8 * time.Second
				if bound == "ExecTimeout" {
					opts = append(opts, sandbox.WithLimits(sandbox.Limits{ExecTimeout: limit}))
				}
				sb := newFaultSandbox(t, opts[1:]...)
				ctx := context.Background()
				if bound == "ctx deadline" {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, limit)
					defer cancel()
				}
				defer func() {
					timed(t, "Close (paused)", hangGuard, sb.Close)
					settle(t, cli, before, 20*time.Second, "Close of a paused sandbox")
				}()
				done := make(chan error, 1)
				var res *sandbox.Result
				start := time.Now()
				go func() {
					if api == "Exec" {
						var err error
						res, err = sb.Exec(ctx, "sleep 30")
						done <- err
					} else {
						done <- sb.Command(ctx, "sleep", "30").Run()
					}
				}()
				waitProcess(t, cli, sb.ID(), "sleep 30")
				if err := cli.ContainerPause(testCtx(t), sb.ID()); err != nil {
					t.Fatal(err)
				}
				pausedAt := time.Since(start)
				if pausedAt >= limit {
					t.Logf("INCONCLUSIVE: the pause landed %v after the start, after the command's bound", pausedAt)
				}
				_, err := timed(t, api+" paused mid-command", limit+3*sandboxBound, func() error { return <-done })
				t.Logf("paused %v after the start; %s returned %v after the start", pausedAt.Round(time.Millisecond), api, time.Since(start).Round(time.Millisecond))
				var ee *sandbox.ExitError
				switch {
				case api == "Exec" && err == nil && res.TimedOut:
				case api == "Exec" && err == nil:
					t.Errorf("WRONG RESULT: Exec paused mid-command: %+v, want TimedOut or an error", *res)
				case api == "Cmd.Run" && errors.As(err, &ee) && errors.Is(err, context.DeadlineExceeded):
				case errors.Is(err, sandbox.ErrUnresponsive), err != nil && strings.Contains(err.Error(), "paused"):
				default:
					t.Errorf("WRONG ERROR: %s paused mid-command: %v; want a timeout, ErrUnresponsive or an error mentioning paused", api, err)
				}
			})
		}
	}
}
