// Package poll waits for a condition that must become true but whose
// moment depends on the machine: the one implementation of the project's
// "eventually" checks. Tests outside the library's internal packages use
// it as sandboxtest.Eventually and sandboxtest.Poll; the internal
// packages' own tests, which sandboxtest builds on, use it directly. It
// imports nothing but the standard library.
package poll

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Intervals between two calls of a condition by Eventually: the first call
// is at once, the next after first, and the interval doubles up to most. A
// condition that holds soon is seen soon; one that takes seconds (a
// container to go, a kill to be reaped) is asked a few times a second, not
// hundreds.
const (
	first = 5 * time.Millisecond
	most  = 100 * time.Millisecond
)

// Every calls cond every interval (the first time at once) until it
// reports done, and returns nil then; or, if ctx ends first, an error that
// wraps ctx's error (errors.Is reports context.DeadlineExceeded for a
// timeout) and carries the reason cond gave last. cond runs on the
// caller's goroutine.
func Every(ctx context.Context, every time.Duration, cond func() (done bool, reason string)) error {
	if reason, err := poll(ctx, every, every, cond); err != nil {
		return fmt.Errorf("%w: %s", err, reason)
	}
	return nil
}

// Eventually calls cond until it reports done (at once, then at growing
// intervals, from 5 ms up to 100 ms), and fails the test with t.Fatalf if
// it has not within timeout, with the reason cond gave last. cond runs on
// the test's goroutine and may end the test itself.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, reason string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if reason, err := poll(ctx, first, most, cond); err != nil {
		t.Fatalf("not within %v: %s", timeout, reason)
	}
}

// poll calls cond until it reports done or ctx ends, waiting wait between
// the first two calls and doubling that up to limit. It returns cond's last
// reason and ctx's error apart.
func poll(ctx context.Context, wait, limit time.Duration, cond func() (bool, string)) (reason string, err error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		done, reason := cond()
		if done {
			return "", nil
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return reason, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, limit)
	}
}
