//go:build linux

package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/wire"
)

func TestRing(t *testing.T) {
	var r ring
	r.write([]byte("abc"))
	r.write(make([]byte, wire.RingSize-1))
	if b := r.bytes(); len(b) != wire.RingSize || r.dropped != 2 || b[0] != 'c' {
		t.Fatalf("ring: %d bytes, %d dropped, first %q", len(b), r.dropped, b[0])
	}
	r.write(make([]byte, 2*wire.RingSize+5))
	if b := r.bytes(); len(b) != wire.RingSize || r.dropped != 2+wire.RingSize+wire.RingSize+5 {
		t.Fatalf("ring after a large write: %d bytes, %d dropped", len(b), r.dropped)
	}
	// Small writes past the end wrap: the bytes come out in order.
	var w ring
	var want []byte
	for i := range 3*wire.RingSize/1000 + 7 {
		chunk := []byte(strings.Repeat(string(rune('a'+i%26)), 999) + "\n")
		w.write(chunk)
		want = append(want, chunk...)
	}
	if got := w.bytes(); string(got) != string(want[len(want)-wire.RingSize:]) || w.dropped != int64(len(want)-wire.RingSize) {
		t.Fatalf("ring after small writes: %d bytes kept, %d dropped; not the last of what was written", len(got), w.dropped)
	}
}

// Writing to a full ring costs what is written, not the ring's size.
func BenchmarkRingWrite(b *testing.B) {
	var r ring
	r.write(make([]byte, wire.RingSize))
	chunk := make([]byte, 100)
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		r.write(chunk)
	}
}

// A kept command outlives its session: its output is kept (bounded, the
// drop said), another session lists it, attaches, sends input, sees the
// exit; a third takes it over from the second.
func TestAttach(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	c1, uc1, _ := ta.session(t)
	const big = wire.RingSize + 1000
	dir := t.TempDir()
	p, err := c1.Exec(context.Background(), wire.ExecRequest{
		Args: []string{"sh", "-c", `echo first; while [ ! -e go ]; do sleep 0.01; done; head -c ` + itoa(big) + ` /dev/zero | tr '\0' x >&2; echo second; touch done; read -r l; echo "got $l"; read -r l; exit 7`},
		Dir:  dir, User: uidSpec(), Stdin: true, Keep: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	io.ReadFull(p.Stdout, buf) // "first\n": it runs
	uc1.Close()                // the session ends; the command runs on
	c2, _, _ := ta.session(t)
	var list []wire.Session
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		list, err = c2.List(context.Background())
		return err == nil && len(list) > 0 && list[0].ID == p.ID && !list[0].Attached, "not listed detached yet"
	})
	if !list[0].Running || list[0].Args[0] != "sh" || list[0].Terminal {
		t.Errorf("listed %+v", list[0])
	}
	os.WriteFile(filepath.Join(dir, "go"), nil, 0o644)
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := os.Stat(filepath.Join(dir, "done"))
		return err == nil, "the detached command has not written its output yet"
	})
	q, err := c2.Attach(context.Background(), p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	in := q.Stdin()
	io.WriteString(in, "one\n")
	var out lockedBuffer
	go io.Copy(&out, q.Stdout)
	errs := make(chan string, 1)
	go func() { b, _ := io.ReadAll(q.Stderr); errs <- string(b) }()
	// The line reached the command before the takeover (else the second
	// session's stdin, still in flight, is not the command's any more).
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(out.String(), "got one"), "the command has not read the second session's line yet"
	})
	// A third session takes it over.
	c3, _, _ := ta.session(t)
	r, err := c3.Attach(context.Background(), p.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Taken():
	case <-time.After(10 * time.Second):
		t.Fatal("the second session was not told of the takeover")
	}
	stderr := <-errs
	if !strings.HasPrefix(stderr, "[sandbox: ") || !strings.Contains(stderr, "dropped") || strings.Count(stderr[strings.Index(stderr, "\n")+1:], "x") != wire.RingSize {
		t.Errorf("stderr after the reattach: %d bytes, starting %q", len(stderr), stderr[:min(len(stderr), 120)])
	}
	io.WriteString(r.Stdin(), "two\n")
	rest, _ := io.ReadAll(r.Stdout)
	e, err := r.Wait(context.Background())
	if err != nil || e.Code != 7 {
		t.Errorf("exit after the takeover: %+v, %v", e, err)
	}
	if !strings.Contains(out.String()+string(rest), "got one") {
		t.Errorf("output: %q then %q", out.String(), rest)
	}
	// An ended command: attached again, its exit comes at once.
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		l, _ := c3.List(context.Background())
		return len(l) > 0 && !l[0].Running, "still running"
	})
	if _, err := c3.Attach(context.Background(), "c999999", false); err == nil {
		t.Error("attached to no command")
	}
}

// Forged Attach and List frames get clear answers, never a crash.
func TestAttachForged(t *testing.T) {
	var out lockedBuffer
	a := newAgent(&out, nil, &oomScore{})
	a.attach(5, []byte("nonsense"))
	a.attach(6, []byte(`{"ID":"c1"}`))
	a.attach(7, nil)
	a.list(8)
	r := strings.NewReader(out.String())
	for _, want := range []struct {
		kind wire.Kind
		ch   uint32
		text string
	}{{wire.Failed, 5, "bad attach request"}, {wire.Failed, 6, "no command"}, {wire.Failed, 7, "bad attach request"}, {wire.SessionList, 8, "[]"}} {
		f, err := wire.ReadFrame(r)
		if err != nil || f.Kind != want.kind || f.Channel != want.ch || !strings.Contains(string(f.Data), want.text) {
			t.Errorf("answer %v %q, %v; want %v #%d with %q", f, f.Data, err, want.kind, want.ch, want.text)
		}
	}
}
