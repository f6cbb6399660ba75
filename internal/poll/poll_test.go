package poll_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/poll"
)

// fatalTB records the failure Eventually reports instead of ending the test.
type fatalTB struct {
	testing.TB
	fatal string
}

func (f *fatalTB) Helper()                        {}
func (f *fatalTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }

func TestEventually(t *testing.T) {
	// Done on the third call: Eventually returns, having called no more.
	calls := 0
	poll.Eventually(t, time.Minute, func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprintf("%d calls", calls)
	})
	if calls != 3 {
		t.Errorf("cond called %d times, want 3", calls)
	}

	// Never done: the failure names the timeout and the last reason.
	f := &fatalTB{TB: t}
	calls = 0
	poll.Eventually(f, 50*time.Millisecond, func() (bool, string) {
		calls++
		return false, fmt.Sprintf("still %d", calls)
	})
	if want := fmt.Sprintf("not within 50ms: still %d", calls); calls < 2 || f.fatal != want {
		t.Errorf("after %d calls: Fatalf(%q), want %q", calls, f.fatal, want)
	}
}

func TestEvery(t *testing.T) {
	if err := poll.Every(context.Background(), time.Millisecond, func() (bool, string) { return true, "" }); err != nil {
		t.Errorf("Every of a condition that holds: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := poll.Every(ctx, time.Millisecond, func() (bool, string) { return false, "the door is shut" })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasSuffix(err.Error(), ": the door is shut") {
		t.Errorf("Every past its deadline: %v; want DeadlineExceeded and the last reason", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := poll.Every(ctx, time.Millisecond, func() (bool, string) { return false, "no" }); !errors.Is(err, context.Canceled) {
		t.Errorf("Every with a cancelled context: %v; want context.Canceled", err)
	}
}
