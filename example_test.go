package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox"
)

// exampleImage is the image the examples run: any image with /bin/sh works, such as
// "python:3.12-slim" on a machine with a registry. The tests use a locally
// built busybox image.
func exampleImage() string { return busyboxImage }

func ExampleNew() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx,
		sandbox.WithImage(exampleImage()),
		sandbox.WithLimits(sandbox.Limits{Memory: 128 << 20, ExecTimeout: 10 * time.Second}),
		sandbox.WithEnv("GREETING=hello"),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	res, err := sb.Exec(ctx, `echo "$GREETING from $PWD"`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	// Output: hello from /workspace
}

func ExampleSandbox_Exec() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(exampleImage()),
		sandbox.WithLimits(sandbox.Limits{ExecTimeout: time.Minute}))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	// A failing command is data for the model, not an error.
	res, _ := sb.Exec(ctx, "echo partial; cat missing.txt")
	fmt.Printf("exit %d, stdout %q, stderr %q\n", res.ExitCode, res.Stdout, res.Stderr)

	// A command that never ends is killed, with everything it started, at
	// Limits.ExecTimeout or at its context's deadline, whichever is first.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, _ = sb.Exec(short, "sleep 1000 & sleep 1000; wait")
	fmt.Printf("exit %d, timed out %v\n", res.ExitCode, res.TimedOut)
	// Output:
	// exit 1, stdout "partial\n", stderr "cat: can't open 'missing.txt': No such file or directory\n"
	// exit 137, timed out true
}

func ExampleSandbox_Command() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(exampleImage()))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	cmd := sb.Command(ctx, "sh", "-c", "for i in 1 2 3; do echo line $i; done; echo oops >&2; exit 2")
	cmd.Stdout = os.Stdout // streamed as the command prints
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exitErr *sandbox.ExitError
	if errors.As(err, &exitErr) {
		fmt.Printf("exit status %d, stderr %q\n", exitErr.Code, stderr.String())
	}
	// Output:
	// line 1
	// line 2
	// line 3
	// exit status 2, stderr "oops\n"
}

func ExampleSandbox_WriteFile() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(exampleImage()))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	if err := sb.WriteFile(ctx, "data/in.txt", []byte("b\na\nc\n"), 0o644); err != nil {
		fmt.Println("no directory yet:", errors.Is(err, fs.ErrNotExist))
	}
	if err := sb.MkdirAll(ctx, "data", 0o755); err != nil {
		log.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "data/in.txt", []byte("b\na\nc\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	if _, err := sb.Exec(ctx, "sort data/in.txt > data/out.txt"); err != nil {
		log.Fatal(err)
	}
	out, err := sb.ReadFile(ctx, "data/out.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", out)
	// Output:
	// no directory yet: true
	// "a\nb\nc\n"
}

func ExampleSandbox_CopyOut() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(exampleImage()))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	if _, err := sb.Exec(ctx, "mkdir -p report/img && echo '# Report' > report/README.md && echo png > report/img/plot.png"); err != nil {
		log.Fatal(err)
	}
	host, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(host)
	if err := sb.CopyOut(ctx, "report", host); err != nil {
		log.Fatal(err)
	}
	filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(host, p)
		fmt.Println(rel)
		return err
	})
	// Output:
	// .
	// report
	// report/README.md
	// report/img
	// report/img/plot.png
}

func ExampleSandbox_FS() {
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(exampleImage()))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	if _, err := sb.Exec(ctx, "mkdir -p src && touch src/a.py src/b.py src/notes.txt"); err != nil {
		log.Fatal(err)
	}
	matches, err := fs.Glob(sb.FS(ctx), "workspace/src/*.py")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(matches)
	// Output: [workspace/src/a.py workspace/src/b.py]
}

func ExamplePrune() {
	// Remove what crashed programs left behind; live sandboxes are untouched.
	n, err := sandbox.Prune(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	_ = n
	// Output:
}

func ExampleSandbox_Interpreter() {
	ctx := context.Background()
	// An image with python3 (the tests build one with pandas and matplotlib).
	sb, err := sandbox.New(ctx, sandbox.WithImage(pythonImage))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()

	py, err := sb.Interpreter(ctx, "python")
	if err != nil {
		log.Fatal(err)
	}
	defer py.Close()
	// State stays between runs, as in a notebook.
	if _, err := py.Run(ctx, "prices = {'apple': 3, 'pear': 5}"); err != nil {
		log.Fatal(err)
	}
	ex, err := py.Run(ctx, "sum(prices.values())")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", ex.Outputs[0].MIME, ex.Outputs[0].Data)
	// Mistakes are data, with the line they happened on.
	ex, err = py.Run(ctx, "total = 0\nprices['plum']")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ex.Error.Name, ex.Error.Value)
	// Output:
	// text/plain 8
	// KeyError 'plum'
}

// A snapshot taken once, forked into a warm pool's sandboxes: each fork
// is a hand-out and an untar, so trying four approaches from the same
// state costs milliseconds, not four sandbox starts.
func ExampleSnapshot_Fork() {
	ctx := context.Background()
	opts := []sandbox.Option{sandbox.WithImage(exampleImage())}
	pool, err := sandbox.NewPool(ctx, 4, opts...) // the snapshot's settings
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	src, err := sandbox.New(ctx, opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Exec(ctx, "echo prepared > state"); err != nil {
		log.Fatal(err)
	}
	snap, err := src.Snapshot(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer snap.Remove(ctx)

	forks, err := snap.Fork(ctx, 4, sandbox.WithPool(pool))
	if err != nil {
		log.Fatal(err)
	}
	for i, f := range forks {
		defer f.Close()
		res, err := f.Exec(ctx, fmt.Sprintf("echo approach %d >> state; cat state", i))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(strings.Join(strings.Fields(res.Stdout), " "))
	}
	// Output:
	// prepared approach 0
	// prepared approach 1
	// prepared approach 2
	// prepared approach 3
}
