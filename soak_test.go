package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// soakN is the number of sandbox lifecycles TestSoak runs; 0 skips it.
var soakN = flag.Int("soak", 0, "run TestSoak with this many sandbox lifecycles (0: skip it); e.g. go test -v -run TestSoak -soak=1000 -timeout 60m .")

const (
	soakParallel = 8                // lifecycles in flight at once
	soakBatch    = 100              // lifecycles between two leak checks
	soakLeakWait = 15 * time.Second // how long the leak check polls for the counters to settle
	// soakGoroutineSlack is how many goroutines more than the baseline the
	// leak check tolerates (runtime and HTTP transport goroutines that come
	// and go on their own).
	soakGoroutineSlack = 5
	// soakLifeTimeout bounds one lifecycle: a guard against hangs.
	soakLifeTimeout = 10 * time.Minute
	// soakStuck is how long one step may run before the watchdog reports it.
	soakStuck = 2 * time.Minute
	// soakKillDeadline is the context deadline of the Exec that is killed.
	soakKillDeadline = time.Second
	// soakKillSlow: a killed Exec that returns later than this after its
	// deadline is counted and reported as slow (not failed: the design's
	// "about a second" is not asserted on a shared machine).
	soakKillSlow = 2 * time.Second
	// soakReapGuard bounds the wait for the killed processes to be gone: a
	// hang guard, exceeding it means they survived.
	soakReapGuard = 30 * time.Second
)

// soakKinds are the step kinds whose durations are reported, in order.
var soakKinds = []string{
	"new", "exec", "write", "read", "fileop", "copyin", "copyout",
	"snapshot", "restore", "fork", "snapremove", "kill", "reap", "close",
}

