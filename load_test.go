package sandbox_test

import (
	"context"
	"flag"
	"fmt"

	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox"
)

// loadN is the number of sandboxes TestLoad runs at once; 0 skips it.
var loadN = flag.Int("load", 0, "run TestLoad with this many sandboxes alive at once, each running 20 Execs concurrently (0: skip it); e.g. go test -v -run TestLoad -load=100 .")

// TestLoad starts *loadN sandboxes, keeps them all alive, and has each run
// 20 Exec("echo hi") at once, all sandboxes at the same time. It reports
// failures, p50/p99 per Exec, and the host memory an idle sandbox costs:
// this process's heap, and the engine side (dockerd, containerd and the
// container shims, by resident set size).
func TestLoad(t *testing.T) {
	if *loadN == 0 {
		t.Skip("opt-in: -load=N")
	}
	n := *loadN
	ctx := testCtx(t)
	engineBefore := engineRSS()
	var msBefore runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&msBefore)

	sbs := make([]*sandbox.Sandbox, n)
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(8)
	for i := range sbs {
		g.Go(func() error {
			sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
			sbs[i] = sb
			return err
		})
	}
	err := g.Wait()
	defer func() {
		var cg errgroup.Group
		cg.SetLimit(8)
		for _, sb := range sbs {
			cg.Go(sb.Close)
		}
		cg.Wait()
	}()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Logf("%d sandboxes started in %v", n, time.Since(start).Round(time.Millisecond))
	runtime.GC()
	var msIdle runtime.MemStats
	runtime.ReadMemStats(&msIdle)
	engineIdle := engineRSS()
	t.Logf("memory per idle sandbox: library heap %.1f KiB; engine side (dockerd, containerd, shims) %.1f MiB",
		float64(int64(msIdle.HeapInuse)-int64(msBefore.HeapInuse))/float64(n)/1024,
		float64(engineIdle-engineBefore)/float64(n)/(1<<20))

	// All at once: 2000 commands queue for the machine's CPUs, so each
	// one's latency is mostly its wait in that queue.
	loadRound(t, ctx, sbs, 20, 0)
	// The same commands with at most as many in flight as the machine has
	// CPUs: the latency of one Exec while 100 sandboxes are alive.
	loadRound(t, ctx, sbs, 20, runtime.NumCPU())
}

// loadRound runs per Execs of "echo hi" in every sandbox, all at once or
// with at most inflight running (0: no bound), and reports failures and
// latencies.
func loadRound(t *testing.T, ctx context.Context, sbs []*sandbox.Sandbox, per, inflight int) {
	var mu sync.Mutex
	var took []time.Duration
	failures := 0
	var wg sync.WaitGroup
	var sem chan struct{}
	if inflight > 0 {
		sem = make(chan struct{}, inflight)
	}
	start := time.Now()
	for _, sb := range sbs {
		for range per {
			wg.Go(func() {
				if sem != nil {
					sem <- struct{}{}
					defer func() { <-sem }()
				}
				t0 := time.Now()
				r, err := sb.Exec(ctx, "echo hi")
				d := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				took = append(took, d)
				if err != nil || r.ExitCode != 0 || r.Stdout != "hi\n" {
					failures++
					if failures <= 5 {
						t.Errorf("Exec: %+v, %v", r, err)
					}
				}
			})
		}
	}
	wg.Wait()
	wall := time.Since(start)
	slices.Sort(took)
	pct := func(p float64) time.Duration { return took[min(len(took)-1, int(p*float64(len(took))))] }
	how := fmt.Sprintf("%d sandboxes x %d at once", len(sbs), per)
	if inflight > 0 {
		how = fmt.Sprintf("%d sandboxes x %d, at most %d in flight", len(sbs), per, inflight)
	}
	t.Logf("%d Execs (%s): %d failures, wall %v (%.0f Exec/s), p50 %v, p99 %v, max %v",
		len(took), how, failures, wall.Round(time.Millisecond), float64(len(took))/wall.Seconds(),
		pct(0.50).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), took[len(took)-1].Round(100*time.Microsecond))
}

// engineRSS sums the resident set size of dockerd, containerd and the
// containerd shims on this host, in bytes.
func engineRSS() int64 {
	var total int64
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil {
			continue
		}
		switch c := strings.TrimSpace(string(comm)); {
		case c == "dockerd", c == "containerd", strings.HasPrefix(c, "containerd-shim"):
		default:
			continue
		}
		status, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}
