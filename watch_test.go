package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// watchGuard bounds each wait for an event: a hang guard, not a measure.
const watchGuard = time.Minute

// recv takes the next event, failing the test if the channel closes or
// none comes within watchGuard.
func recv(t *testing.T, ch <-chan sandbox.WatchEvent) sandbox.WatchEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("the watch's channel closed")
		}
		return ev
	case <-time.After(watchGuard):
		t.Fatalf("no event within %v", watchGuard)
	}
	return sandbox.WatchEvent{}
}

// until takes events up to the creation of marker (an absolute path),
// which it leaves out.
func until(t *testing.T, ch <-chan sandbox.WatchEvent, marker string) []sandbox.WatchEvent {
	t.Helper()
	var got []sandbox.WatchEvent
	for {
		ev := recv(t, ch)
		if ev.Path == marker && ev.Op == sandbox.WatchCreate {
			return got
		}
		got = append(got, ev)
		if len(got) > 10_000 {
			t.Fatalf("no marker %s within 10,000 events", marker)
		}
	}
}

// closed waits for the channel to close, dropping events.
func closed(t *testing.T, ch <-chan sandbox.WatchEvent) {
	t.Helper()
	timeout := time.After(watchGuard)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatalf("the watch's channel still open after %v", watchGuard)
		}
	}
}

func evs(dir string, spec ...string) []sandbox.WatchEvent {
	var out []sandbox.WatchEvent
	for _, s := range spec {
		op, rest, _ := strings.Cut(s, " ")
		p, from, _ := strings.Cut(rest, " ")
		ev := sandbox.WatchEvent{Op: op, Path: path.Join(dir, p)}
		if from != "" {
			ev.From = path.Join(dir, from)
		}
		out = append(out, ev)
	}
	return out
}

func sameEvents(t *testing.T, what string, got, want []sandbox.WatchEvent) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: events\n%v\nwant\n%v", what, got, want)
	}
}

