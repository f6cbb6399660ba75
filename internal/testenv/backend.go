package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/driver"
)

// A test that cannot run on the backend under test says so in Go, at its
// start, from what the backend says of itself (driver.Caps: its engine,
// what it can do) or from who runs the tests (root or not):
//
//   - Requires(t, needs...) and NotOn(t, why, kinds...) skip the test with
//     the reason: a decision that the test does not apply to this backend,
//     which CI (CI=true) accepts like any other result;
//   - SkipOrFail(t, why) skips for a missing piece of the environment (no
//     engine, no runsc registered, no image, a tool not installed): under
//     CI=true that fails, since CI must not go green by not running what
//     it could have run.
//
// CI runs the same test command on every backend (.ci/run), naming the
// backend in EnvBackend; no list of test names says what runs where.

// EnvBackend names the environment variable that says which backend a run
// is for, as driver.EngineKind's String spells it ("docker", "podman",
// "podman-rootless"). The engine itself is the one the driver finds (for
// Docker and Podman: DOCKER_HOST, else the default socket); Main fails the
// run if the engine is of another kind, so that a run meant for Podman
// never passes on Docker. Unset, any backend is taken as it is.
const EnvBackend = "AGENTSANDBOX_BACKEND"

// suite is the backend of the tests: set by Main before the tests run.
var suite struct {
	drv  driver.Driver
	caps driver.Caps
	err  error // why the backend could not be asked (no engine), if it could not
}

// Caps returns what the backend of the tests (Main's driver) says of
// itself. Without one (no engine; a package whose TestMain is not Main)
// the test ends as a missing piece of the environment: skipped, or failed
// under CI=true.
func Caps(t testing.TB) driver.Caps {
	t.Helper()
	switch {
	case suite.err != nil:
		SkipOrFail(t, "no backend to test: %v", suite.err)
	case suite.drv == nil:
		SkipOrFail(t, "no backend to test: the package's TestMain is not testenv.Main")
	}
	return suite.caps
}

// Need is something a test needs of the backend under test, or of the
// user who runs the tests.
type Need int

const (
	// Root: this process is root (on the engine's host, which a local
	// engine shares): host firewall rules, the host's cgroup files,
	// loop-mounted disks. CI runs the suite as root and as a
	// docker-group user.
	Root Need = iota + 1
	// DiskExt4: a working directory with a size limit is a disk of its
	// own (driver.DiskExt4), not memory counted towards Limits.Memory
	// (Docker as root; a docker-group user's is a tmpfs).
	DiskExt4
	// ResourceLimits: the engine puts resource limits in force, cgroup
	// limits and rlimits (not driver.Caps.NoResourceLimits: rootless
	// Podman on cgroup v1).
	ResourceLimits
)

func (n Need) String() string {
	switch n {
	case Root:
		return "root"
	case DiskExt4:
		return "a working directory on a disk of its own (ext4)"
	case ResourceLimits:
		return "resource limits"
	}
	return fmt.Sprintf("Need(%d)", int(n))
}

// lacks says why the backend (caps) or this process lacks n, or "".
func lacks(caps driver.Caps, n Need) string {
	switch n {
	case Root:
		if uid := os.Geteuid(); uid != 0 {
			return fmt.Sprintf("the tests run as uid %d", uid)
		}
	case DiskExt4:
		if caps.Disk != driver.DiskExt4 {
			return fmt.Sprintf("the working directory is a %v here (driver.Caps.Disk)", caps.Disk)
		}
	case ResourceLimits:
		if caps.NoResourceLimits {
			return "the engine puts none in force (driver.Caps.NoResourceLimits)"
		}
	default:
		return "unknown need"
	}
	return ""
}

// Requires skips the test unless the backend under test and this process
// have all of needs: a decision that the test does not apply here, with
// the reason, which CI accepts.
func Requires(t testing.TB, needs ...Need) {
	t.Helper()
	var caps driver.Caps
	where := ""
	for _, n := range needs {
		if n != Root {
			caps = Caps(t)
			where = " on " + caps.Engine.String()
			break
		}
	}
	var why []string
	for _, n := range needs {
		if w := lacks(caps, n); w != "" {
			why = append(why, fmt.Sprintf("needs %v: %s", n, w))
		}
	}
	if len(why) > 0 {
		t.Skipf("not applicable%s: %s", where, strings.Join(why, "; "))
	}
}

// NotOn skips the test on a backend whose engine is one of kinds, saying
// why it does not apply there: a decision, which CI accepts. Prefer
// Requires where a capability says it; NotOn is for what only the kind of
// engine tells (Podman's answers that differ from Docker's, say).
func NotOn(t testing.TB, why string, kinds ...driver.EngineKind) {
	t.Helper()
	caps := Caps(t)
	for _, k := range kinds {
		if caps.Engine == k {
			t.Skipf("not applicable on %v: %s", k, why)
		}
	}
}

// Podman are both kinds of Podman engine, for NotOn.
var Podman = []driver.EngineKind{driver.EnginePodman, driver.EnginePodmanRootless}

// checkBackend says why the backend of caps is not the one EnvBackend
// names, or "".
func checkBackend(caps driver.Caps) string {
	want := os.Getenv(EnvBackend)
	if want == "" || want == caps.Engine.String() {
		return ""
	}
	return fmt.Sprintf("%s=%s, but the engine is %v (is DOCKER_HOST the %s engine?)", EnvBackend, want, caps.Engine, want)
}
