package sandbox_test

// A sandbox's Lifetime and its owner's death against the real engine:
// the Lifetime ends a sandbox; a sandbox whose owning process is killed
// (one, or twenty at once) ends by itself, and Prune removes what is left
// without touching a live process's sandboxes.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

func TestLimitsLifetime(t *testing.T) {
	testenv.NotOn(t, podmanEvents, testenv.Podman...)
	t.Parallel()
	const lifetime = 2 * time.Second
	cli := engineClient(t)
	created := time.Now()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Lifetime: lifetime}))
	// On a loaded machine the lifetime may be over before the checks of the
	// live sandbox get their turn, or while they run. Only what ends before
	// the lifetime could have passed (it runs from the container's start,
	// after created) is judged; what the end of a container does to a
	// command running in it is TestFaultContainerDuringExec's business.
	vol := ""
	if info, err := cli.ContainerInspect(testCtx(t), sb.ID()); err == nil {
		for _, m := range info.Mounts {
			if m.Destination == "/workspace" {
				vol = m.Name
			}
		}
	} else if !engine.IsNotFound(err) || time.Since(created) < lifetime {
		t.Fatalf("inspect %s %v after New: %v", sb.ID(), time.Since(created), err)
	}
	r, err := sb.Exec(testCtx(t), "echo ok")
	switch {
	case err == nil && r.ExitCode == 0 && r.Stdout == "ok\n":
	case time.Since(created) >= lifetime && errors.Is(err, sandbox.ErrSandboxGone):
		// Not an exit status (such as the runtime's 126 for an exec into
		// a stopping container): the sandbox's end is an error.
		t.Logf("the lifetime was over (%v after New) by the end of the first Exec: %v", time.Since(created), err)
	default:
		t.Fatalf("Exec %v after New, within the %v lifetime: %+v, %v", time.Since(created), lifetime, r, err)
	}

	// The container ends itself, and the engine removes it.
	waitContainerGone(t, cli, sb.ID(), testenv.HangGuard)
	t.Logf("container gone %v after New with a %v lifetime", time.Since(created), lifetime)

	start := time.Now()
	_, err = sb.Exec(testCtx(t), "echo ok")
	if !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Errorf("Exec after the lifetime: %v, want ErrSandboxGone", err)
	}
	t.Logf("Exec noticed the sandbox was gone after %v", time.Since(start))
	if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Errorf("WriteFile after the lifetime: %v, want ErrSandboxGone", err)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("Close after the lifetime: %v", err)
	}
	if vol != "" {
		assertVolumeGone(t, cli, vol)
	}
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
	testenv.NotOn(t, podmanEvents, testenv.Podman...)
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
	helperOwner := info.Config.Labels[owner.LabelOwner]
	if helperOwner == "" || helperOwner == owner.ID() {
		t.Fatalf("helper's owner label %q (mine %q)", helperOwner, owner.ID())
	}
	ownerFilter := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+helperOwner))
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
	// although its Lifetime is an hour (the hang guard is far shorter).
	waitContainerGone(t, cli, id, testenv.HangGuard)
	t.Logf("%v: its container is gone", time.Since(t0))

	// The workdir volume is left behind for Prune, unless another test's
	// Prune (they run in parallel) already took it: the helper is dead.
	vs, err = cli.VolumeList(ctx, volume.ListOptions{Filters: ownerFilter})
	if err != nil || len(vs.Volumes) > 1 {
		t.Fatalf("after the helper's death: %d volumes of its owner, %v; want its leftover workdir", len(vs.Volumes), err)
	}
	if len(vs.Volumes) == 0 {
		t.Logf("the helper's workdir volume was pruned by another test before this one's Prune")
	}
	if !owner.Dead(helperOwner) {
		t.Fatalf("owner.Dead(%q) = false after the helper was killed", helperOwner)
	}

	// Prune takes the leftovers of the dead process and leaves this live
	// process's sandbox alone. (Another test may prune at the same time:
	// check the result, not the count.)
	mine := newSandbox(t)
	mineVol := workdirVolume(t, cli, mine)
	n, err := prune(ctx)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	t.Logf("Prune removed %d objects", n)
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

