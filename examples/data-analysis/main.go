// Command data-analysis sends a CSV of sales into a sandbox, analyses it
// step by step in a persistent Python interpreter there (pandas and
// matplotlib, the data loaded once), and leaves the chart (the figure the
// last step drew, a PNG) and a JSON summary in a host directory.
//
//	go run ./data-analysis [-image REF] [-csv FILE] [-out DIR]
//
// The image comes from -image, else SANDBOX_IMAGE, else the project's own
// Debian + Python image, which is built offline first if it is missing. It
// needs python3 with pandas and matplotlib.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
)

// cells are the analysis, run one after the other in one Python
// interpreter in the sandbox, as a notebook runs its cells: the first
// loads data/sales.csv once, the next ones use the DataFrame it left
// behind. The second writes out/summary.json (money rounded to cents); the
// third draws the chart, which comes back as a PNG output without the code
// saving it anywhere.
var cells = []string{`import json
import pandas as pd

df = pd.read_csv("data/sales.csv", parse_dates=["date"])
df["revenue"] = df["units"] * df["price"]
df["month"] = df["date"].dt.strftime("%Y-%m")
print(f"read {len(df)} rows, {df['date'].min():%Y-%m-%d} to {df['date'].max():%Y-%m-%d}")`,

	`cents = lambda s: {str(k): round(float(v), 2) for k, v in s.items()}
by_region = df.groupby("region")["revenue"].sum()
by_product = df.groupby("product")["revenue"].sum()
by_month = df.groupby("month")["revenue"].sum()
summary = {
    "rows": int(len(df)),
    "first_date": f"{df['date'].min():%Y-%m-%d}",
    "last_date": f"{df['date'].max():%Y-%m-%d}",
    "units": int(df["units"].sum()),
    "revenue": round(float(df["revenue"].sum()), 2),
    "revenue_by_region": cents(by_region),
    "revenue_by_product": cents(by_product),
    "units_by_product": {str(k): int(v) for k, v in df.groupby("product")["units"].sum().items()},
    "revenue_by_month": cents(by_month),
    "top_region": str(by_region.idxmax()),
    "best_month": str(by_month.idxmax()),
}
with open("out/summary.json", "w") as f:
    json.dump(summary, f, indent=2, sort_keys=True)
print("wrote out/summary.json")`,

	`import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), dpi=100)
by_region.sort_values(ascending=False).plot.bar(ax=left, color="tab:blue", rot=0)
left.set_title("Revenue by region")
left.set_xlabel("")
left.set_ylabel("revenue")
monthly = df.pivot_table(index="month", columns="region", values="revenue", aggfunc="sum", fill_value=0)
monthly.plot(ax=right, marker="o")
right.set_title("Monthly revenue by region")
right.set_xlabel("month")
fig.tight_layout()`,
}

// Summary is what the analysis script writes to summary.json.
type Summary struct {
	Rows             int                `json:"rows"`
	FirstDate        string             `json:"first_date"`
	LastDate         string             `json:"last_date"`
	Units            int64              `json:"units"`
	Revenue          float64            `json:"revenue"`
	RevenueByRegion  map[string]float64 `json:"revenue_by_region"`
	RevenueByProduct map[string]float64 `json:"revenue_by_product"`
	UnitsByProduct   map[string]int64   `json:"units_by_product"`
	RevenueByMonth   map[string]float64 `json:"revenue_by_month"`
	TopRegion        string             `json:"top_region"`
	BestMonth        string             `json:"best_month"`
}

func main() {
	image := flag.String("image", "", "image to run (default: $SANDBOX_IMAGE or the project's Python image)")
	csvPath := flag.String("csv", filepath.Join("..", "testdata", "sales.csv"), "CSV file to analyse (columns date, region, product, units, price)")
	out := flag.String("out", "analysis-out", "host directory to copy the chart and summary into")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	sum, err := analyze(ctx, *image, *csvPath, *out, os.Stderr)
	stop()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("chart:   %s\nsummary: %s\n\n", filepath.Join(*out, "chart.png"), filepath.Join(*out, "summary.json"))
	printSummary(os.Stdout, sum)
}

// analyze runs the analysis of the CSV file csvPath in a sandbox of image
// (or of the default image when it is empty), leaves chart.png and
// summary.json in outDir, and returns the summary. The script's output and
// progress notes go to progress.
func analyze(ctx context.Context, image, csvPath, outDir string, progress io.Writer) (*Summary, error) {
	data, err := os.ReadFile(csvPath)
	if err != nil {
		return nil, err
	}
	ref := image
	if ref == "" {
		if ref, err = images.FromEnv(ctx, progress); err != nil {
			return nil, err
		}
	}

	sb, err := sandbox.New(ctx, sandbox.WithImage(ref),
		sandbox.WithLimits(sandbox.Limits{Memory: 512 << 20, ExecTimeout: 2 * time.Minute}))
	if err != nil {
		return nil, err
	}
	defer sb.Close()
	fmt.Fprintf(progress, "sandbox %.12s is up (image %s)\n", sb.ID(), ref)

	for _, dir := range []string{"data", "out"} {
		if err := sb.MkdirAll(ctx, dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := sb.WriteFile(ctx, "data/sales.csv", data, 0o644); err != nil {
		return nil, err
	}
	py, err := sb.Interpreter(ctx, "python")
	if err != nil {
		return nil, err
	}
	defer py.Close()
	py.Stdout, py.Stderr = progress, progress
	var chart []byte
	for i, code := range cells {
		ex, err := py.Run(ctx, code)
		if err != nil {
			return nil, err
		}
		if ex.Error != nil {
			return nil, fmt.Errorf("analysis step %d failed: %s", i+1, ex.Error.Traceback)
		}
		for _, o := range ex.Outputs {
			if o.MIME == "image/png" {
				chart = o.Data
			}
		}
	}
	if chart == nil {
		return nil, errors.New("the chart step showed no figure")
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(outDir, "chart.png"), chart, 0o644); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "wrote %s from the figure\n", filepath.Join(outDir, "chart.png"))
	if err := sb.CopyOut(ctx, "out/summary.json", outDir); err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(outDir, "summary.json"))
	if err != nil {
		return nil, err
	}
	var sum Summary
	if err := json.Unmarshal(raw, &sum); err != nil {
		return nil, fmt.Errorf("summary.json: %w", err)
	}
	return &sum, nil
}

// printSummary writes sum as a few small tables.
func printSummary(w io.Writer, sum *Summary) {
	fmt.Fprintf(w, "%d sales from %s to %s: %d units, revenue %.2f\n",
		sum.Rows, sum.FirstDate, sum.LastDate, sum.Units, sum.Revenue)
	fmt.Fprintf(w, "\n%-10s %12s\n", "region", "revenue")
	for _, k := range sortedKeys(sum.RevenueByRegion) {
		fmt.Fprintf(w, "%-10s %12.2f\n", k, sum.RevenueByRegion[k])
	}
	fmt.Fprintf(w, "\n%-10s %6s %12s\n", "product", "units", "revenue")
	for _, k := range sortedKeys(sum.RevenueByProduct) {
		fmt.Fprintf(w, "%-10s %6d %12.2f\n", k, sum.UnitsByProduct[k], sum.RevenueByProduct[k])
	}
	fmt.Fprintf(w, "\n%-10s %12s\n", "month", "revenue")
	for _, k := range sortedKeys(sum.RevenueByMonth) {
		fmt.Fprintf(w, "%-10s %12.2f\n", k, sum.RevenueByMonth[k])
	}
	fmt.Fprintf(w, "\ntop region: %s; best month: %s\n", sum.TopRegion, sum.BestMonth)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
