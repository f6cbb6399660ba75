// Package testenv is the shared TestMain of the project's test suites: it
// asks the backend under test what it is, builds the images the tests
// need, runs them, and then fails the run if this process left engine
// objects (containers, volumes, networks, images carrying its owner label)
// or goroutines behind, as sandboxtest.Main does. Tests ask it whether
// they apply to the backend (Requires, NotOn) and skip, or under CI fail,
// on a missing piece of the environment (SkipOrFail).
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/internal/engine"
	"go.uber.org/goleak"
)

// Images receives the references of the test images. Nil fields are not
// built.
type Images struct {
	Busybox *string // the tiny busybox image
	Python  *string // SANDBOX_IMAGE, or the project's Debian + python3 image
}

// Main asks drv, the backend the package's tests make their sandboxes
// on, what it is (see Caps), builds the images, runs setup (if not nil),
// runs the tests, runs the cleanup setup returned, and checks for leaks:
// objects of this process that drv still lists (it must be a
// driver.Lister) and goroutines. Use it as os.Exit(testenv.Main(m,
// sandbox.DefaultDriver, images, nil)).
//
// Without a reachable engine, outside CI, it runs the tests as they are:
// the unit tests of pure logic need no engine, and those that do fail
// with the library's ErrEngineUnavailable or skip (Caps). In CI (CI=true)
// a missing engine fails the run at once, as does an engine of another
// kind than EnvBackend names.
//
// On a backend that puts no resource limits in force (rootless Podman on
// cgroup v1) the package's tests do not apply: each makes its sandboxes
// with the default limits, which New refuses there. Main says so and runs
// none; package sandboxtest's conformance suite is that backend's test.
func Main(m *testing.M, drv driver.Driver, imgs Images, setup func(ctx context.Context) (cleanup func(), err error)) int {
	// Tests never have the engine reach a registry (the network rule):
	// a missing image is an error, not a pull. Tests of pulling set
	// PullMissing themselves, against a registry of their own.
	os.Setenv("AGENTSANDBOX_PULL", "never")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	suite.drv = drv
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	suite.caps, suite.err = drv.Caps(cctx)
	ccancel()
	if suite.err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "CI=true: the tests need their backend's engine:", suite.err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "testenv: no engine (%v): only tests that need none can pass\n", suite.err)
		return m.Run()
	}
	if why := checkBackend(suite.caps); why != "" {
		fmt.Fprintln(os.Stderr, "testenv:", why)
		return 1
	}
	if suite.caps.NoResourceLimits {
		fmt.Fprintf(os.Stderr, "testenv: not applicable on %v: the engine puts no resource limits in force (driver.Caps.NoResourceLimits) and this package's tests make their sandboxes with the default limits, which New refuses there; no test run (the conformance suite, package sandboxtest, tests this backend)\n", suite.caps.Engine)
		return 0
	}
	lister, ok := drv.(driver.Lister)
	if !ok {
		fmt.Fprintf(os.Stderr, "testenv: the backend %T cannot list what the tests made (no driver.Lister): no leak check possible\n", drv)
		return 1
	}
	var err error
	if imgs.Busybox != nil {
		if *imgs.Busybox, err = images.Ensure(ctx, images.Busybox, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "test images:", err)
			return 1
		}
	}
	if imgs.Python != nil {
		if *imgs.Python, err = images.FromEnv(ctx, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "test images:", err)
			return 1
		}
	}
	cleanup := func() {}
	if setup != nil {
		c, err := setup(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "test setup:", err)
			return 1
		}
		if c != nil {
			cleanup = c
		}
	}
	// What sandboxtest.Main checks (which this package cannot import: the
	// library's internal packages use it too).
	before := goleak.IgnoreCurrent()
	code := m.Run()
	cleanup()
	closeIdle(drv)
	err = engine.LeftOf(15*time.Second, func(ctx context.Context) ([]engine.Object, error) {
		objs, err := lister.Owned(ctx, 0)
		out := make([]engine.Object, len(objs))
		for i, o := range objs {
			out[i] = engine.Object(o)
		}
		return out, err
	})
	closeIdle(drv) // the leak check's own
	if err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	if err := goleak.Find(before); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	return code
}

// closeIdle closes the connections of d that no request uses now: they
// are kept for the next sandbox, and would look like goroutines left
// behind.
func closeIdle(d driver.Driver) {
	if c, ok := d.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// Objects counts the engine objects carrying this process's owner label.
type Objects struct {
	Containers, Volumes, Networks, Images int
}

// Total returns the number of objects of every kind.
func (o Objects) Total() int { return o.Containers + o.Volumes + o.Networks + o.Images }

func (o Objects) String() string {
	return fmt.Sprintf("%d containers, %d volumes, %d networks, %d images",
		o.Containers, o.Volumes, o.Networks, o.Images)
}

// OwnedObjects counts the containers (running or not), volumes, networks
// and images that the backend of the tests (Main's driver) lists as this
// process's.
func OwnedObjects(ctx context.Context) (Objects, error) {
	l, ok := suite.drv.(driver.Lister)
	if !ok {
		return Objects{}, fmt.Errorf("the backend of the tests (%T) cannot list what the library made: is the package's TestMain testenv.Main?", suite.drv)
	}
	objs, err := l.Owned(ctx, 0)
	var o Objects
	for _, x := range objs {
		switch x.Type {
		case "container":
			o.Containers++
		case "volume":
			o.Volumes++
		case "network":
			o.Networks++
		case "image":
			o.Images++
		}
	}
	return o, err
}
