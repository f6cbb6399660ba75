package sandbox_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Images used by the tests: busyboxImage is tiny and starts fast; pythonImage
// (SANDBOX_IMAGE, or the project's Debian + python3 image) has python3,
// numpy, pandas and matplotlib.
var busyboxImage, pythonImage string

func TestMain(m *testing.M) {
	// The default driver's idle connections are not a leak: closed before
	// the check.
	idle := func(context.Context) (func(), error) { return sandboxtest.CloseIdleConnections, nil }
	os.Exit(testenv.Main(m, testenv.Images{Busybox: &busyboxImage, Python: &pythonImage}, idle))
}

// newSandbox returns a busybox sandbox closed at the end of the test.
func newSandbox(t testing.TB, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return newSandboxImage(t, busyboxImage, opts...)
}

// newPython returns a sandbox of the python image closed at the end of the
// test.
func newPython(t testing.TB, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return newSandboxImage(t, pythonImage, opts...)
}

func newSandboxImage(t testing.TB, img string, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return sandboxtest.New(t, append([]sandbox.Option{sandbox.WithImage(img)}, opts...)...)
}

// testCtx returns a context bounded by a generous deadline for one test.
//
// Parallel subtests sharing a parent's context may wait for a free slot
// behind long tests (the snapshot chain takes minutes), so the bound is only
// a guard against hangs, well inside the suite's own -timeout.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// mustExec runs script and fails the test on an infrastructure error.
func mustExec(t testing.TB, sb *sandbox.Sandbox, script string) *sandbox.Result {
	t.Helper()
	r, err := sb.Exec(testCtx(t), script)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	return r
}
