package tools_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
	"github.com/agentsandbox/sandbox/tools"
)

// Images used by the tests: busyboxImage is tiny and starts fast;
// pythonImage (SANDBOX_IMAGE, or the project's Debian + python3 image) has
// python3 with numpy, pandas and matplotlib.
var busyboxImage, pythonImage string

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, sandbox.DefaultDriver, testenv.Images{Busybox: &busyboxImage, Python: &pythonImage}, nil))
}

// newSandbox returns a sandbox of img closed at the end of the test.
func newSandbox(t testing.TB, img string, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return sandboxtest.New(t, append([]sandbox.Option{sandbox.WithImage(img)}, opts...)...)
}

// newSet returns the tools of a new busybox sandbox.
func newSet(t testing.TB, opts ...tools.Option) (*tools.Set, *sandbox.Sandbox) {
	t.Helper()
	sb := newSandbox(t, busyboxImage)
	return tools.New(sb, opts...), sb
}

// testCtx returns a context bounded by a generous deadline for one test.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// call runs a tool call that must not fail with an error.
func call(t testing.TB, set *tools.Set, name, args string) string {
	t.Helper()
	out, err := set.Call(testCtx(t), name, args)
	if err != nil {
		t.Fatalf("Call(%s, %s): %v", name, args, err)
	}
	return out
}

// mustExec runs script in sb and fails the test unless it exits 0.
func mustExec(t testing.TB, sb *sandbox.Sandbox, script string) string {
	t.Helper()
	r, err := sb.Exec(testCtx(t), script)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("Exec(%q): exit %d: %s%s", script, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r.Stdout
}
