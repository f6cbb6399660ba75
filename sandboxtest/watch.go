package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// watch checks Sandbox.Watch: every kind of change in order, in the
// watched directory and in one made after the watch began; a
// non-recursive watch leaves subdirectories' contents out; links planted
// to /, /etc, /proc and /tmp are never followed; the channel closes when
// the context ends and when the sandbox closes.
func (c conformance) watch(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	r := run(t, sb, "mkdir w flat && cd w && ln -s / root && ln -s /etc etc && ln -s /proc proc && ln -s /tmp tmp && pwd")
	if r.ExitCode != 0 {
		t.Fatalf("setup: exit %d: %s", r.ExitCode, r.Stderr)
	}
	dir := strings.TrimSpace(r.Stdout)
	flatDir := path.Join(path.Dir(dir), "flat")
	ch, err := sb.Watch(ctx, "w", true)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	flatCtx, cancelFlat := context.WithCancel(ctx)
	flat, err := sb.Watch(flatCtx, "flat", false)
	if err != nil {
		t.Fatalf("Watch (not recursive): %v", err)
	}
	script := func(s string) {
		t.Helper()
		if r := run(t, sb, s); r.ExitCode != 0 {
			t.Fatalf("%s: exit %d: %s", s, r.ExitCode, r.Stderr)
		}
	}
	script("cd w && echo a > f && mv f g && echo b >> g && rm g && echo x > /tmp/outside && echo y > tmp/via-link && mkdir d")
	expect(t, ch, dir, "create f", "modify f", "rename g f", "modify g", "remove g", "create d")
	script("cd w && echo x > d/h && mv d/h d/i && rm d/i && touch end")
	expect(t, ch, dir, "create d/h", "modify d/h", "rename d/i d/h", "remove d/i", "create end")
	script("cd flat && mkdir sub && echo x > sub/a && echo t > top")
	expect(t, flat, flatDir, "create sub", "create top", "modify top")
	cancelFlat()
	waitClosed(t, flat)
	for _, name := range []string{"w/root", "w/etc", "w/proc", "w/tmp"} {
		if _, err := sb.Watch(ctx, name, true); !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("Watch(%q), a link: %v; want ELOOP", name, err)
		}
	}
	if err := sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitClosed(t, ch)
}

// expect takes len(want) events from ch and compares them with want, each
// "op path [from]" relative to dir.
func expect(t *testing.T, ch <-chan sandbox.WatchEvent, dir string, want ...string) {
	t.Helper()
	var got, exp []string
	for _, w := range want {
		op, rest, _ := strings.Cut(w, " ")
		p, from, _ := strings.Cut(rest, " ")
		ev := sandbox.WatchEvent{Op: op, Path: path.Join(dir, p)}
		if from != "" {
			ev.From = path.Join(dir, from)
		}
		exp = append(exp, fmt.Sprint(ev))
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the watch's channel closed after %q; want %q", got, exp)
			}
			got = append(got, fmt.Sprint(ev))
		case <-time.After(time.Minute): // a hang guard
			t.Fatalf("events %q, then none for a minute; want %q", got, exp)
		}
	}
	if strings.Join(got, "\n") != strings.Join(exp, "\n") {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(exp, "\n"))
	}
}

// waitClosed waits for ch to close, dropping its events.
func waitClosed(t *testing.T, ch <-chan sandbox.WatchEvent) {
	t.Helper()
	timeout := time.After(time.Minute) // a hang guard
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("the watch's channel still open a minute on")
		}
	}
}
