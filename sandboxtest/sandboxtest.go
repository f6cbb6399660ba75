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
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/engine"
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
// The engine is the one DOCKER_HOST names (or the default socket); objects
// of sandboxes made with WithHost on another engine are not checked.
func Main(m *testing.M) int {
	before := goleak.IgnoreCurrent()
	code := m.Run()
	CloseIdleConnections()
	if err := Left(15 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxtest:", err)
		return 1
	}
	CloseIdleConnections() // Left's own

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
	deadline := time.Now().Add(wait)
	for {
		err := goleak.Find(opt)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CloseIdleConnections closes the connections of sandbox.DefaultDriver
// that no request uses now (they are kept for the next sandbox, and would
// look like goroutines left behind).
func CloseIdleConnections() {
	if d, ok := sandbox.DefaultDriver.(interface{ CloseIdleConnections() }); ok {
		d.CloseIdleConnections()
	}
}

// Left waits up to wait for the engine to hold no object made by this
// process, and describes what remains if some do. An engine that cannot be
// reached is an error too. The engine is sandbox.DefaultDriver's if it can
// list them (driver.Lister), else the one DOCKER_HOST names.
func Left(wait time.Duration) error {
	l, ok := sandbox.DefaultDriver.(driver.Lister)
	if !ok {
		return engine.Left(wait)
	}
	return engine.LeftOf(wait, func(ctx context.Context) ([]engine.Object, error) {
		objs, err := l.Owned(ctx, 0)
		out := make([]engine.Object, len(objs))
		for i, o := range objs {
			out[i] = engine.Object(o)
		}
		return out, err
	})
}

// Object is an engine object the library made.
type Object = driver.Object

// Owned lists the containers (running or not), volumes, networks and
// images that process pid on this host made through the library, on the
// engine DOCKER_HOST names — or, if sandbox.DefaultDriver can list them
// (driver.Lister, as the Kubernetes backend's pods), on its engine; pid 0
// means this process. For another pid, the
// objects of every process that has had that pid since the host booted are
// listed. The order is by type, then ID.
func Owned(ctx context.Context, pid int) ([]Object, error) {
	if l, ok := sandbox.DefaultDriver.(driver.Lister); ok {
		return l.Owned(ctx, pid)
	}
	cli, err := engine.Connect(ctx, "", 30*time.Second, "")
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %v", sandbox.ErrEngineUnavailable, engine.Host(""), err)
	}
	defer cli.Close()
	objs, err := engine.Owned(ctx, cli, pid)
	out := make([]Object, len(objs))
	for i, o := range objs {
		out[i] = Object(o)
	}
	return out, err
}
