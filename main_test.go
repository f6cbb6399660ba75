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
	os.Exit(testenv.Main(m, sandbox.DefaultDriver, testenv.Images{Busybox: &busyboxImage, Python: &pythonImage}, nil))
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

// Why tests do not apply on Podman, rootful or rootless (testenv.NotOn
// with testenv.Podman): what Podman's Docker-compatible API does
// differently from Docker's, or what the docker backend does not do
// there. Each is said at the start of the tests it concerns; the rest of
// the suite runs on Podman too (README, Podman).
const (
	podmanSnapshotImage = "a snapshot's engine image (Snapshot.Image): the docker backend refuses it on Podman, whose archive API refuses the snapshot's layout (ErrUnsupported)"
	podmanInspect       = "it compares Docker's own inspect fields, which Podman's Docker-compatible API fills in differently"
	podmanEvents        = "it reads the engine's events (the OOM and die reasons of the lifetime and owner-death checks), which Podman's Docker-compatible API does not give as Docker's does"
	podmanFaults        = "it pauses, kills and removes containers behind the library's back and expects Docker's answers: a container Podman paused still answers"
	podmanPull          = "it pulls from the test's plain-HTTP registry on loopback, which Podman does not pull from as Docker does"
	podmanAgentVolume   = "it removes the agent's volume behind the library's back: Podman's attach for the refill answers 409 with no reason"
	podmanTmpfsInodes   = "Podman 4.3 refuses the tmpfs nr_inodes option: the docker backend mounts /tmp and /dev/shm without the inode bound there"
	podmanGVisor        = "Podman 4.3's Docker-compatible API ignores the runtime asked for: a sandbox made WithRuntime(\"runsc\") runs under runc there (podman inspect says runc; /proc/version is the host's kernel), so New refuses WithRuntime there (TestRuntimeRefusedOnPodman) and gVisor is Docker's only (.ci/run registers it there)"
)
