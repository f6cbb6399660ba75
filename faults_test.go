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
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
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
	"github.com/agentsandbox/sandbox/docker"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/faultproxy"
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
	deadline := time.Now().Add(wait)
	for {
		got := takeInventory(t, cli)
		if got.equal(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("LEFT after %s: %v (host loop devices attached: %d)", what, got.minus(want), loopsBefore)
			removeExtra(t, cli, want)
			return
		}
		time.Sleep(100 * time.Millisecond)
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
			for i := 0; i < 50; i++ { // a removed container may still hold it
				if err := cli.VolumeRemove(ctx, v.Name, true); err == nil || engine.IsNotFound(err) {
					break
				}
				time.Sleep(100 * time.Millisecond)
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		top, err := cli.ContainerTop(context.Background(), id, nil)
		if err == nil {
			for _, p := range top.Processes {
				if strings.Contains(strings.Join(p, " "), cmd) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never ran in %s: %v", cmd, shortID(id), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
					for wctx.Err() == nil {
						cs, err := cli.ContainerList(wctx, container.ListOptions{Filters: forksOf})
						if err == nil && len(cs) > 0 {
							if err := f.apply(context.Background(), cli, cs[0].ID); err != nil {
								t.Errorf("%s %s: %v", f.name, shortID(cs[0].ID), err)
							}
							hit <- cs[0].ID
							return
						}
						time.Sleep(2 * time.Millisecond)
					}
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

// TestFaultEngineFrozenNew: the engine stops answering (the proxy freezes)
// when one of New's requests goes by; the caller's context has no
// deadline, the sandbox's bound is faultBound. New fails with
// ErrUnresponsive (and ErrEngineUnavailable) within a few bounds; after
// the engine answers again, nothing of it is left.
func TestFaultEngineFrozenNew(t *testing.T) {
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for i, tc := range []struct {
		name    string
		method  string
		path    string
		replies bool // only the replies freeze: the request is carried out
	}{
		{"image inspect", "GET", "/images/", false},
		{"volume create", "POST", "/volumes/create", false},
		{"volume create reply", "POST", "/volumes/create", true},
		{"container create", "POST", "/containers/create", false},
		{"container create reply", "POST", "/containers/create", true},
		{"attach", "POST", "/attach", false},
		{"start", "POST", "/start", false},
		{"start reply", "POST", "/start", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startFaultProxy(t)
			// One driver through the proxy for the whole subtest: it
			// remembers what the frozen engine did not answer. Used once
			// first, so that it knows the engine and New's first request
			// is the image's.
			drv := docker.New(docker.Config{Host: "unix://" + p.Path, Timeout: faultBound})
			defer drv.Close()
			warm, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
			if err != nil {
				t.Fatal(err)
			}
			warm.Close()
			before := takeInventory(t, cli)
			var frozeAt atomic.Value
			p.OnRequest(func(r faultproxy.Request) {
				if r.Method == tc.method && strings.Contains(r.Path, tc.path) && frozeAt.Load() == nil {
					frozeAt.Store(r.String())
					if tc.replies {
						p.FreezeReplies()
					} else {
						p.Freeze()
					}
				}
			})
			var sb *sandbox.Sandbox
			d, err := timed(t, "New", 10*faultBound, func() error {
				var err error
				sb, err = sandbox.New(context.Background(), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv), sandbox.WithTestTimeout(faultBound))
				return err
			})
			t.Logf("froze at %v; New took %.1f bounds", frozeAt.Load(), float64(d)/float64(faultBound))
			p.Thaw()
			// Held requests reach the engine now; wait until it has
			// answered them all (every connection through the proxy has
			// closed once the driver lets go of its idle ones), so that
			// what they make is seen below.
			drv.CloseIdleConnections()
			for deadline := time.Now().Add(30 * time.Second); p.Conns() > 0 && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
				drv.CloseIdleConnections()
			}
			t.Logf("connections still open through the proxy after the thaw: %v", p.Open())
			if err == nil {
				t.Errorf("WRONG ERROR: New with the engine frozen at %v succeeded", frozeAt.Load())
				timed(t, "Close", hangGuard, sb.Close)
			} else if !errors.Is(err, sandbox.ErrUnresponsive) || !errors.Is(err, sandbox.ErrEngineUnavailable) {
				t.Errorf("WRONG ERROR: New with the engine frozen: %v; want ErrUnresponsive and ErrEngineUnavailable", err)
			}
			// A request the engine did not answer may have been carried out
			// after the thaw (a create), or not (a removal): the library
			// driver remembers those objects and removes them at its
			// next Close of a sandbox, or at its Prune.
			if i%2 == 0 {
				_, err = timed(t, "New and Close through the thawed proxy", hangGuard, func() error {
					sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv))
					if err != nil {
						return err
					}
					return sb.Close()
				})
			} else {
				_, err = timed(t, "Prune", hangGuard, func() error { _, err := drv.Prune(testCtx(t)); return err })
			}
			if err != nil {
				t.Error(err)
			}
			settle(t, cli, before, 30*time.Second, "New failed on a frozen engine, then thawed, then the next Close or Prune")
		})
	}
}