// TestSoak runs *soakN sandbox lifecycles, soakParallel at a time, in
// batches of soakBatch, and after each batch checks that this process's
// goroutines and file descriptors, its engine objects and its loop devices
// are back to what they were before the first batch. Each lifecycle creates
// a sandbox with slightly varied limits, runs commands, works with files,
// kills a command, sometimes snapshots, restores and forks, and closes it,
// checking every result exactly.
//
// It is opt-in (the -soak flag), not an environment skip. Run it with -v to
// see the per-batch lines and the final figures.
func TestSoak(t *testing.T) {
	if *soakN <= 0 {
		t.Skip("soak test: enable with -soak=N (e.g. -soak=1000 -timeout 60m)")
	}
	n := *soakN

	// Disks are backed by loop devices whose image file is made under
	// os.TempDir(); a TMPDIR of our own makes this process's devices
	// recognisable among those of everyone else on the host (the kernel
	// keeps the image's former path in backing_file).
	tmp, err := os.MkdirTemp("", fmt.Sprintf("soak-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)

	st := &soakStats{d: map[string][]time.Duration{}, inflight: map[int]*soakLife{}}
	stopWatch := st.watchdog(t)
	defer stopWatch()

	base, err := soakMeasure(context.Background(), tmp)
	if err != nil {
		t.Fatalf("baseline: %v", err)
	}
	t.Logf("soak: %d lifecycles, %d at a time, batches of %d; baseline: %v", n, soakParallel, soakBatch, base)

	start := time.Now()
	done := 0
	var failures []error
	for batch := 1; done < n; batch++ {
		size := min(soakBatch, n-done)
		var (
			g  errgroup.Group
			mu sync.Mutex
		)
		g.SetLimit(soakParallel)
		for i := range size {
			num := done + i + 1
			g.Go(func() error {
				if err := st.lifecycle(num); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					t.Errorf("%v", err)
				}
				return nil
			})
		}
		g.Wait()
		done += size
		elapsed := time.Since(start)

		now, settled, err := soakSettle(base, tmp)
		if err != nil {
			t.Fatalf("batch %d: leak check: %v", batch, err)
		}
		t.Logf("batch %2d: %4d lifecycles, elapsed %8v, %6.1f lifecycles/min; goroutines %d (base %d), fds %d (base %d), engine objects: %v, loop devices: %d of ours (base %d), %d on the host (base %d)",
			batch, done, elapsed.Round(time.Second), float64(done)/elapsed.Minutes(),
			now.goroutines, base.goroutines, now.fds, base.fds, now.objects,
			len(now.ourLoops), len(base.ourLoops), len(now.allLoops), len(base.allLoops))
		if len(now.allLoops) != len(base.allLoops) {
			// Other processes on this host (other test runs) attach loop
			// devices too: this count is informative only.
			t.Logf("batch %d: note: %d loop devices attached on the host, %d before the first batch (other processes' included)",
				batch, len(now.allLoops), len(base.allLoops))
		}
		if !settled {
			t.Errorf("batch %d: leak: %s", batch, soakLeakReport(base, now))
			break
		}
		if len(failures) > 0 {
			t.Errorf("batch %d: %d lifecycles failed; stopping", batch, len(failures))
			break
		}
	}
	total := time.Since(start)
	st.report(t, done, total)
}

// soakStats gathers step durations and tracks the lifecycles in flight.
type soakStats struct {
	mu       sync.Mutex
	d        map[string][]time.Duration
	inflight map[int]*soakLife
	slow     []string // killed Execs that returned late
}

func (st *soakStats) add(kind string, d time.Duration) {
	st.mu.Lock()
	st.d[kind] = append(st.d[kind], d)
	st.mu.Unlock()
}

// slowKill records a killed Exec that returned late.
func (st *soakStats) slowKill(num int, took time.Duration) {
	st.mu.Lock()
	st.slow = append(st.slow, fmt.Sprintf("lifecycle %d: %v", num, took.Round(time.Millisecond)))
	st.mu.Unlock()
}

// watchdog reports, with every goroutine's stack, steps that have been
// running for longer than soakStuck. It returns a function that stops it.
func (st *soakStats) watchdog(t *testing.T) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(15 * time.Second)
		defer tick.Stop()
		reported := map[string]bool{}
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			var stuck []string
			st.mu.Lock()
			for num, l := range st.inflight {
				step, since := l.current()
				key := fmt.Sprintf("%d/%s", num, step)
				if time.Since(since) > soakStuck && !reported[key] {
					reported[key] = true
					stuck = append(stuck, fmt.Sprintf("lifecycle %d: step %q running for %v", num, step, time.Since(since).Round(time.Second)))
				}
			}
			st.mu.Unlock()
			if len(stuck) > 0 {
				sort.Strings(stuck)
				t.Logf("soak watchdog: stuck steps:\n%s\ngoroutines:\n%s", strings.Join(stuck, "\n"), soakGoroutines())
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

func (st *soakStats) report(t *testing.T, done int, total time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "soak: %d lifecycles in %v: %.1f lifecycles/min\n", done, total.Round(time.Second), float64(done)/total.Minutes())
	fmt.Fprintf(&b, "%-10s %6s %10s %10s %10s\n", "step", "count", "p50", "p99", "max")
	for _, k := range soakKinds {
		d := slices.Clone(st.d[k])
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		fmt.Fprintf(&b, "%-10s %6d %10v %10v %10v\n", k, len(d),
			soakPct(d, 50).Round(time.Millisecond), soakPct(d, 99).Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "killed Execs returning more than %v after their %v deadline: %d", soakKillSlow, soakKillDeadline, len(st.slow))
	if len(st.slow) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(st.slow[:min(len(st.slow), 20)], ", "))
	}
	t.Log(b.String())
}

// soakPct returns the p-th percentile (nearest rank) of sorted d.
func soakPct(d []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(d)))) - 1
	return d[max(0, min(i, len(d)-1))]
}

// soakLife is one lifecycle in flight.
type soakLife struct {
	st  *soakStats
	num int

	mu    sync.Mutex
	step  string
	since time.Time
}

func (l *soakLife) set(step string) {
	l.mu.Lock()
	l.step, l.since = step, time.Now()
	l.mu.Unlock()
}

func (l *soakLife) current() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.step, l.since
}

// timed runs f as step, of the given kind for the statistics, and wraps its
// error with the lifecycle number and the step.
func (l *soakLife) timed(kind, step string, f func() error) error {
	l.set(step)
	start := time.Now()
	err := f()
	l.st.add(kind, time.Since(start))
	if err != nil {
		return l.errf(step, "%w", err)
	}
	return nil
}