// TestWatch watches the working directory, recursively and not, through
// every kind of change, in it and in a directory made after the watch
// began; links planted to /, /etc, /proc and /tmp are never followed.
func TestWatch(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	wd := strings.TrimSpace(ftExec(t, sb, "pwd"))

	t.Run("recursive", func(t *testing.T) {
		ftExec(t, sb, "mkdir r")
		ch, err := sb.Watch(ctx, "r", true)
		if err != nil {
			t.Fatal(err)
		}
		dir := path.Join(wd, "r")
		ftExec(t, sb, "cd r && echo a > f && mv f g && echo b >> g && rm g && mkdir d")
		sameEvents(t, "top", []sandbox.WatchEvent{recv(t, ch), recv(t, ch), recv(t, ch), recv(t, ch), recv(t, ch), recv(t, ch)},
			evs(dir, "create f", "modify f", "rename g f", "modify g", "remove g", "create d"))
		// d is watched now: its create came after its watch was added.
		ftExec(t, sb, "cd r && echo x > d/h && mv d/h d/i && mv d/i j && mv j d/k && rm d/k && mv d e && echo y > e/l && touch end")
		sameEvents(t, "subdirectory", until(t, ch, path.Join(dir, "end")),
			evs(dir, "create d/h", "modify d/h", "rename d/i d/h", "rename j d/i", "rename d/k j", "remove d/k",
				"rename e d", "create e/l", "modify e/l"))
		// Moved out and in: a removal and a creation.
		ftExec(t, sb, "mv r/e gone && mv gone r/back")
		sameEvents(t, "moved out and in", []sandbox.WatchEvent{recv(t, ch), recv(t, ch), recv(t, ch)},
			evs(dir, "remove e", "create back", "create back/l"))
		ftExec(t, sb, "echo z > r/back/m && touch r/end2")
		sameEvents(t, "moved in", until(t, ch, path.Join(dir, "end2")), evs(dir, "create back/m", "modify back/m"))
	})

	t.Run("flat", func(t *testing.T) {
		ftExec(t, sb, "mkdir flat")
		ch, err := sb.Watch(ctx, "flat", false)
		if err != nil {
			t.Fatal(err)
		}
		dir := path.Join(wd, "flat")
		ftExec(t, sb, "cd flat && mkdir sub && echo x > sub/a && mkdir sub/deeper && echo y > sub/deeper/b && echo top > t && touch end")
		sameEvents(t, "non-recursive", until(t, ch, path.Join(dir, "end")),
			evs(dir, "create sub", "create t", "modify t"))
	})

	t.Run("links", func(t *testing.T) {
		ftExec(t, sb, "mkdir links && cd links && ln -s / root && ln -s /etc etc && ln -s /proc proc && ln -s /tmp tmp && ln -s . self")
		ch, err := sb.Watch(ctx, "links", true)
		if err != nil {
			t.Fatal(err)
		}
		dir := path.Join(wd, "links")
		ftExec(t, sb, "echo x > /tmp/outside && echo x > links/tmp/again && mkdir /tmp/newdir && cat /proc/self/status > /dev/null && touch links/end")
		sameEvents(t, "links", until(t, ch, path.Join(dir, "end")), nil)
		// Links planted after the watch began: entries, never followed.
		ftExec(t, sb, "cd links && ln -s /proc p2 && ln -s / r2 && ln -s /tmp t2 && echo x > /tmp/later && mkdir /tmp/later.d && echo y > t2/via && touch end2")
		sameEvents(t, "links planted later", until(t, ch, path.Join(dir, "end2")), evs(dir, "create p2", "create r2", "create t2"))
		for _, name := range []string{"links/root", "links/etc", "links/proc", "links/tmp", "links/self"} {
			_, err := sb.Watch(ctx, name, true)
			if !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
				t.Errorf("Watch(%q) = %v; want ELOOP", name, err)
			}
		}
		for _, name := range []string{"/proc", "/proc/self", "/sys"} {
			_, err := sb.Watch(ctx, name, true)
			if !errors.Is(err, fs.ErrPermission) && !errors.Is(err, syscall.ELOOP) {
				t.Errorf("Watch(%q) = %v; want a permission error", name, err)
			}
		}
		// As the sandbox user: a directory closed to it is not watched.
		ftExec(t, sb, "mkdir locked && chmod 000 locked")
		if _, err := sb.Watch(ctx, "locked", false); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("Watch(locked) = %v; want a permission error", err)
		}
		if _, err := sb.Watch(ctx, "missing", true); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Watch(missing) = %v; want ErrNotExist", err)
		}
		if _, err := sb.Watch(ctx, "links/../flat/t", true); !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("Watch of a file = %v; want ENOTDIR", err)
		}
	})

	t.Run("removed", func(t *testing.T) {
		ftExec(t, sb, "mkdir rm")
		ch, err := sb.Watch(ctx, "rm", true)
		if err != nil {
			t.Fatal(err)
		}
		ftExec(t, sb, "rmdir rm")
		if ev := recv(t, ch); ev != (sandbox.WatchEvent{Op: sandbox.WatchRemove, Path: path.Join(wd, "rm")}) {
			t.Errorf("event %v; want the directory's removal", ev)
		}
		closed(t, ch)
	})

	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		ch, err := sb.Watch(cctx, ".", true)
		if err != nil {
			t.Fatal(err)
		}
		ftExec(t, sb, "touch c1")
		recv(t, ch)
		cancel()
		closed(t, ch)
		// The agent let go of it: more watches than its bound, one after
		// the other, all start.
		for i := range 12 {
			cctx, cancel := context.WithCancel(ctx)
			ch, err := sb.Watch(cctx, ".", false)
			if err != nil {
				t.Fatalf("watch %d after cancels: %v", i, err)
			}
			cancel()
			closed(t, ch)
		}
	})

}

// TestWatchBound runs more watches at once than a sandbox's bound (8):
// the ninth is refused (EMFILE), and once one ends another starts.
func TestWatchBound(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	var chans []<-chan sandbox.WatchEvent
	var cancels []context.CancelFunc
	var err error
	for range 9 {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var ch <-chan sandbox.WatchEvent
		if ch, err = sb.Watch(cctx, ".", false); err != nil {
			break
		}
		chans, cancels = append(chans, ch), append(cancels, cancel)
	}
	if !errors.Is(err, syscall.EMFILE) || len(chans) != 8 {
		t.Fatalf("%d watches at once, then %v; want 8, then EMFILE", len(chans), err)
	}
	t.Logf("the ninth: %v", err)
	cancels[0]()
	closed(t, chans[0])
	sandboxtest.Eventually(t, time.Minute, func() (bool, string) {
		ch, err := sb.Watch(ctx, ".", false)
		if err != nil {
			return false, err.Error()
		}
		_ = ch
		return true, ""
	})
}