// TestFaultContainerDuringCopyIn: the container is killed, removed or
// paused while a CopyIn's upload is under way (its source blocks until the
// fault has landed). CopyIn returns ErrSandboxGone, or an error saying the
// container is paused, within the sandbox's bound; Close removes
// everything.
func TestFaultContainerDuringCopyIn(t *testing.T) {
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

// TestFaultEngineCut: the engine disappears (the proxy closes every
// connection and refuses new ones) while a command runs, before a file
// write, while a file is read, or while New runs. Calls fail with ErrEngineUnavailable (or
// ErrSandboxGone, where the attach stream's end says so first) promptly;
// Close returns. The container ends by itself once its attach stream is
// gone (unless paused); what the library could not remove is removed here
// through the real socket.
func TestFaultEngineCut(t *testing.T) {
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for _, tc := range []struct {
		name   string
		method string // cut when this request goes by ("" = cut before the call)
		suffix string
		call   func(ctx context.Context, sb *sandbox.Sandbox) error
	}{
		{name: "Exec running", call: nil},
		{name: "before WriteFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			return sb.WriteFile(ctx, "g", []byte("y"), 0o644)
		}},
		{name: "before Exec", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			_, err := sb.Exec(ctx, "true")
			return err
		}},
		{name: "before ReadFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			_, err := sb.ReadFile(ctx, "f")
			return err
		}},
		{name: "during New", method: "POST", suffix: "/containers/create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			p := startFaultProxy(t)
			opts := []sandbox.Option{sandbox.WithImage(busyboxImage), viaProxy(p), sandbox.WithTestTimeout(sandboxBound)}
			if tc.name == "during New" {
				p.OnRequest(func(r faultproxy.Request) {
					if r.Method == tc.method && strings.Contains(r.Path, tc.suffix) {
						p.Cut()
					}
				})
				_, err := timed(t, "New", hangGuard, func() error {
					sb, err := sandbox.New(context.Background(), opts...)
					if err == nil {
						sb.Close()
					}
					return err
				})
				if !errors.Is(err, sandbox.ErrEngineUnavailable) {
					t.Errorf("WRONG ERROR: New with the engine gone: %v; want ErrEngineUnavailable", err)
				}
				cutLeftovers(t, cli, before)
				return
			}
			sb := newFaultSandbox(t, opts[1:]...)
			id := sb.ID()
			var err error
			if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.call == nil { // Exec running
				done := make(chan error, 1)
				go func() { _, err := sb.Exec(context.Background(), "sleep 30"); done <- err }()
				waitProcess(t, cli, id, "sleep 30")
				p.Cut()
				_, err = timed(t, "Exec when cut", hangGuard, func() error { return <-done })
			} else {
				if tc.method == "" {
					p.Cut()
				} else {
					want := "/containers/" + id + tc.suffix
					p.OnRequest(func(r faultproxy.Request) {
						if r.Method == tc.method && strings.Contains(r.Path, want) {
							p.Cut()
						}
					})
				}
				_, err = timed(t, tc.name, hangGuard, func() error { return tc.call(context.Background(), sb) })
			}
			if !errors.Is(err, sandbox.ErrEngineUnavailable) && !errors.Is(err, sandbox.ErrSandboxGone) {
				t.Errorf("WRONG ERROR: %s with the engine gone: %v; want ErrEngineUnavailable or ErrSandboxGone", tc.name, err)
			}
			_, err = timed(t, "Close", hangGuard, sb.Close)
			if err == nil {
				t.Logf("Close with the engine gone returned nil")
			}
			cutLeftovers(t, cli, before)
		})
	}
}

