// Package testenv is the shared TestMain of the project's test suites: it
// builds the images the tests need, runs them, and then fails the run if
// this process left engine objects (containers, volumes, networks, images
// carrying its owner label) or goroutines behind, as sandboxtest.Main does.
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

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

// Main builds the images, runs setup (if not nil), runs the tests, runs
// the cleanup setup returned, and checks for leaks. Use it as
// os.Exit(testenv.Main(m, images, nil)).
//
// Without a reachable engine, outside CI, it runs the tests as they are:
// the unit tests of pure logic need no engine, and those that do fail
// with the library's ErrEngineUnavailable. In CI (CI=true) a missing engine
// fails the run at once.
func Main(m *testing.M, imgs Images, setup func(ctx context.Context) (cleanup func(), err error)) int {
	// Tests never have the engine reach a registry (the network rule):
	// a missing image is an error, not a pull. Tests of pulling set
	// PullMissing themselves, against a registry of their own.
	os.Setenv("AGENTSANDBOX_PULL", "never")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := ping(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "CI=true: the tests need a Docker engine:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "testenv: no Docker engine (%v): only tests that need none can pass\n", err)
		return m.Run()
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
	if err := engine.Left(15 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	if err := goleak.Find(before); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	return code
}

// ping checks that the engine DOCKER_HOST names answers.
func ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli, err := engine.Connect(ctx, "", 10*time.Second, "")
	if err != nil {
		return err
	}
	return cli.Close()
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
// and images labelled with this process as owner, on the engine the
// environment (DOCKER_HOST) names.
func OwnedObjects(ctx context.Context) (Objects, error) {
	cli, err := engine.Connect(ctx, "", 30*time.Second, "")
	if err != nil {
		return Objects{}, err
	}
	defer cli.Close()
	objs, err := engine.Owned(ctx, cli, 0)
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
