package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// pythonImage is SANDBOX_IMAGE or the project's Debian + python3 image.
var pythonImage string

const salesCSV = "../../testdata/sales.csv"

func TestMain(m *testing.M) {
	os.Setenv("AGENTSANDBOX_PULL", "never") // tests never reach a registry
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	// On an engine that puts no resource limits in force (rootless Podman
	// on cgroup v1) New refuses the example's sandboxes, which have the
	// default limits: its tests do not apply there.
	if caps, err := sandbox.DefaultDriver.Caps(ctx); err == nil && caps.NoResourceLimits {
		cancel()
		fmt.Fprintf(os.Stderr, "not applicable on %v: it puts no resource limits in force (driver.Caps.NoResourceLimits), and the example's sandboxes have the default limits\n", caps.Engine)
		os.Exit(0)
	}
	var err error
	pythonImage, err = images.FromEnv(ctx, os.Stderr)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test image:", err)
		os.Exit(1)
	}
	os.Exit(sandboxtest.Main(m))
}

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a
// command's two output streams.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// expected is the summary worked out in Go from the CSV, money in cents.
type expected struct {
	rows               int
	first, last        string
	units              int64
	revenue            int64
	byRegion, byProd   map[string]int64
	unitsByProd        map[string]int64
	byMonth            map[string]int64
	topRegion, topMnth string
}

// cents parses a price such as "12.80" exactly.
func cents(t *testing.T, s string) int64 {
	t.Helper()
	whole, frac, _ := strings.Cut(s, ".")
	if len(frac) != 2 {
		t.Fatalf("price %q does not have two decimals", s)
	}
	w, err1 := strconv.ParseInt(whole, 10, 64)
	f, err2 := strconv.ParseInt(frac, 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("bad price %q", s)
	}
	return w*100 + f
}

func compute(t *testing.T, path string) expected {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(recs[0], ","); got != "date,region,product,units,price" {
		t.Fatalf("header %q", got)
	}
	e := expected{
		byRegion: map[string]int64{}, byProd: map[string]int64{},
		unitsByProd: map[string]int64{}, byMonth: map[string]int64{},
	}
	for _, r := range recs[1:] {
		date, region, product := r[0], r[1], r[2]
		units, err := strconv.ParseInt(r[3], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		rev := units * cents(t, r[4])
		e.rows++
		if e.first == "" || date < e.first {
			e.first = date
		}
		if date > e.last {
			e.last = date
		}
		e.units += units
		e.revenue += rev
		e.byRegion[region] += rev
		e.byProd[product] += rev
		e.unitsByProd[product] += units
		e.byMonth[date[:7]] += rev
	}
	e.topRegion, e.topMnth = argmax(e.byRegion), argmax(e.byMonth)
	return e
}

func argmax(m map[string]int64) string {
	best := ""
	for k, v := range m {
		if best == "" || v > m[best] || (v == m[best] && k < best) {
			best = k
		}
	}
	return best
}

// inCents converts a summary's money map, rounded to cents, to cents.
func inCents(m map[string]float64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = int64(math.Round(v * 100))
	}
	return out
}

func equalMaps(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s[%s] = %d (present %v), want %d", what, k, g, ok, w)
		}
	}
}

func TestAnalyze(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	want := compute(t, salesCSV)
	if want.rows != 200 {
		t.Fatalf("testdata/sales.csv has %d rows, want 200", want.rows)
	}

	out := filepath.Join(t.TempDir(), "analysis-out") // does not exist yet
	var progress lockedBuffer
	start := time.Now()
	sum, err := analyze(ctx, pythonImage, salesCSV, out, &progress)
	t.Logf("analyze took %v; its output:\n%s", time.Since(start), progress.String())
	if err != nil {
		t.Fatalf("analyze: %v", err)
	}

	// The script's output came through as it printed it.
	for _, line := range []string{
		fmt.Sprintf("read %d rows, %s to %s\n", want.rows, want.first, want.last),
		"wrote out/summary.json\n",
		"chart.png from the figure\n",
	} {
		if !strings.Contains(progress.String(), line) {
			t.Errorf("progress lacks %q", line)
		}
	}

	// Exactly the two files came out, and nothing else.
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "chart.png summary.json" {
		t.Errorf("files in -out: %q, want \"chart.png summary.json\"", got)
	}

	// The chart is a PNG of the figure's size (12x5 inches at 100 dpi).
	f, err := os.Open(filepath.Join(out, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(f)
	f.Close()
	if err != nil {
		t.Fatalf("chart.png: %v", err)
	}
	if cfg.Width != 1200 || cfg.Height != 500 {
		t.Errorf("chart.png is %dx%d, want 1200x500", cfg.Width, cfg.Height)
	}
	if f, err = os.Open(filepath.Join(out, "chart.png")); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("decoding chart.png: %v", err)
	}
	// A drawn chart has many colours, not a blank canvas.
	colours := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 5 {
		for x := b.Min.X; x < b.Max.X; x += 5 {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
		}
	}
	if len(colours) < 10 {
		t.Errorf("chart.png has only %d distinct colours: blank?", len(colours))
	}

	// The summary on disk is the one returned, and its numbers are those
	// computed here from the same CSV.
	raw, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var onDisk Summary
	if err := json.Unmarshal(raw, &onDisk); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(onDisk)
	c, _ := json.Marshal(sum)
	if !bytes.Equal(a, c) {
		t.Errorf("returned summary %s differs from summary.json %s", c, a)
	}
	if sum.Rows != want.rows || sum.FirstDate != want.first || sum.LastDate != want.last || sum.Units != want.units {
		t.Errorf("rows, dates, units = %d %s %s %d, want %d %s %s %d",
			sum.Rows, sum.FirstDate, sum.LastDate, sum.Units, want.rows, want.first, want.last, want.units)
	}
	if got := int64(math.Round(sum.Revenue * 100)); got != want.revenue {
		t.Errorf("revenue = %d cents, want %d", got, want.revenue)
	}
	equalMaps(t, "revenue_by_region", inCents(sum.RevenueByRegion), want.byRegion)
	equalMaps(t, "revenue_by_product", inCents(sum.RevenueByProduct), want.byProd)
	equalMaps(t, "units_by_product", sum.UnitsByProduct, want.unitsByProd)
	equalMaps(t, "revenue_by_month", inCents(sum.RevenueByMonth), want.byMonth)
	if sum.TopRegion != want.topRegion || sum.BestMonth != want.topMnth {
		t.Errorf("top region, best month = %s, %s; want %s, %s", sum.TopRegion, sum.BestMonth, want.topRegion, want.topMnth)
	}

	// What main prints starts with the totals line.
	var printed bytes.Buffer
	printSummary(&printed, sum)
	first := fmt.Sprintf("%d sales from %s to %s: %d units, revenue %d.%02d\n",
		want.rows, want.first, want.last, want.units, want.revenue/100, want.revenue%100)
	if !strings.HasPrefix(printed.String(), first) {
		t.Errorf("printed summary starts %q, want %q", printed.String(), first)
	}

	// The sandbox was closed: nothing of this process is left on the engine.
	if err := sandboxtest.Left(0); err != nil {
		t.Errorf("after analyze: %v", err)
	}
}

func TestAnalyzeMissingCSV(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "out")
	_, err := analyze(context.Background(), pythonImage, "no-such.csv", out, &lockedBuffer{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("analyze with a missing CSV: %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("-out was made for a failed run: %v", err)
	}
}
