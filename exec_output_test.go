package sandbox_test

// Output of commands against the real engine: bounded by OutputBytes
// with the host's memory flat, streamed at speed, truncated exactly.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// execRecorder is a slog.Handler keeping the attributes of sandbox.exec
// records, to read how many bytes a command wrote.
type execRecorder struct {
	mu   sync.Mutex
	recs []map[string]slog.Value
}

func (h *execRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *execRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *execRecorder) WithGroup(string) slog.Handler            { return h }
func (h *execRecorder) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "sandbox.exec" {
		return nil
	}
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	h.mu.Lock()
	h.recs = append(h.recs, m)
	h.mu.Unlock()
	return nil
}

func (h *execRecorder) last() map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recs) == 0 {
		return nil
	}
	return h.recs[len(h.recs)-1]
}

// vmRSS returns this process's resident set size in bytes.
func vmRSS(t testing.TB) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// peaks samples this process's heap and RSS every interval until stop is
// called, which returns the largest of each seen (at least the first).
func peaks(t testing.TB, every time.Duration) (stop func() (heap, rss uint64)) {
	var peakHeap, peakRSS atomic.Uint64
	sample := func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peakHeap.Store(max(peakHeap.Load(), m.HeapAlloc))
		peakRSS.Store(max(peakRSS.Load(), vmRSS(t)))
	}
	sample()
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		<-sampled
		return peakHeap.Load(), peakRSS.Load()
	}
}

// TestExecOutputBounded runs `yes` until a deadline kills it and checks that
// Exec keeps exactly OutputBytes while the host's memory stays flat. It is not
// parallel so that no other test's allocations blur the measurement.
//
// However slowly the engine starts the command, far more than the limit
// passes through before the kill: the command marks the point where it has
// written `enough` bytes, and only then does the test let the deadline pass.
func TestExecOutputBounded(t *testing.T) {
	const limit = 64 << 10
	const enough = 128 << 20
	rec := &execRecorder{}
	sb := newSandbox(t,
		sandbox.WithLimits(sandbox.Limits{OutputBytes: limit, ExecTimeout: -1}),
		sandbox.WithLogger(slog.New(rec)))

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0, sys0, rss0 := ms.HeapAlloc, ms.Sys, vmRSS(t)
	stopPeaks := peaks(t, 100*time.Millisecond)

	ctx, expire := testenv.ManualDeadline(testCtx(t))
	defer expire()
	type ret struct {
		r   *sandbox.Result
		err error
	}
	done := make(chan ret, 1)
	start := time.Now()
	go func() {
		// head writes `enough` bytes of yes to stdout, then the mark, then
		// cat passes the rest of yes on until the kill.
		r, err := sb.Exec(ctx, fmt.Sprintf("yes | { head -c %d; touch /tmp/enough; exec cat; }", enough))
		done <- ret{r, err}
	}()
	execWaitFile(t, sb, "/tmp/enough")
	expire()
	var got ret
	select {
	case got = <-done:
	case <-time.After(testenv.HangGuard):
		t.Fatalf("hang: Exec did not return within %v of its deadline", testenv.HangGuard)
	}
	took := time.Since(start)
	peakHeap, peakRSS := stopPeaks()
	r, err := got.r, got.err
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	runtime.ReadMemStats(&ms)
	if !r.Truncated || !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("Result: Truncated %v TimedOut %v exit %d; want true true 137", r.Truncated, r.TimedOut, r.ExitCode)
	}
	if len(r.Stdout) != limit || r.Stdout != strings.Repeat("y\n", limit/2) {
		t.Fatalf("len(Stdout) = %d; want exactly %d bytes of y lines", len(r.Stdout), limit)
	}
	if r.Stderr != "" {
		t.Fatalf("Stderr = %q", r.Stderr)
	}
	produced := int64(-1)
	if m := rec.last(); m != nil {
		produced = m["stdout_bytes"].Int64()
	}
	const mib = 1 << 20
	heapGrowth := int64(max(peakHeap, heap0)) - int64(heap0)
	rssGrowth := int64(max(peakRSS, rss0)) - int64(rss0)
	t.Logf("yes for %v: %d MiB produced (%.0f MiB/s), kept %d bytes; host heap peak +%.1f MiB, RSS peak +%.1f MiB, Sys %d -> %d MiB",
		took.Round(time.Millisecond), produced/mib, float64(produced)/mib/took.Seconds(), len(r.Stdout),
		float64(heapGrowth)/mib, float64(rssGrowth)/mib, sys0/mib, ms.Sys/mib)
	// head's writes block until the host reads, so by the mark the host had
	// read all of `enough` but what the pipes and sockets on the way hold
	// (far less than half).
	if produced < enough/2 {
		t.Fatalf("the audit log counts %d bytes of stdout; the command wrote %d before the kill", produced, enough)
	}
	if heapGrowth > 64*mib || rssGrowth > 64*mib {
		t.Fatalf("host memory grew while %d MiB passed through: heap +%d MiB, RSS +%d MiB", produced/mib, heapGrowth/mib, rssGrowth/mib)
	}
	execUsable(t, sb)
}

