package sandbox_test

// The life of snapshots against the real engine: Remove with a fork
// running, a chain of 150 snapshots, Prune of a dead process's snapshot,
// and the audit records of snapshot, restore, fork and remove.

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

// waitImageGone polls the engine until the image is deleted.
func waitImageGone(t testing.TB, cli *client.Client, id string) {
	t.Helper()
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		_, err := cli.ImageInspect(testCtx(t), id)
		if err != nil && !engine.IsNotFound(err) {
			t.Fatalf("inspect image %.19s: %v", id, err)
		}
		return engine.IsNotFound(err), fmt.Sprintf("image %.19s still exists", id)
	})
}

// TestSnapshotRemoveWhileForkRuns: Remove with a fork running deletes the
// snapshot's image at once; the fork keeps working (it needs nothing of
// the snapshot once restored), and new restores and Image fail.
func TestSnapshotRemoveWhileForkRuns(t *testing.T) {
	testenv.NotOn(t, podmanSnapshotImage, testenv.Podman...)
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
		if err := f(); !errors.Is(err, sandbox.ErrSnapshotRemoved) || errors.Is(err, sandbox.ErrImageNotFound) {
			t.Errorf("%s of a removed snapshot: %v, want ErrSnapshotRemoved", name, err)
		}
	}
	waitNoForks(t, cli, sn, 1)
}

// TestSnapshotChain150: snapshot → restore → change → snapshot, 150 times
// in a row, far past the overlay's depth limit (~125) had each snapshot
// been committed on top of the previous one; the last one's image is
// base + one layer. Every intermediate snapshot is removed as the chain
// moves on; -short runs 20 steps.
func TestSnapshotChain150(t *testing.T) {
	testenv.NotOn(t, podmanSnapshotImage, testenv.Podman...)
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
	testenv.NotOn(t, podmanSnapshotImage, testenv.Podman...)
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