func (l *soakLife) errf(step, format string, args ...any) error {
	return fmt.Errorf("lifecycle %d: %s: %w", l.num, step, fmt.Errorf(format, args...))
}

// exec runs script as an "exec" step and checks its result exactly.
func (l *soakLife) exec(ctx context.Context, sb *sandbox.Sandbox, step, script, stdout, stderr string, code int) error {
	var r *sandbox.Result
	if err := l.timed("exec", step, func() (err error) { r, err = sb.Exec(ctx, script); return err }); err != nil {
		return err
	}
	if r.Stdout != stdout || r.Stderr != stderr || r.ExitCode != code || r.TimedOut || r.Truncated || r.OOMKilled {
		return l.errf(step, "Exec(%q) = stdout %q stderr %q exit %d timedOut %v truncated %v oom %v; want stdout %q stderr %q exit %d",
			script, r.Stdout, r.Stderr, r.ExitCode, r.TimedOut, r.Truncated, r.OOMKilled, stdout, stderr, code)
	}
	return nil
}

// lifecycle runs lifecycle number num.
func (st *soakStats) lifecycle(num int) (err error) {
	l := &soakLife{st: st, num: num}
	l.set("start")
	st.mu.Lock()
	st.inflight[num] = l
	st.mu.Unlock()
	defer func() {
		st.mu.Lock()
		delete(st.inflight, num)
		st.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), soakLifeTimeout)
	defer cancel()
	return l.run(ctx)
}

