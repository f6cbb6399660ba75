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

func TestMain(m *testing.M) {
	os.Setenv("AGENTSANDBOX_PULL", "never") // tests never reach a registry
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	var err error
	busybox, err = images.Ensure(ctx, images.Busybox, os.Stderr)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test image:", err)
		os.Exit(1)
	}
	os.Exit(sandboxtest.Main(m))
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
		sb := sandboxtest.New(t, sandbox.WithImage(busybox))
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
	sandboxtest.New(t, sandbox.WithImage(busybox))
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
	for {
		if _, err := sandbox.Prune(ctx); err != nil {
			t.Fatal(err)
		}
		objs, err := sandboxtest.Owned(ctx, cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if len(objs) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the child's objects are still there: %+v", objs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHelperLeak runs in the child of TestMainReportsLeak: it makes a
// sandbox and never closes it.
func TestHelperLeak(t *testing.T) {
	if os.Getenv("SANDBOXTEST_LEAK") != "1" {
		t.Skip("run by TestMainReportsLeak")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sandbox.New(ctx, sandbox.WithImage(busybox)); err != nil {
		t.Fatal(err)
	}
}

// The library's semantics, on the engine DOCKER_HOST names, with the
// busybox image.
//
// AGENTSANDBOX_TEST_NO_CGROUP_LIMITS=1 says the engine applies no cgroup
// limits (rootless Podman on cgroup v1): New with the default limits must
// then fail with ErrLimitsUnsupported, and the suite runs with those
// limits removed (run it without its limits subtests there).
func TestConformance(t *testing.T) {
	opts := []sandbox.Option{sandbox.WithImage(busybox)}
	if os.Getenv("AGENTSANDBOX_TEST_NO_CGROUP_LIMITS") != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sb, err := sandbox.New(ctx, opts...)
		if err == nil {
			sb.Close()
		}
		if !errors.Is(err, sandbox.ErrLimitsUnsupported) {
			t.Fatalf("New with the default limits on an engine that applies no cgroup limits: %v, want ErrLimitsUnsupported", err)
		}
		t.Logf("New with the default limits: %v", err)
		opts = append(opts, sandbox.WithLimits(sandbox.Limits{CPUs: -1, Memory: -1, PIDs: -1, FileSize: -1, OpenFiles: -1}))
	}
	sandboxtest.Conformance(t, opts...)
}
