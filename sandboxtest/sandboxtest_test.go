package sandboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

var busybox string

// base are the options of every sandbox these tests make: the busybox
// image and, on a backend that puts no resource limits in force
// (driver.Caps.NoResourceLimits), those limits removed.
var base []sandbox.Option

func TestMain(m *testing.M) {
	os.Setenv("AGENTSANDBOX_PULL", "never") // tests never reach a registry
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	var err error
	busybox, err = images.Ensure(ctx, images.Busybox, os.Stderr)
	if err != nil {
		cancel()
		fmt.Fprintln(os.Stderr, "test image:", err)
		os.Exit(1)
	}
	caps, err := sandbox.DefaultDriver.Caps(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "the backend's Caps:", err)
		os.Exit(1)
	}
	base = []sandbox.Option{sandbox.WithImage(busybox)}
	if caps.NoResourceLimits {
		base = append(base, sandbox.WithLimits(sandbox.Limits{CPUs: -1, Memory: -1, PIDs: -1, FileSize: -1, OpenFiles: -1}))
	}
	os.Exit(sandboxtest.Main(m))
}

// opts are base and more.
func opts(more ...sandbox.Option) []sandbox.Option {
	return append(append([]sandbox.Option{}, base...), more...)
}

func owned(t *testing.T) []sandboxtest.Object {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := sandboxtest.Owned(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// New's sandbox works during the test, is listed by Owned, and is gone
// once the test has ended.
func TestNewClosesWithTheTest(t *testing.T) {
	var id string
	t.Run("inner", func(t *testing.T) {
		sb := sandboxtest.New(t, opts()...)
		id = sb.ID()
		r, err := sb.Exec(context.Background(), "echo hi")
		if err != nil || r.Stdout != "hi\n" {
			t.Fatalf("Exec: %q, %v", r.Stdout, err)
		}
		var found bool
		for _, o := range owned(t) {
			if o.Type == "container" && o.ID == id {
				found = o.Role == "sandbox" && o.State == "running"
			}
		}
		if !found {
			t.Errorf("Owned does not list the running sandbox %s: %+v", id, owned(t))
		}
	})
	if err := sandboxtest.Left(15 * time.Second); err != nil {
		t.Errorf("after the test that made it: %v", err)
	}
}

// recorder is a testing.TB that records a fatal error instead of ending.
type recorder struct {
	testing.TB
	fatal    string
	cleanups []func()
}

func (r *recorder) Helper()                        {}
func (r *recorder) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }
func (r *recorder) Cleanup(f func())               { r.cleanups = append(r.cleanups, f) }

// A sandbox that cannot be made fails the test with the library's error.
func TestNewFails(t *testing.T) {
	r := &recorder{TB: t}
	sb := sandboxtest.New(r, sandbox.WithImage("agentsandbox/no-such-image:1"), sandbox.WithPullPolicy(sandbox.PullNever))
	if sb != nil || !strings.Contains(r.fatal, "no-such-image") || !strings.Contains(r.fatal, "PullNever") {
		t.Errorf("New: %v, fatal %q", sb, r.fatal)
	}
	for _, f := range r.cleanups {
		f() // closing the nil sandbox is harmless
	}
}

// Another process's objects are not this one's.
func TestOwnedOtherProcess(t *testing.T) {
	sandboxtest.New(t, opts()...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	objs, err := sandboxtest.Owned(ctx, os.Getppid())
	if err != nil || len(objs) != 0 {
		t.Errorf("Owned(parent): %+v, %v", objs, err)
	}
	if len(owned(t)) == 0 {
		t.Error("Owned(0) lists nothing while a sandbox runs")
	}
}

// Main fails a run whose tests left a sandbox open, and names it.
func TestMainReportsLeak(t *testing.T) {
	if os.Getenv("SANDBOXTEST_LEAK") == "1" {
		t.Skip("in the child")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLeak$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SANDBOXTEST_LEAK=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 ||
		!strings.Contains(string(out), "sandboxtest: left behind: 1 containers") || !strings.Contains(string(out), "(sandbox)") {
		t.Errorf("a run that leaked a sandbox: %v\n%s", err, out)
	}
	// The child is gone: its sandbox ends by itself, Prune takes the rest.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sandboxtest.Eventually(t, 2*time.Minute, func() (bool, string) {
		if _, err := sandbox.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		objs, err := sandboxtest.Owned(ctx, cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return len(objs) == 0, fmt.Sprintf("the child's objects are still there: %+v", objs)
	})
}

// TestHelperLeak runs in the child of TestMainReportsLeak: it makes a
// sandbox and never closes it.
func TestHelperLeak(t *testing.T) {
	if os.Getenv("SANDBOXTEST_LEAK") != "1" {
		t.Skip("run by TestMainReportsLeak")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sandbox.New(ctx, opts()...); err != nil {
		t.Fatal(err)
	}
}

// The library's semantics, on the backend of sandbox.DefaultDriver (the
// engine DOCKER_HOST names), with the busybox image. What the backend
// lacks, Conformance asks its Caps.
func TestConformance(t *testing.T) {
	sandboxtest.Conformance(t, sandbox.WithImage(busybox))
}