// TestWatchFlood has a command write 10,000 times a second for 2 s while
// the watch's reader reads nothing: the events kept are bounded (4,096,
// then one overflow), host memory stays flat, and once the reader reads
// again it gets new events.
func TestWatchFlood(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	wd := strings.TrimSpace(ftExec(t, sb, "pwd"))
	ftExec(t, sb, "mkdir flood")
	ch, err := sb.Watch(ctx, "flood", true)
	if err != nil {
		t.Fatal(err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// 20,000 writes to 100 files, paced at 10,000 a second.
	r := mustExec(t, sb, `cd flood && i=0; start=$(date +%s); while [ $i -lt 20000 ]; do echo x > f$((i % 100)); i=$((i+1));
if [ $((i % 10000)) = 0 ]; then while [ $(date +%s) -lt $((start + i / 10000)) ]; do :; done; fi; done; echo $i`)
	if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "20000" {
		t.Fatalf("flood: exit %d, %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("host heap grew by %d bytes during the flood", grew)
	if grew > 16<<20 {
		t.Errorf("host heap grew by %d bytes", grew)
	}
	// The reader reads again: at most 4,096 events, then one overflow.
	n := 0
	for {
		ev := recv(t, ch)
		if ev.Op == sandbox.WatchOverflow {
			break
		}
		n++
		if n > sandbox.MaxWatchQueue {
			t.Fatalf("%d events before an overflow; want at most %d", n, sandbox.MaxWatchQueue)
		}
	}
	t.Logf("%d events, then an overflow", n)
	if n != sandbox.MaxWatchQueue {
		t.Errorf("%d events kept before the overflow; want %d", n, sandbox.MaxWatchQueue)
	}
	ftExec(t, sb, "touch flood/after")
	for {
		ev := recv(t, ch)
		if ev.Path == path.Join(wd, "flood/after") {
			break
		}
		if !strings.HasPrefix(ev.Path, path.Join(wd, "flood")) {
			t.Fatalf("event %v outside the directory", ev)
		}
	}
}

// TestWatchClose closes the sandbox under a watch nobody reads: its
// channel closes (and, as every test's, no goroutine is left: TestMain
// checks).
func TestWatchClose(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	ch, err := sb.Watch(ctx, ".", true)
	if err != nil {
		t.Fatal(err)
	}
	ftExec(t, sb, "for i in 1 2 3 4 5; do echo $i > f$i; done")
	sandboxtest.Eventually(t, time.Minute, func() (bool, string) {
		return len(ch) == 0, "" // unbuffered: events wait in the library
	})
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	closed(t, ch)
	if _, err := sb.Watch(ctx, ".", true); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Watch after Close: %v; want ErrClosed", err)
	}
}

// BenchmarkWatchLatency measures the time from a write in the sandbox to
// its event on the host, beside Exec of `true` in the same sandbox: a
// command writes a file each time the benchmark reads a line of its stdin.
func BenchmarkWatchLatency(b *testing.B) {
	sb := newSandbox(b)
	ctx := testCtx(b)
	b.Run("exec-true", func(b *testing.B) {
		for b.Loop() {
			if _, err := sb.Exec(ctx, "true"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("event", func(b *testing.B) {
		wd := strings.TrimSpace(mustExec(b, sb, "mkdir -p bench && cd bench && pwd").Stdout)
		ch, err := sb.Watch(ctx, "bench", false)
		if err != nil {
			b.Fatal(err)
		}
		cmd := sb.Command(ctx, "sh", "-c", `cd bench && while read line; do echo x >> f; done`)
		in, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer cmd.Wait()
		defer in.Close()
		want := path.Join(wd, "f")
		for b.Loop() {
			if _, err := in.Write([]byte("\n")); err != nil {
				b.Fatal(err)
			}
			for {
				ev, ok := <-ch
				if !ok {
					b.Fatal("the watch ended")
				}
				if ev.Path == want && ev.Op == sandbox.WatchModify {
					break
				}
			}
		}
	})
}

// TestWatchGVisor watches under gVisor, whose kernel (the Sentry) has its
// own inotify: the same events, links not followed.
func TestWatchGVisor(t *testing.T) {
	testenv.NotOn(t, podmanGVisor, testenv.Podman...)
	t.Parallel()
	requireRunsc(t)
	sb := newSandbox(t, sandbox.WithRuntime("runsc"))
	ctx := testCtx(t)
	dir := strings.TrimSpace(ftExec(t, sb, "mkdir g && ln -s /etc g/etc && ln -s /tmp g/tmp && cd g && pwd"))
	ch, err := sb.Watch(ctx, "g", true)
	if err != nil {
		t.Fatal(err)
	}
	ftExec(t, sb, "cd g && echo a > f && mv f g && echo x > tmp/no && mkdir d && echo b > d/h && rm g")
	got := until(t, ch, path.Join(dir, "d"))
	sameEvents(t, "before d", got, evs(dir, "create f", "modify f", "rename g f"))
	// d's own content may come as the scan's creation or inotify's events.
	ftExec(t, sb, "touch g/end")
	t.Logf("then: %v", until(t, ch, path.Join(dir, "end")))
	if _, err := sb.Watch(ctx, "g/etc", true); !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("Watch of a link under gVisor: %v; want ELOOP", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	ch2, err := sb.Watch(cctx, ".", false)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	closed(t, ch2)
}
