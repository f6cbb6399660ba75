//go:build linux

package main

import (
	"bytes"
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/wire"
)

func TestStatusFields(t *testing.T) {
	st := []byte("Name:\tx\\nGroups:\\t7\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t12\n" +
		"Uid:\t1000\t1000\t1000\t1000\nThreads:\t3\nGroups:\t1000 1900000003 \nNSpid:\t12\n")
	f := statusFields(st)
	if f.state != 'S' || f.threads != 3 || string(f.groups) != "\t1000 1900000003 " {
		t.Errorf("statusFields = %q, %d, %q", f.state, f.threads, f.groups)
	}
	if !anyGroup(f.groups, map[uint32]bool{1900000003: true}) || anyGroup(f.groups, map[uint32]bool{190000000: true, 7: true}) ||
		!anyGroup(f.groups, map[uint32]bool{5: true, 1000: true}) {
		t.Error("anyGroup matched wrongly")
	}
	// A forged line in the name (were the kernel not to escape it) comes
	// before the real one; the real one wins.
	forged := []byte("Name:\tx\nState:\tZ\nGroups:\t5\nState:\tR (running)\nGroups:\t1000\n")
	if f := statusFields(forged); f.state != 'R' || anyGroup(f.groups, map[uint32]bool{5: true}) {
		t.Errorf("forged lines won: %q, %q", f.state, f.groups)
	}
}

// A zombie is gone only when no thread of it is left: a leader that
// called exit(2) beside running threads shows Z and must still be killed.
func TestStatusGone(t *testing.T) {
	for _, c := range []struct {
		st   string
		gone bool
	}{
		{"State:\tZ (zombie)\nThreads:\t1\n", true},
		{"State:\tZ (zombie)\nThreads:\t2\n", false},
		{"State:\tS (sleeping)\nThreads:\t1\n", false},
		{"State:\tR (running)\nThreads:\t0\n", false},
	} {
		if got := statusFields([]byte(c.st)).gone(); got != c.gone {
			t.Errorf("%q: gone = %v, want %v", c.st, got, c.gone)
		}
	}
}

func TestWindow(t *testing.T) {
	w := newWindow(10)
	if n := w.take(4); n != 4 {
		t.Fatalf("take(4) = %d", n)
	}
	if n := w.take(100); n != 6 {
		t.Fatalf("take(100) = %d, want the 6 left", n)
	}
	done := make(chan int)
	go func() { done <- w.take(3) }()
	w.give(2)
	if n := <-done; n != 2 {
		t.Errorf("take after give(2) = %d", n)
	}
}

func TestLookPath(t *testing.T) {
	if p, err := lookPath("sh", []string{"PATH=/nonexistent:/bin:/usr/bin"}); err != nil || (p != "/bin/sh" && p != "/usr/bin/sh") {
		t.Errorf("lookPath(sh) = %q, %v", p, err)
	}
	if _, err := lookPath("no-such-program-x", []string{"PATH=/bin"}); err != errNotFound {
		t.Errorf("lookPath(missing) = %v, want errNotFound", err)
	}
	if _, err := lookPath("/etc/passwd", nil); err == nil {
		t.Error("lookPath(/etc/passwd) succeeded: not executable")
	}
}

// Stdin arriving in many tiny frames is all kept, in order.
func TestInbox(t *testing.T) {
	b := newInbox()
	go func() {
		for i := range 100000 {
			b.feed([]byte{byte(i)})
		}
		b.close()
	}()
	n := 0
	for {
		p, ok := b.next()
		if !ok {
			break
		}
		if p[0] != byte(n) {
			t.Fatalf("byte %d is %d", n, p[0])
		}
		n++
	}
	if n != 100000 {
		t.Errorf("%d bytes, want 100000", n)
	}
}

// recorder counts the writes it gets and keeps their bytes.
type recorder struct {
	mu     sync.Mutex
	writes int
	buf    bytes.Buffer
	block  chan struct{} // if not nil, each write waits for it
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.block != nil {
		<-r.block
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes++
	return r.buf.Write(p)
}

func (r *recorder) snapshot() (int, []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes, bytes.Clone(r.buf.Bytes())
}

// A short command's frames go out in one write when its last one (Exited)
// comes; order is kept; a lone lazy frame goes out too.
func TestBatcher(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as the agent runs
	r := &recorder{}
	w := wire.NewWriter(newBatcher(r))
	w.WriteJSON(wire.Started, 1, wire.Start{PID: 7})
	w.Write(wire.Stdout, 1, []byte("hi\n"))
	w.Write(wire.Stdout, 1, nil)
	w.Write(wire.Stderr, 1, nil)
	w.WriteJSON(wire.Exited, 1, wire.Exit{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The checks below tell a wait that ended unmet.
	_ = poll.Every(ctx, time.Millisecond, func() (bool, string) { n, _ := r.snapshot(); return n > 0, "" })
	n, data := r.snapshot()
	if n != 1 {
		t.Errorf("%d writes for one short command, want 1", n)
	}
	var kinds []wire.Kind
	for rd := bytes.NewReader(data); ; {
		f, err := wire.ReadFrame(rd)
		if err != nil {
			break
		}
		kinds = append(kinds, f.Kind)
	}
	if want := []wire.Kind{wire.Started, wire.Stdout, wire.Stdout, wire.Stderr, wire.Exited}; !slices.Equal(kinds, want) {
		t.Errorf("frames %v, want %v", kinds, want)
	}
	// A lone output frame goes out without waiting for another.
	w.Write(wire.Stdout, 2, []byte("later"))
	_ = poll.Every(ctx, 100*time.Microsecond, func() (bool, string) { n, _ := r.snapshot(); return n != 1, "" })
	if n, _ := r.snapshot(); n != 2 {
		t.Errorf("a lone output frame: %d writes in all, want 2", n)
	}
}

// A library that does not read holds the agent back: a writer waits while
// the write before is not taken, and goes on when it is.
func TestBatcherBackpressure(t *testing.T) {
	r := &recorder{block: make(chan struct{})}
	b := newBatcher(r)
	w := wire.NewWriter(b)
	done := make(chan struct{})
	go func() {
		chunk := make([]byte, wire.MaxData)
		for range 3 * batchSize / wire.MaxData {
			w.Write(wire.Stdout, 1, chunk)
		}
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("192 KiB written past a writer that takes nothing")
	case <-time.After(100 * time.Millisecond):
	}
	close(r.block)
	<-done
}
