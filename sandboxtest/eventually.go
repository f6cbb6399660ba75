package sandboxtest

import (
	"context"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/poll"
)

// Eventually waits for something that must happen but whose moment
// depends on the machine (a container to go, a counter to reach a value, a
// process to be reaped): it calls cond until cond reports done (at once,
// then at growing intervals, from 5 ms up to 100 ms), and fails the test
// with t.Fatalf if it has not within timeout, with the reason cond gave
// last, as in
//
//	sandboxtest.Eventually(t, time.Minute, func() (bool, string) {
//		n := countContainers(t)
//		return n == 0, fmt.Sprintf("%d containers left, want 0", n)
//	})
//
// The timeout is a hang guard, not a measure of speed: choose it so that
// exceeding it means the thing waited for is not going to happen. cond runs
// on the test's goroutine and may end the test itself (t.Fatal) on an
// error that waiting will not cure.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, reason string)) {
	t.Helper()
	poll.Eventually(t, timeout, cond)
}

// Poll calls cond every interval (the first time at once) until it reports
// done, and returns nil then; or, if ctx ends first, an error that wraps
// ctx's error (errors.Is reports context.DeadlineExceeded for a timeout)
// and carries the reason cond gave last, which says what was still not so.
// cond runs on the caller's goroutine.
//
// Poll is for waits that must not fail a test themselves, and for those
// that must watch closely (a watcher goroutine that acts the moment a
// container appears); a test that waits for something to happen uses
// Eventually.
func Poll(ctx context.Context, every time.Duration, cond func() (done bool, reason string)) error {
	return poll.Every(ctx, every, cond)
}
