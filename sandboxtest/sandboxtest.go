// Package sandboxtest helps tests that use sandboxes, as net/http/httptest
// helps tests of HTTP code: New gives a test a sandbox that is closed when
// the test ends, and Main checks, once every test has run, that nothing the
// tests made is left behind — no container, volume, network or snapshot
// image on the engine and no goroutine in the process.
//
//	func TestMain(m *testing.M) { os.Exit(sandboxtest.Main(m)) }
//
//	func TestScript(t *testing.T) {
//		sb := sandboxtest.New(t, sandbox.WithImage("python:3.12-slim"))
//		r, err := sb.Exec(context.Background(), "python3 -c 'print(6*7)'")
//		if err != nil || r.Stdout != "42\n" {
//			t.Fatalf("got %q, %v", r.Stdout, err)
//		}
//	}
//
// Engine objects are found by the owner label the library puts on every
// object it makes, so objects of other processes (another test binary
// running beside this one) are never counted or touched.
package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/driverof"
)

// New creates a sandbox with opts for the test and closes it when the test
// (and its subtests) end, reporting a failing Close as a test error. A
// failing New ends the test with t.Fatal. Creation is bounded by a minute
// (an image that must be pulled first may need a longer context: create the
// sandbox with sandbox.New then).
func New(t testing.TB, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, opts...)
	if err != nil {
		t.Fatalf("sandbox.New: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("sandbox Close: %v", err)
		}
	})
	return sb
}

// Main runs the tests of m and then checks that they left nothing behind:
// within 15 seconds (the engine removes some objects asynchronously) no
// engine object made by this process may remain, and no goroutine started
// while the tests ran may still run. A leak makes the exit code 1 and is
// described on standard error. Use it as os.Exit(sandboxtest.Main(m)).
//
// The engine asked is that of the backend opts select (sandbox.WithDriver,
// sandbox.WithHost, else sandbox.DefaultDriver): pass the options the
// tests make their sandboxes with, or those that choose the backend.
// Objects the tests made on another backend are not checked.
func Main(m *testing.M, opts ...sandbox.Option) int {
	before := goleak.IgnoreCurrent()
	code := m.Run()
	CloseIdleConnections(opts...)
	if err := Left(15*time.Second, opts...); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxtest:", err)
		return 1
	}
	CloseIdleConnections(opts...) // Left's own

	if err := goroutinesLeft(before, 5*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxtest: goroutines left behind:", err)
		return 1
	}
	return code
}

// goroutinesLeft waits up to wait for the goroutines that opt does not
// ignore to end: a closed connection's may take a moment (client-go's SPDY
// streams: up to a second), and are not leaks.
func goroutinesLeft(opt goleak.Option, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var err error
	_ = Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		err = goleak.Find(opt)
		return err == nil, ""
	})
	return err
}

// CloseIdleConnections closes the connections of the backend opts select
// (as Main) that no request uses now: they are kept for the next sandbox,
// and would look like goroutines left behind.
func CloseIdleConnections(opts ...sandbox.Option) {
	d, closeFn, err := driverof.Of(opts)
	if err != nil {
		return
	}
	if c, ok := d.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	if closeFn != nil {
		closeFn()
	}
}

// Left waits up to wait for the backend opts select (as Main) to hold no
// object made by this process, and describes what remains if some do. An
// engine that cannot be reached is an error too, as is a backend that
// cannot list what it made (one that is no driver.Lister: the error
// wraps sandbox.ErrUnsupported).
func Left(wait time.Duration, opts ...sandbox.Option) error {
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		objs, err := Owned(ctx, 0, opts...)
		cancel()
		if err != nil {
			return err
		}
		if len(objs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left behind: %s", describe(objs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// describe says how many objects of each type remain, and names them.
func describe(objs []Object) string {
	count := map[string]int{}
	var names []string
	for _, o := range objs {
		count[o.Type]++
		id := o.ID
		if o.Name != "" {
			id = o.Name
		} else if len(id) > 19 && strings.HasPrefix(id, "sha256:") {
			id = id[7:19]
		} else if len(id) > 12 && o.Type != "volume" {
			id = id[:12]
		}
		names = append(names, fmt.Sprintf("%s %s (%s)", o.Type, id, o.Role))
	}
	s := fmt.Sprintf("%d containers, %d volumes, %d networks, %d images", count["container"], count["volume"], count["network"], count["image"])
	if count["pod"] > 0 {
		s += fmt.Sprintf(", %d pods", count["pod"])
	}
	return s + ": " + strings.Join(names, ", ")
}

// Object is an engine object the library made.
type Object = driver.Object

// Owned lists the objects (on Docker: containers running or not, volumes,
// networks and snapshot images; on Kubernetes: pods) that process pid on
// this host made through the library, on the engine of the backend opts
// select (sandbox.WithDriver, sandbox.WithHost, else
// sandbox.DefaultDriver); pid 0 means this process. For another pid, the
// objects of every process that has had that pid since the host booted are
// listed. The order is by type, then ID. The backend must be a
// driver.Lister: else the error wraps sandbox.ErrUnsupported.
func Owned(ctx context.Context, pid int, opts ...sandbox.Option) ([]Object, error) {
	d, closeFn, err := driverof.Of(opts)
	if err != nil {
		return nil, err
	}
	if closeFn != nil {
		defer closeFn()
	}
	l, ok := d.(driver.Lister)
	if !ok {
		return nil, fmt.Errorf("sandboxtest: the backend %T cannot list what the library made (no driver.Lister): %w", d, sandbox.ErrUnsupported)
	}
	return l.Owned(ctx, pid)
}