// cutLeftovers reports what a sandbox whose engine went away left: its
// container should end by itself (its attach stream is gone) unless it is
// paused (its init is frozen, and only the engine can end it, once the
// library reaches it again, at Close or Prune); its volume
// the library could not remove. All are then removed through the real
// socket.
func cutLeftovers(t testing.TB, cli *client.Client, before inventory) {
	t.Helper()
	// Only a sandbox's container that is not paused has a process that
	// ends it; a helper container (never started) stays until removed.
	ending := func(s string) bool {
		return strings.HasPrefix(s, "container ") && strings.Contains(s, " sandbox") && !strings.HasSuffix(s, "(paused)")
	}
	deadline := time.Now().Add(20 * time.Second)
	var left []string
	for {
		left = takeInventory(t, cli).minus(before)
		if !slices.ContainsFunc(left, ending) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, s := range left {
		if ending(s) {
			t.Errorf("LEFT: the sandbox's container did not end by itself after the engine connection was cut: %s", s)
		}
	}
	if len(left) > 0 {
		t.Logf("left after the cut (removed now through the real socket): %v", left)
	}
	removeExtra(t, cli, before)
	settle(t, cli, before, 20*time.Second, "cleanup")
}

// TestFaultCancelEveryStep: for k = 1, 2, ..., the caller's context is
// cancelled when the k-th engine request of a call goes by, until the call
// gets through all its requests without the cancel. Every cancelled call
// fails with context.Canceled and leaves nothing behind (engine objects,
// loop devices), and the sandbox it worked on (if any) still works.
func TestFaultCancelEveryStep(t *testing.T) {
	cli := engineClient(t)
	settleAtEnd(t, cli)
	p := startFaultProxy(t)
	newOpts := []sandbox.Option{sandbox.WithImage(busyboxImage), viaProxy(p), sandbox.WithTestTimeout(sandboxBound)}
	// Once through the proxy, so that the engine's API version is known
	// for its address, and each call below has the same steps.
	warm, err := sandbox.New(testCtx(t), newOpts...)
	if err != nil {
		t.Fatal(err)
	}
	warm.Close()

	src, sn := sourceAndSnapshot(t, newOpts...)
	defer src.Close()
	defer sn.Remove(context.Background())

	for _, tc := range []struct {
		name string
		call func(ctx context.Context) (cleanup func(), err error)
	}{
		{"New", func(ctx context.Context) (func(), error) {
			sb, err := sandbox.New(ctx, newOpts...)
			return func() { sb.Close() }, err
		}},
		{"Fork2", func(ctx context.Context) (func(), error) {
			forks, err := sn.Fork(ctx, 2)
			return func() {
				for _, f := range forks {
					f.Close()
				}
			}, err
		}},
		{"CopyIn", func(ctx context.Context) (func(), error) {
			return func() {}, src.CopyIn(ctx, "in", fstest.MapFS{
				"a.txt":   {Data: []byte("a"), Mode: 0o644},
				"d/b.txt": {Data: []byte("b"), Mode: 0o600},
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			hostLoops := attachedLoops()
			var seq []string
			var mu sync.Mutex
			for k := 1; k <= 100; k++ {
				ctx, cancel := context.WithCancel(context.Background())
				var n atomic.Int32
				var at atomic.Value
				mu.Lock()
				seq = seq[:0]
				mu.Unlock()
				p.OnRequest(func(r faultproxy.Request) {
					mu.Lock()
					seq = append(seq, r.Method+" "+trimVersion(r.Path))
					mu.Unlock()
					if int(n.Add(1)) == k {
						at.Store(r.Method + " " + trimVersion(r.Path))
						cancel()
					}
				})
				var cleanup func()
				_, err := timed(t, fmt.Sprintf("%s cancelled at request %d", tc.name, k), hangGuard, func() error {
					var err error
					cleanup, err = tc.call(ctx)
					return err
				})
				p.OnRequest(nil)
				cancel()
				cancelled := at.Load() != nil
				switch {
				case err == nil && !cancelled:
					cleanup()
					mu.Lock()
					t.Logf("%s: %d steps (engine requests): %s", tc.name, k-1, strings.Join(seq, ", "))
					mu.Unlock()
					settle(t, cli, before, 20*time.Second, tc.name)
					t.Logf("loop devices: held by this process %v before and %v after; attached on the host %d before and %d after (other processes' tests move that count too)",
						before.loops, ownLoops(), hostLoops, attachedLoops())
					return
				case err == nil:
					t.Logf("k=%d: the cancel at %v came too late to matter: %s succeeded", k, at.Load(), tc.name)
					cleanup()
				case !cancelled:
					t.Fatalf("%s failed without a cancel: %v", tc.name, err)
				case !errors.Is(err, context.Canceled):
					t.Errorf("WRONG ERROR: k=%d, cancel at %v: %v; want context.Canceled", k, at.Load(), err)
				}
				settle(t, cli, before, 20*time.Second, fmt.Sprintf("%s cancelled at request %d (%v)", tc.name, k, at.Load()))
				if tc.name == "CopyIn" {
					// The source still works (and is not left paused).
					_, err := timed(t, "Exec in the source", 30*time.Second, func() error {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						defer cancel()
						r, err := src.Exec(ctx, "cat f")
						if err == nil && r.Stdout != "x" {
							err = fmt.Errorf("cat f: %+v", *r)
						}
						return err
					})
					if err != nil {
						t.Errorf("BROKEN SOURCE: after %s cancelled at request %d (%v): %v", tc.name, k, at.Load(), err)
						if info, ierr := cli.ContainerInspect(testCtx(t), src.ID()); ierr == nil && info.State.Paused {
							t.Errorf("the source was left paused; unpausing it to go on")
							cli.ContainerUnpause(testCtx(t), src.ID())
						}
					}
				}
			}
			t.Errorf("%s never got through without a cancel in 100 steps", tc.name)
		})
	}
}

// trimVersion drops the "/v1.41" prefix and the query of an API path, and
// shortens container IDs, for logs.
func trimVersion(p string) string {
	if strings.HasPrefix(p, "/v1.") {
		if i := strings.Index(p[1:], "/"); i >= 0 {
			p = p[i+1:]
		}
	}
	p, _, _ = strings.Cut(p, "?")
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if len(s) == 64 {
			parts[i] = s[:12]
		}
	}
	return strings.Join(parts, "/")
}

// TestDriverSharesConnection: the sandboxes of one driver share its
// connection and what it learned of the engine. Through a proxy that sees
// every request, five sandboxes made one after another with one driver
// negotiate the API version once, ask the engine's version once and check
// the agent's volume once, and their requests (attach streams aside) ride
// on few connections, kept alive between sandboxes.
func TestDriverSharesConnection(t *testing.T) {
	t.Parallel()
	p := startFaultProxy(t)
	d := docker.New(docker.Config{Host: "unix://" + p.Path, AgentVolume: "agentsandbox-agent-test-" + randomHex(4)})
	t.Cleanup(func() { d.Close() })
	var mu sync.Mutex
	count := map[string]int{}
	conns := map[int]bool{}
	p.OnRequest(func(r faultproxy.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.Contains(r.Path, "/_ping"):
			count["ping"]++
		case strings.HasSuffix(r.Path, "/version"):
			count["version"]++
		case strings.Contains(r.Path, "/containers/create?name=agentsandbox-agentfill"):
			count["agent volume check"]++
		}
		if !strings.Contains(r.Path, "/attach") {
			conns[r.Conn] = true
		}
	})
	cli := engineClient(t)
	var volume string
	for i := range 5 {
		sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(d), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
		if err != nil {
			t.Fatalf("New %d: %v", i, err)
		}
		if r := mustExec(t, sb, "echo ok"); r.Stdout != "ok\n" {
			t.Errorf("Exec in sandbox %d: %q", i, r.Stdout)
		}
		if volume == "" {
			info, err := cli.ContainerInspect(testCtx(t), sb.ID())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range info.Mounts {
				if m.Destination == "/.sandbox-agent" {
					volume = m.Name
				}
			}
		}
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if volume != "" {
		cli.VolumeRemove(context.Background(), volume, true)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, what := range []string{"ping", "version", "agent volume check"} {
		if count[what] != 1 {
			t.Errorf("%s: %d requests for 5 sandboxes of one driver, want 1", what, count[what])
		}
	}
	if len(conns) > 3 {
		t.Errorf("5 sandboxes made one after another used %d connections for their requests, want at most 3 (kept alive)", len(conns))
	}
	t.Logf("requests %v on %d connections (attach streams aside)", count, len(conns))
}
