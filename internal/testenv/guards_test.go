package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// recordTB records what SkipOrFail asks of its testing.TB.
type recordTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordTB) Helper()                        {}
func (r *recordTB) Fatalf(format string, a ...any) { r.fatal = fmt.Sprintf(format, a...) }
func (r *recordTB) Skipf(format string, a ...any)  { r.skip = fmt.Sprintf(format, a...) }

func TestSkipOrFail(t *testing.T) {
	for _, ci := range []string{"", "false", "1", "true"} {
		t.Setenv("CI", ci)
		r := &recordTB{TB: t}
		SkipOrFail(r, "no %s here", "runsc")
		if ci == "true" {
			if r.fatal != "CI=true: cannot skip: no runsc here" || r.skip != "" {
				t.Errorf("CI=%q: Fatalf(%q) Skipf(%q), want a failure", ci, r.fatal, r.skip)
			}
		} else if r.skip != "no runsc here" || r.fatal != "" {
			t.Errorf("CI=%q: Fatalf(%q) Skipf(%q), want a skip", ci, r.fatal, r.skip)
		}
	}
}

func TestManualDeadline(t *testing.T) {
	ctx, expire := ManualDeadline(context.Background())
	// What the library does with it: a timeout of its own on top.
	child, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	if ctx.Err() != nil || child.Err() != nil {
		t.Fatalf("before expire: %v, %v", ctx.Err(), child.Err())
	}
	select {
	case <-ctx.Done():
		t.Fatal("Done before expire")
	default:
	}
	expire()
	expire() // harmless
	<-ctx.Done()
	<-child.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Errorf("after expire: %v, %v; want DeadlineExceeded", ctx.Err(), child.Err())
	}

	// The parent ending first ends it with the parent's error.
	parent, cancelParent := context.WithCancel(context.Background())
	ctx, expire = ManualDeadline(parent)
	cancelParent()
	<-ctx.Done()
	expire()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("after the parent's cancel: %v, want Canceled", ctx.Err())
	}
}
