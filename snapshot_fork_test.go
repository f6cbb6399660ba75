package sandbox_test

// Forks against the real engine: forks are isolated from each other and
// from their source, all or nothing (bad input, a fork that fails, a
// cancelled context), and leave nothing behind.

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/agentsandbox/sandbox/sandboxtest"
)

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
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		cs := forkContainers(t, cli, sn)
		return len(cs) == want, fmt.Sprintf("%d containers of snapshot %.19s, want %d", len(cs), sn.ID(), want)
	})
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

// TestSnapshotBadInput: a closed sandbox, Fork counts out of range, an
// invalid option or a restore that fails for one fork, an image deleted
// behind the library's back.
func TestSnapshotBadInput(t *testing.T) {
	testenv.NotOn(t, podmanSnapshotImage, testenv.Podman...)
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)

	t.Run("closed sandbox", func(t *testing.T) {
		closed, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		if sn, err := closed.Snapshot(ctx); !errors.Is(err, sandbox.ErrClosed) || sn != nil {
			t.Errorf("Snapshot of a closed sandbox: %v, %v; want ErrClosed", sn, err)
		}
	})

	src := newSandbox(t)
	sn := takeSnapshot(t, src)
	t.Run("fork count out of range", func(t *testing.T) {
		for _, n := range []int{0, -1, sandbox.MaxFork + 1, 1 << 40} {
			forks, err := sn.Fork(ctx, n)
			if err == nil || forks != nil || !strings.Contains(err.Error(), fmt.Sprintf("n = %d", n)) ||
				!strings.Contains(err.Error(), strconv.Itoa(sandbox.MaxFork)) {
				t.Errorf("Fork(%d): %d sandboxes, %v; want an error naming n and the cap", n, len(forks), err)
			}
		}
		waitNoForks(t, cli, sn, 0)
	})

	// All or nothing: a fork that cannot start (an invalid option) fails
	// the whole Fork and names the step.
	t.Run("invalid option", func(t *testing.T) {
		forks, err := sn.Fork(ctx, 3, sandbox.WithLimits(sandbox.Limits{PIDs: 2}))
		if err == nil || forks != nil || !strings.Contains(err.Error(), "PIDs") {
			t.Errorf("Fork with invalid limits: %d, %v", len(forks), err)
		}
	})

	// A fork whose restore fails (files larger than its disk): the whole
	// Fork fails, names the sandbox and the step, and the forks already
	// made are removed.
	t.Run("a fork's restore fails", func(t *testing.T) {
		big := newSandbox(t)
		snapRun(t, big, "head -c 3145728 /dev/urandom > fill", 0) // zeros would be restored as a hole
		bsn := takeSnapshot(t, big)
		forks, err := bsn.Fork(ctx, 4, sandbox.WithLimits(sandbox.Limits{Disk: 2 << 20}))
		if err == nil || forks != nil || !strings.Contains(err.Error(), "of 4") || !strings.Contains(err.Error(), "restore") {
			t.Errorf("Fork into too small disks: %d, %v; want an error naming the fork and the restore step", len(forks), err)
		}
		waitNoForks(t, cli, bsn, 0)
	})

	// Its image deleted behind the library's back: restores do not need
	// it, and Remove finds it gone without an error.
	t.Run("image deleted outside", func(t *testing.T) {
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
	})
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
		n := 0
		_ = sandboxtest.Poll(fctx, 5*time.Millisecond, func() (bool, string) {
			cs, err := listForks(fctx, cli, sn)
			if err == nil {
				n = len(cs)
			}
			return n > 0, ""
		})
		watched <- n
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

	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		after := owned()
		return slices.Equal(after, before), fmt.Sprintf("left by the cancelled Fork:\nbefore: %v\nafter:  %v", before, after)
	})
	// The snapshot still works.
	if got := snapRun(t, restore(t, sn), "cat f", 0); got != "x\n" {
		t.Errorf("restore after a cancelled Fork: %q", got)
	}
}
