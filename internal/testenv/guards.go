package testenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// Rules for tests that must pass on a loaded machine (other test runs, image
// builds and compilers share the engine and the CPUs):
//
//   - A test asserts behaviour, never speed. Durations are reported with
//     t.Logf; the only upper bounds are hang guards (HangGuard or more),
//     which say that something never happened, not that it was slow.
//   - A lower bound on a duration is kept only when it is guaranteed, such
//     as a sleep inside the command or a deadline the test set itself.
//   - A test that needs something to have happened inside a sandbox before
//     a kill (a bomb that reached its limit, output that was written) waits
//     for it and then ends the command itself (ManualDeadline), rather than
//     hoping a timer fires late enough.

// HangGuard bounds a wait that must end but whose duration depends on the
// machine's load: polling for a container to go, for a kill to be
// reaped, for Wait to return after a kill. Exceeding it means the thing
// waited for is not going to happen (a hang or a leak), not that the
// machine was slow; the library's own bounds (DefaultTimeout, 30 s) fit
// inside it.
const HangGuard = 2 * time.Minute

// SkipOrFail skips the test because the environment lacks something it
// needs (a runtime, a tool, a kernel feature), except in CI (CI=true),
// where a missing piece of the environment is a failure: CI must not go
// green by silently skipping.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: cannot skip: "+format, args...)
		return
	}
	t.Skipf(format, args...)
}

// ManualDeadline returns a context that ends like one whose deadline has
// passed (Err returns context.DeadlineExceeded) when expire is called, or
// with parent's error if parent ends first. It is a deadline that passes
// at a moment the test chooses (once the command under test has done
// what the test needs it to have done) instead of at a moment on the clock
// that a slow engine may reach before the command even started. Calling
// expire more than once is harmless.
func ManualDeadline(parent context.Context) (ctx context.Context, expire func()) {
	c := &manualDeadline{parent: parent, done: make(chan struct{})}
	context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c, func() { c.end(context.DeadlineExceeded) }
}

type manualDeadline struct {
	parent context.Context
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	err    error
}

func (c *manualDeadline) end(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.done)
	})
}

func (c *manualDeadline) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *manualDeadline) Done() <-chan struct{}       { return c.done }
func (c *manualDeadline) Value(key any) any           { return c.parent.Value(key) }

func (c *manualDeadline) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