// execCountWriter counts the bytes written to it.
type execCountWriter struct{ n atomic.Int64 }

func (w *execCountWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// TestExecStreamThroughput streams `yes` into a counting writer for a few
// seconds from its first byte, and reports the throughput (a figure, not a
// claim: the machine may be busy). Not parallel, for a clean figure.
func TestExecStreamThroughput(t *testing.T) {
	const measure = 3 * time.Second
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{ExecTimeout: -1}))
	// The deadline passes `measure` after the first byte, however long the
	// engine took to start the command.
	ctx, expire := testenv.ManualDeadline(testCtx(t))
	defer expire()
	var w execCountWriter
	c := sb.Command(ctx, "yes")
	c.Stdout = &w
	start := time.Now()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pctx, cancelPoll := context.WithTimeout(ctx, testenv.HangGuard)
	err := sandboxtest.Poll(pctx, time.Millisecond, func() (bool, string) { return w.n.Load() > 0, "no output from yes" })
	cancelPoll()
	if err != nil {
		expire()
		c.Wait()
		t.Fatalf("hang: %v", err)
	}
	first := time.Now()
	n0 := w.n.Load()
	time.AfterFunc(measure, expire)
	err = c.Wait()
	took := time.Since(first)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v; want DeadlineExceeded", err)
	}
	n := w.n.Load()
	if n <= n0 {
		t.Fatalf("streamed %d bytes in all, nothing after the first %d", n, n0)
	}
	t.Logf("first byte %v after Start; then streamed %d MiB in %v: %.0f MiB/s",
		first.Sub(start).Round(time.Millisecond), n>>20, took.Round(time.Millisecond), float64(n)/(1<<20)/took.Seconds())
}

func TestExecOutputTruncated(t *testing.T) {
	t.Parallel()
	const limit = 1000
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{OutputBytes: limit}))
	ctx := testCtx(t)
	want := strings.Repeat("y\n", limit/2)

	out, err := sb.Command(ctx, "sh", "-c", "yes | head -c 5000").Output()
	if !errors.Is(err, sandbox.ErrOutputTruncated) || string(out) != want {
		t.Fatalf("Output = %d bytes, %v; want exactly %d bytes and ErrOutputTruncated", len(out), err, limit)
	}
	var ee *sandbox.ExitError
	if errors.As(err, &ee) {
		t.Fatalf("successful command reported as %v", ee)
	}
	out, err = sb.Command(ctx, "sh", "-c", "yes | head -c 600; yes | head -c 600 >&2").CombinedOutput()
	if !errors.Is(err, sandbox.ErrOutputTruncated) || len(out) != limit {
		t.Fatalf("CombinedOutput = %d bytes, %v", len(out), err)
	}
	// Exactly the limit is not truncation.
	out, err = sb.Command(ctx, "sh", "-c", fmt.Sprintf("yes | head -c %d", limit)).Output()
	if err != nil || string(out) != want {
		t.Fatalf("Output of exactly %d bytes = %d bytes, %v", limit, len(out), err)
	}
	// Stderr kept by Output in the ExitError is bounded too.
	out, err = sb.Command(ctx, "sh", "-c", "echo x; yes | head -c 5000 >&2; exit 1").Output()
	if !errors.As(err, &ee) || ee.Code != 1 || string(ee.Stderr) != want || string(out) != "x\n" {
		t.Fatalf("Output = %q, %v (stderr %d bytes)", out, err, len(ee.Stderr))
	}
	// Exec: each stream bounded, Truncated set.
	r := mustExec(t, sb, "yes | head -c 5000; yes n | head -c 3000 >&2")
	if !r.Truncated || r.Stdout != want || r.Stderr != strings.Repeat("n\n", limit/2) || r.ExitCode != 0 {
		t.Fatalf("Exec: Truncated %v, %d/%d bytes, exit %d", r.Truncated, len(r.Stdout), len(r.Stderr), r.ExitCode)
	}
	r = mustExec(t, sb, "yes | head -c 1000; yes | head -c 1000 >&2")
	if r.Truncated || len(r.Stdout) != limit || len(r.Stderr) != limit {
		t.Fatalf("Exec at the limit: Truncated %v, %d/%d bytes", r.Truncated, len(r.Stdout), len(r.Stderr))
	}
	// A streamed writer sees everything.
	var w execCountWriter
	c := sb.Command(ctx, "sh", "-c", "yes | head -c 5000")
	c.Stdout = &w
	if err := c.Run(); err != nil || w.n.Load() != 5000 {
		t.Fatalf("streamed %d bytes, %v; want 5000", w.n.Load(), err)
	}
}