// ownerKillHelperEnv makes the test binary, run as a child, act as the host
// process of TestOwnerKilledWith20Sandboxes (see TestOwnerKillHelperProcess).
const ownerKillHelperEnv = "AGENTSANDBOX_OWNERKILL_HELPER"

// ownerKillSandboxes is how many sandboxes that helper makes.
const ownerKillSandboxes = 20

// TestOwnerKillHelperProcess is not a test: run as a child process by
// TestOwnerKilledWith20Sandboxes, it makes ownerKillSandboxes busybox
// sandboxes (four at a time), each with a 16 MiB disk and a 2-minute
// Lifetime, prints "ID=<id>" for each and then "READY", and blocks until
// its stdin closes (then it closes them) or it is killed.
func TestOwnerKillHelperProcess(t *testing.T) {
	if os.Getenv(ownerKillHelperEnv) != "1" {
		t.Skip("helper process for TestOwnerKilledWith20Sandboxes")
	}
	sbs := make([]*sandbox.Sandbox, ownerKillSandboxes)
	t.Cleanup(func() {
		var g errgroup.Group
		for _, sb := range sbs {
			g.Go(sb.Close) // nil-safe
		}
		if err := g.Wait(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(4)
	for i := range sbs {
		g.Go(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.HangGuard)
			defer cancel()
			sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage),
				sandbox.WithLimits(sandbox.Limits{Lifetime: 2 * time.Minute, Disk: 16 << 20}))
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			sbs[i] = sb
			fmt.Printf("ID=%s\n", sb.ID())
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("New: %v", err)
	}
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin)
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// loopBackingFiles returns the backing file of every attached loop device
// on this host, by device name ("loop3"). The names of the files the disk
// package makes are unique (a fresh temporary directory each), so they
// tell one process's devices from another's.
func loopBackingFiles(t testing.TB) map[string]string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached since the glob
		}
		m[filepath.Base(filepath.Dir(filepath.Dir(f)))] = strings.TrimSpace(string(b))
	}
	return m
}

// ownedBy lists the engine objects whose owner label is owner.
func ownedBy(t testing.TB, cli *client.Client, helperOwner string) (cs, vs, ns, is int) {
	t.Helper()
	ctx := testCtx(t)
	f := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+helperOwner))
	cl, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	vl, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	nl, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	il, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	return len(cl), len(vl.Volumes), len(nl), len(il)
}

