// Command quickstart writes a Python script into a sandbox, runs it with
// its output streamed to the terminal, and copies back the file it made.
//
//	go run ./quickstart [-image REF] [-out DIR]
//
// (from the examples directory, a module of its own).
// The image comes from -image, else SANDBOX_IMAGE, else the project's own
// Debian + Python image, which is built offline first if it is missing.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
)

const script = `import csv, math, sys, time

print("computing squares and roots...")
with open("results/table.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["n", "square", "sqrt"])
    for n in range(1, 11):
        w.writerow([n, n * n, round(math.sqrt(n), 4)])
        print(f"  row {n}")
        time.sleep(0.1)  # output arrives as it is printed
print("python", sys.version.split()[0], "wrote results/table.csv")
`

func main() {
	image := flag.String("image", "", "image to run (default: $SANDBOX_IMAGE or the project's Python image)")
	out := flag.String("out", "quickstart-out", "host directory to copy results into")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, *image, *out)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// run does the work, so that deferred cleanup runs before the program exits.
func run(ctx context.Context, image, out string) error {

	ref := image
	if ref == "" {
		var err error
		if ref, err = images.FromEnv(ctx, os.Stderr); err != nil {
			return err
		}
	}

	sb, err := sandbox.New(ctx, sandbox.WithImage(ref),
		sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20, ExecTimeout: time.Minute}))
	if err != nil {
		return err
	}
	defer sb.Close()
	fmt.Fprintf(os.Stderr, "sandbox %.12s is up (image %s)\n", sb.ID(), ref)

	if err := sb.MkdirAll(ctx, "results", 0o755); err != nil {
		return err
	}
	if err := sb.WriteFile(ctx, "main.py", []byte(script), 0o644); err != nil {
		return err
	}

	cmd := sb.Command(ctx, "python3", "main.py")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("script failed: %w", err)
	}

	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := sb.CopyOut(ctx, "results", out); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(out, "results", "table.csv"))
	if err != nil {
		return err
	}
	fmt.Printf("\ncopied %s (%d bytes):\n%s", filepath.Join(out, "results", "table.csv"), len(data), data)
	return nil
}