func (l *soakLife) run(ctx context.Context) error {
	num := l.num
	// Vary the limits a little: disk size or none (a tmpfs workdir), memory,
	// pids, open files, output bound.
	lim := sandbox.Limits{
		Disk:        32 << 20,
		Memory:      int64(128+64*(num%3)) << 20,
		PIDs:        int64(64 + 64*(num%2)),
		OpenFiles:   int64(256 + 256*(num%3)),
		OutputBytes: 64 << 10,
	}
	wantFS := "ext4"
	switch {
	case num%4 == 3:
		lim.Disk, wantFS = -1, "tmpfs"
	case num%5 == 1:
		lim.Disk = 48 << 20
	}

	var sb *sandbox.Sandbox
	if err := l.timed("new", "New", func() (err error) {
		sb, err = sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLimits(lim))
		return err
	}); err != nil {
		return err
	}
	defer func() { sb.Close() }() // on a failed check; nil-safe and idempotent

	// Commands.
	if err := l.exec(ctx, sb, "exec echo", fmt.Sprintf("echo hello-%d", num), fmt.Sprintf("hello-%d\n", num), "", 0); err != nil {
		return err
	}
	var wantOut, wantErr strings.Builder
	for i := range 40 {
		fmt.Fprintf(&wantOut, "out %d %d\n", num, i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	loop := fmt.Sprintf(`i=0; while [ $i -lt 40 ]; do echo "out %d $i"; echo "err $i" >&2; i=$((i+1)); done`, num)
	if err := l.exec(ctx, sb, "exec loop", loop, wantOut.String(), wantErr.String(), 0); err != nil {
		return err
	}
	if err := l.exec(ctx, sb, "exec exit", "echo before; echo failing >&2; exit 7", "before\n", "failing\n", 7); err != nil {
		return err
	}
	if err := l.exec(ctx, sb, "exec workdir", `pwd; awk '$2 == "/workspace" { print $3 }' /proc/mounts`,
		"/workspace\n"+wantFS+"\n", "", 0); err != nil {
		return err
	}

	// Files.
	data := []byte(strings.Repeat(fmt.Sprintf("lifecycle %d data\n", num), 50))
	name := fmt.Sprintf("data/f-%d.txt", num)
	keep := []byte(fmt.Sprintf("keep %d\n", num))
	if err := l.timed("fileop", "MkdirAll", func() error { return sb.MkdirAll(ctx, "data", 0o755) }); err != nil {
		return err
	}
	if err := l.timed("write", "WriteFile", func() error { return sb.WriteFile(ctx, name, data, 0o640) }); err != nil {
		return err
	}
	if err := l.timed("write", "WriteFile keep", func() error { return sb.WriteFile(ctx, "keep.txt", keep, 0o600) }); err != nil {
		return err
	}
	var got []byte
	if err := l.timed("read", "ReadFile", func() (err error) { got, err = sb.ReadFile(ctx, name); return err }); err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return l.errf("ReadFile", "got %d bytes %q..., want %d bytes", len(got), soakHead(got), len(data))
	}
	var fi fs.FileInfo
	if err := l.timed("fileop", "Stat", func() (err error) { fi, err = sb.Stat(ctx, name); return err }); err != nil {
		return err
	}
	if fi.Name() != soakBase(name) || fi.Size() != int64(len(data)) || fi.Mode() != 0o640 || fi.IsDir() {
		return l.errf("Stat", "name %q size %d mode %v dir %v; want %q %d -rw-r-----", fi.Name(), fi.Size(), fi.Mode(), fi.IsDir(), soakBase(name), len(data))
	}
	var ents []fs.DirEntry
	if err := l.timed("fileop", "ReadDir", func() (err error) { ents, err = sb.ReadDir(ctx, "data"); return err }); err != nil {
		return err
	}
	if names := soakNames(ents); !slices.Equal(names, []string{soakBase(name)}) || !ents[0].Type().IsRegular() {
		return l.errf("ReadDir", "entries %v, want [%s] (a regular file)", names, soakBase(name))
	}
	if err := l.timed("fileop", "Remove", func() error { return sb.Remove(ctx, name) }); err != nil {
		return err
	}
	if err := l.timed("fileop", "Stat removed", func() error {
		if _, err := sb.Stat(ctx, name); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("Stat after Remove = %v; want fs.ErrNotExist", err)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := l.timed("fileop", "ReadDir empty", func() (err error) {
		ents, err = sb.ReadDir(ctx, "data")
		if err == nil && len(ents) != 0 {
			err = fmt.Errorf("entries %v after Remove, want none", soakNames(ents))
		}
		return err
	}); err != nil {
		return err
	}

	proj := fstest.MapFS{
		"main.txt":   {Data: []byte(fmt.Sprintf("main of %d\n", num)), Mode: 0o644},
		"sub/b.txt":  {Data: []byte("bee\n"), Mode: 0o600},
		"sub/run.sh": {Data: []byte("#!/bin/sh\necho run\n"), Mode: 0o755},
	}
	if err := l.timed("copyin", "CopyIn", func() error { return sb.CopyIn(ctx, "proj", proj) }); err != nil {
		return err
	}
	if err := l.exec(ctx, sb, "exec after CopyIn", "cat proj/main.txt proj/sub/b.txt; ./proj/sub/run.sh; ls proj/sub",
		fmt.Sprintf("main of %d\nbee\nrun\nb.txt\nrun.sh\n", num), "", 0); err != nil {
		return err
	}
	host, err := os.MkdirTemp("", "copyout-")
	if err != nil {
		return l.errf("CopyOut", "%w", err)
	}
	defer os.RemoveAll(host)
	if err := l.timed("copyout", "CopyOut", func() error { return sb.CopyOut(ctx, "proj", host) }); err != nil {
		return err
	}
	for rel, f := range proj {
		p := filepath.Join(host, "proj", filepath.FromSlash(rel))
		b, err := os.ReadFile(p)
		if err != nil {
			return l.errf("CopyOut", "%w", err)
		}
		info, err := os.Stat(p)
		if err != nil {
			return l.errf("CopyOut", "%w", err)
		}
		if !bytes.Equal(b, f.Data) || info.Mode() != f.Mode {
			return l.errf("CopyOut", "%s: %q mode %v, want %q mode %v", rel, b, info.Mode(), f.Data, f.Mode)
		}
	}

	// Kill: every other lifecycle.
	if num%2 == 0 {
		if err := l.kill(ctx, sb); err != nil {
			return err
		}
	}

	// Snapshot, restore (and fork): every fifth lifecycle.
	if num%5 == 0 {
		if err := l.snapshot(ctx, sb, keep); err != nil {
			return err
		}
	}

	if err := l.timed("close", "Close", sb.Close); err != nil {
		return err
	}
	if err := sb.Close(); err != nil {
		return l.errf("Close again", "%v; want nil", err)
	}
	if _, err := sb.Exec(ctx, "true"); !errors.Is(err, sandbox.ErrClosed) {
		return l.errf("Exec after Close", "%v; want ErrClosed", err)
	}
	return nil
}

// kill runs a command that a context deadline kills and checks that it
// reports TimedOut and leaves no process behind.
func (l *soakLife) kill(ctx context.Context, sb *sandbox.Sandbox) error {
	const script = "sleep 100 & sleep 100; wait"
	var r *sandbox.Result
	start := time.Now()
	if err := l.timed("kill", "kill Exec", func() error {
		kctx, cancel := context.WithTimeout(ctx, soakKillDeadline)
		defer cancel()
		var err error
		r, err = sb.Exec(kctx, script)
		return err
	}); err != nil {
		return err
	}
	took := time.Since(start)
	if !r.TimedOut || r.ExitCode != 137 || r.Stdout != "" || r.Stderr != "" || r.OOMKilled {
		return l.errf("kill Exec", "Exec(%q) with a %v deadline = %+v; want TimedOut, exit 137, no output", script, soakKillDeadline, r)
	}
	if took > soakKillDeadline+soakKillSlow {
		// Slowness is reported, not failed: the machine is shared.
		l.st.slowKill(l.num, took)
	}
	// No sleep 100 may be left. The kernel reaps asynchronously: poll.
	var ps string
	if err := l.timed("reap", "kill ps", func() error {
		rctx, cancel := context.WithTimeout(ctx, soakReapGuard)
		defer cancel()
		var psErr error // ends the wait: waiting will not cure it
		err := sandboxtest.Poll(rctx, 100*time.Millisecond, func() (bool, string) {
			r, err := sb.Exec(ctx, "ps -o pid,ppid,stat,args")
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("ps: exit %d, stderr %q", r.ExitCode, r.Stderr)
			}
			if err != nil {
				psErr = err
				return true, ""
			}
			ps = r.Stdout
			left := 0
			for _, line := range strings.Split(ps, "\n") {
				if f := strings.Fields(line); len(f) >= 5 && f[3] == "sleep" && f[4] == "100" {
					left++
				}
			}
			return left == 0, fmt.Sprintf("%d sleep 100 processes left %v after the kill:\n%s", left, soakReapGuard, ps)
		})
		if psErr != nil {
			return psErr
		}
		return err
	}); err != nil {
		return err
	}
	return l.exec(ctx, sb, "exec after kill", "echo usable", "usable\n", "", 0)
}

// snapshot snapshots sb, restores the snapshot, checks keep.txt came back,
// forks it every 25th lifecycle, and removes it.
func (l *soakLife) snapshot(ctx context.Context, sb *sandbox.Sandbox, keep []byte) error {
	var sn *sandbox.Snapshot
	if err := l.timed("snapshot", "Snapshot", func() (err error) { sn, err = sb.Snapshot(ctx); return err }); err != nil {
		return err
	}
	removed := false
	defer func() {
		if !removed {
			sn.Remove(context.WithoutCancel(ctx))
		}
	}()
	var rs *sandbox.Sandbox
	if err := l.timed("restore", "Snapshot.New", func() (err error) { rs, err = sn.New(ctx); return err }); err != nil {
		return err
	}
	defer func() { rs.Close() }()
	var got []byte
	if err := l.timed("read", "ReadFile restored", func() (err error) { got, err = rs.ReadFile(ctx, "keep.txt"); return err }); err != nil {
		return err
	}
	if !bytes.Equal(got, keep) {
		return l.errf("ReadFile restored", "keep.txt = %q, want %q", got, keep)
	}
	if err := l.exec(ctx, rs, "exec restored", "cat keep.txt proj/main.txt; ls -A data",
		fmt.Sprintf("%smain of %d\n", keep, l.num), "", 0); err != nil {
		return err
	}
	if err := l.timed("close", "Close restored", rs.Close); err != nil {
		return err
	}

	if l.num%25 == 0 {
		var forks []*sandbox.Sandbox
		if err := l.timed("fork", "Fork(2)", func() (err error) { forks, err = sn.Fork(ctx, 2); return err }); err != nil {
			return err
		}
		defer func() {
			for _, f := range forks {
				f.Close()
			}
		}()
		if len(forks) != 2 {
			return l.errf("Fork(2)", "%d sandboxes", len(forks))
		}
		for i, f := range forks {
			if err := l.exec(ctx, f, fmt.Sprintf("exec fork %d", i), fmt.Sprintf("cat keep.txt; echo %d > mine", i),
				string(keep), "", 0); err != nil {
				return err
			}
		}
		// Forks are isolated: each sees its own file only.
		for i, f := range forks {
			if err := l.exec(ctx, f, fmt.Sprintf("exec fork %d isolated", i), "cat mine", fmt.Sprintf("%d\n", i), "", 0); err != nil {
				return err
			}
		}
		for i, f := range forks {
			if err := l.timed("close", fmt.Sprintf("Close fork %d", i), f.Close); err != nil {
				return err
			}
		}
	}

	removed = true
	return l.timed("snapremove", "Snapshot.Remove", func() error { return sn.Remove(ctx) })
}

// soakState is what the leak check compares.
type soakState struct {
	goroutines int
	fds        int
	objects    testenv.Objects
	ourLoops   []testenv.Loop // backed by a file under this test's TMPDIR
	allLoops   []testenv.Loop // every loop device attached on the host
}

func (s soakState) String() string {
	return fmt.Sprintf("goroutines %d, fds %d, engine objects: %v, loop devices: %d of ours, %d on the host",
		s.goroutines, s.fds, s.objects, len(s.ourLoops), len(s.allLoops))
}

func soakMeasure(ctx context.Context, tmp string) (soakState, error) {
	var s soakState
	s.goroutines = runtime.NumGoroutine()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return s, err
	}
	s.fds = len(fds)
	if s.objects, err = testenv.OwnedObjects(ctx); err != nil {
		return s, err
	}
	if s.allLoops, err = testenv.LoopDevices(); err != nil {
		return s, err
	}
	for _, l := range s.allLoops {
		if strings.HasPrefix(l.BackingFile, tmp+"/") {
			s.ourLoops = append(s.ourLoops, l)
		}
	}
	return s, nil
}

