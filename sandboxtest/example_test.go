package sandboxtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// A test file of a program that runs code in sandboxes: every test gets a
// sandbox of its own, closed when it ends, and the run fails if a test
// leaves a container or a goroutine behind.
func Example() {
	_ = func(m *testing.M) { // func TestMain(m *testing.M)
		os.Exit(sandboxtest.Main(m))
	}
	_ = func(t *testing.T) { // func TestAnswer(t *testing.T)
		sb := sandboxtest.New(t, sandbox.WithImage("python:3.12-slim"), sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20}))
		r, err := sb.Exec(context.Background(), "python3 -c 'print(6*7)'")
		if err != nil || r.Stdout != "42\n" {
			t.Fatalf("got %q, %v", r.Stdout, err)
		}
	}
}