// TestOwnerKilledWith20Sandboxes: the owning process is SIGKILLed with 20
// sandboxes alive. Every container ends by itself, because its init ends
// when its attach stream closes (each exits 0; the 2-minute Lifetime, the
// backstop, would have killed it: 137), and one Prune then removes all the
// rest (volumes, and with them the loop devices of their disks), touching
// no live process's sandbox.
func TestOwnerKilledWith20Sandboxes(t *testing.T) {
	testenv.NotOn(t, podmanEvents, testenv.Podman...)
	if os.Getenv(ownerKillHelperEnv) != "" {
		t.Skip("in the helper process")
	}
	t.Parallel()
	cli := engineClient(t)
	ctx := testCtx(t)
	t0 := time.Now()

	cmd := exec.Command(os.Args[0], "-test.run=^TestOwnerKillHelperProcess$", "-test.count=1", "-test.v=false")
	// The child's TestMain needs no image build: it gets the python image
	// this process already has.
	cmd.Env = append(os.Environ(), ownerKillHelperEnv+"=1", "SANDBOX_IMAGE="+pythonImage)
	stderr := &lockedBuffer{} // read while the helper may still write
	cmd.Stderr = stderr
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
	// Read the helper's lines until it says READY, then drain to EOF.
	var (
		mu  sync.Mutex
		ids []string
	)
	ready, eof := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if id, ok := strings.CutPrefix(line, "ID="); ok {
				mu.Lock()
				ids = append(ids, id)
				mu.Unlock()
			} else if line == "READY" {
				close(ready)
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	// If the test ends before the kill, the helper closes its sandboxes
	// itself (its stdin closes); if it does not go, it is killed.
	killed := false
	t.Cleanup(func() {
		if killed {
			return
		}
		stdin.Close()
		select {
		case <-eof:
		case <-time.After(testenv.HangGuard):
			cmd.Process.Kill()
			<-eof
		}
		cmd.Wait()
		prune(context.Background()) // if it was killed after all
	})
	select {
	case <-ready:
	case <-eof:
		t.Fatalf("the helper ended before READY; its stderr:\n%s", stderr.String())
	case <-time.After(2 * testenv.HangGuard):
		t.Fatalf("hang: the helper made no %d sandboxes in %v; its stderr:\n%s", ownerKillSandboxes, 2*testenv.HangGuard, stderr.String())
	}
	mu.Lock()
	ids = slices.Clone(ids)
	mu.Unlock()
	if len(ids) != ownerKillSandboxes {
		t.Fatalf("the helper printed %d sandbox IDs, want %d", len(ids), ownerKillSandboxes)
	}
	t.Logf("%v: the helper's %d sandboxes are up", time.Since(t0).Round(time.Millisecond), len(ids))

	// What the helper owns: its label, 20 running containers, 20 volumes,
	// each on a loop device of its own.
	info, err := cli.ContainerInspect(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	helperOwner := info.Config.Labels[owner.LabelOwner]
	if helperOwner == "" || helperOwner == owner.ID() || owner.Dead(helperOwner) {
		t.Fatalf("the live helper's owner label %q (mine %q, dead %v)", helperOwner, owner.ID(), owner.Dead(helperOwner))
	}
	byOwner := filters.NewArgs(filters.Arg("label", owner.LabelOwner+"="+helperOwner))
	cs, err := cli.ContainerList(ctx, container.ListOptions{Filters: byOwner}) // running ones
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]bool{}
	for _, c := range cs {
		running[c.ID] = true
	}
	for _, id := range ids {
		if !running[id] {
			t.Fatalf("sandbox %.12s of the helper is not a running container labelled %s", id, helperOwner)
		}
	}
	vl, err := cli.VolumeList(ctx, volume.ListOptions{Filters: byOwner})
	if err != nil || len(vl.Volumes) != ownerKillSandboxes {
		t.Fatalf("the helper's volumes: %d, %v; want %d", len(vl.Volumes), err, ownerKillSandboxes)
	}
	attached := loopBackingFiles(t)
	backing := map[string]string{} // backing file -> loop device
	for _, v := range vl.Volumes {
		if testenv.Caps(t).Disk != driver.DiskExt4 {
			break // a tmpfs of its own (not root on the engine's host): no loop device
		}
		dev := strings.TrimPrefix(v.Options["device"], "/dev/")
		bf, ok := attached[dev]
		if !strings.HasPrefix(dev, "loop") || !ok || backing[bf] != "" {
			t.Fatalf("volume %s: device %q with backing file %q (not a loop device of its own)", v.Name, v.Options["device"], bf)
		}
		backing[bf] = dev
	}

	// The engine reports how each container ends: 0 when its init saw its
	// attach stream close, 137 when the Lifetime backstop killed it. The
	// subscription starts from before the kill (the engine replays recent
	// events), so no die event can come before it is in place.
	kill := time.Now()
	evctx, evcancel := context.WithCancel(ctx)
	msgs, errs := cli.Events(evctx, events.ListOptions{
		Since: fmt.Sprintf("%d.%09d", kill.Unix(), kill.Nanosecond()),
		Filters: filters.NewArgs(
			filters.Arg("type", string(events.ContainerEventType)), filters.Arg("event", string(events.ActionDie)),
			filters.Arg("label", owner.LabelOwner+"="+helperOwner)),
	})
	var evMu sync.Mutex
	exitCodes := map[string]string{} // container ID -> exit code
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		for {
			select {
			case m := <-msgs:
				evMu.Lock()
				exitCodes[m.Actor.ID] = m.Actor.Attributes["exitCode"]
				evMu.Unlock()
			case <-errs:
				return
			}
		}
	}()
	defer func() { evcancel(); <-evDone }()

	// No Prune of this process may run while the dead helper's containers
	// end by themselves: it would remove them by force first (exit 137).
	pruneMu.Lock()
	pruneLocked := true
	unlockPrune := func() {
		if pruneLocked {
			pruneLocked = false
			pruneMu.Unlock()
		}
	}
	defer unlockPrune()

	// SIGKILL: no Close, no cleanup of any kind.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	<-eof
	cmd.Wait()
	if !owner.Dead(helperOwner) {
		t.Fatalf("owner.Dead(%q) = false after the helper was killed", helperOwner)
	}

	// Every container ends and is auto-removed. The bound is a hang guard.
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		n, _, _, _ := ownedBy(t, cli, helperOwner)
		return n == 0, fmt.Sprintf("%d of the dead helper's containers still exist after its death", n)
	})
	gone := time.Since(kill)
	for _, id := range ids {
		if _, err := cli.ContainerInspect(ctx, id); !engine.IsNotFound(err) {
			t.Errorf("container %.12s after all were gone: %v", id, err)
		}
	}
	// Each die event came before its container's removal; the stream may
	// deliver it a little later. (A wait that ends unmet is reported by the
	// check of the exit codes below.)
	byCode := map[string]int{}
	pctx, cancelPoll := context.WithTimeout(ctx, testenv.HangGuard)
	_ = sandboxtest.Poll(pctx, 50*time.Millisecond, func() (bool, string) {
		evMu.Lock()
		defer evMu.Unlock()
		clear(byCode)
		for _, id := range ids {
			c, ok := exitCodes[id]
			if !ok {
				c = "(no die event)"
			}
			byCode[c]++
		}
		return byCode["(no die event)"] == 0, ""
	})
	cancelPoll()
	t.Logf("all %d containers gone %v after the SIGKILL; exit codes: %v", len(ids), gone.Round(time.Millisecond), byCode)
	if byCode["0"] != len(ids) {
		t.Errorf("exit codes %v; want all %d containers to exit 0, ended by their closed attach stream (137: killed, by the Lifetime or by another process's Prune)", byCode, len(ids))
	}
	unlockPrune()

	stillAttached := 0
	for _, bf := range loopBackingFiles(t) {
		if backing[bf] != "" {
			stillAttached++
		}
	}
	_, nv, _, _ := ownedBy(t, cli, helperOwner)
	t.Logf("before Prune: %d volumes and %d loop devices of the dead helper left", nv, stillAttached)

	// One Prune removes the rest and leaves this live process's sandbox
	// alone. (Another test may prune at the same time: check the result,
	// not the count.)
	mine := newSandbox(t)
	mineVol := workdirVolume(t, cli, mine)
	pruneStart := time.Now()
	n, err := prune(ctx)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	t.Logf("Prune removed %d objects in %v", n, time.Since(pruneStart).Round(time.Millisecond))
	if cs, vs, ns, is := ownedBy(t, cli, helperOwner); cs+vs+ns+is != 0 {
		t.Errorf("after Prune, the dead helper still owns %d containers, %d volumes, %d networks, %d images", cs, vs, ns, is)
	}
	// The kernel detaches a loop device asynchronously once its last user
	// (the volume's mount) is gone. The bound is a hang guard.
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		var left []string
		for _, bf := range loopBackingFiles(t) {
			if dev, ok := backing[bf]; ok {
				left = append(left, dev+": "+bf)
			}
		}
		return len(left) == 0, fmt.Sprintf("loop devices of the dead helper still attached after Prune: %q", left)
	})
	t.Logf("no loop device of the dead helper attached %v after Prune", time.Since(pruneStart).Round(time.Millisecond))
	assertAlive(t, mine)
	if _, err := cli.VolumeInspect(ctx, mineVol); err != nil {
		t.Errorf("Prune touched the live sandbox's volume: %v", err)
	}
}