// soakSettle polls for up to soakLeakWait until the counters are back to
// base, and returns the last measurement and whether they were.
func soakSettle(base soakState, tmp string) (soakState, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), soakLeakWait)
	defer cancel()
	var now soakState
	var measureErr error // ends the wait: waiting will not cure it
	err := sandboxtest.Poll(ctx, 250*time.Millisecond, func() (bool, string) {
		now, measureErr = soakMeasure(context.Background(), tmp)
		return measureErr != nil ||
			now.goroutines <= base.goroutines+soakGoroutineSlack &&
				now.fds <= base.fds &&
				now.objects == base.objects &&
				len(now.ourLoops) <= len(base.ourLoops), ""
	})
	if measureErr != nil {
		return now, false, measureErr
	}
	return now, err == nil, nil
}

// soakLeakReport describes what is above the baseline, with the evidence.
func soakLeakReport(base, now soakState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "after %v: %v; baseline %v", soakLeakWait, now, base)
	if now.fds > base.fds {
		b.WriteString("\nopen file descriptors:")
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			target, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
			fmt.Fprintf(&b, "\n  %s -> %s", fd.Name(), target)
		}
	}
	if len(now.ourLoops) > len(base.ourLoops) {
		b.WriteString("\nloop devices of this process:")
		for _, l := range now.ourLoops {
			fmt.Fprintf(&b, "\n  %s: %s", l.Name, l.BackingFile)
		}
	}
	if now.goroutines > base.goroutines+soakGoroutineSlack {
		b.WriteString("\ngoroutines:\n")
		b.WriteString(soakGoroutines())
	}
	return b.String()
}

// soakGoroutines returns the goroutine profile (debug=1: stacks grouped).
func soakGoroutines() string {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String()
}

func soakNames(ents []fs.DirEntry) []string {
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names
}

func soakHead(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

// soakBase returns the last element of a slash-separated name.
func soakBase(name string) string { return name[strings.LastIndexByte(name, '/')+1:] }
