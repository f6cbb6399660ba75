package supervisor

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/pkg/stdcopy"
)

// fake is a supervisor stand-in. Its Write (the library's request) answers
// through the multiplexed stream and, when sync is set, returns only after
// the Conn's reader has handled the answer: the reply is in before the
// requester can start waiting for it, the order a loaded host produces.
type fake struct {
	mu      sync.Mutex
	out     io.Writer // stdout frames into the Conn's reader
	pw      *io.PipeWriter
	handled chan string
	answer  func(req string) []string // reply lines; nil = no answer
	sync    bool
	writes  []string
}

func newFake(t *testing.T, answer func(string) []string, sync bool) (*fake, *Conn) {
	return newFakeTimeout(t, answer, sync, 30*time.Second)
}

func newFakeTimeout(t *testing.T, answer func(string) []string, sync bool, timeout time.Duration) (*fake, *Conn) {
	pr, pw := io.Pipe()
	f := &fake{out: stdcopy.NewStdWriter(pw, stdcopy.Stdout), pw: pw, answer: answer, sync: sync, handled: make(chan string, 100)}
	c := Start(f, pr, timeout)
	c.delivered = func(line string) { f.handled <- line }
	t.Cleanup(func() {
		c.Close()
		<-c.Done()
	})
	return f, c
}

func (f *fake) Write(p []byte) (int, error) {
	f.mu.Lock()
	req := strings.TrimSuffix(string(p), "\n")
	f.writes = append(f.writes, req)
	f.mu.Unlock()
	for _, line := range f.answer(req) {
		if _, err := io.WriteString(f.out, line+"\n"); err != nil {
			return 0, err
		}
		if f.sync && len(line) < maxLine { // longer lines are dropped unhandled
			<-f.handled
		}
	}
	return len(p), nil
}

func (f *fake) Close() error { return f.pw.Close() }

// echo answers like init.sh.
func echo(req string) []string {
	op, rest, _ := strings.Cut(req, " ")
	switch op {
	case "o":
		return []string{"o " + rest + " 3"}
	case "p":
		return []string{"p " + rest}
	case "k":
		pid, _, _ := strings.Cut(rest, " ")
		return []string{"k " + pid}
	}
	return nil
}

// TestReplyBeforeReceive is the readiness hang: the reply arrives and is
// handled before the requester waits for it. It must still be received.
func TestReplyBeforeReceive(t *testing.T) {
	_, c := newFake(t, echo, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 100; i++ {
		n, err := c.OOMKills(ctx)
		if err != nil || n != 3 {
			t.Fatalf("OOMKills #%d = %d, %v; want 3, nil", i, n, err)
		}
		if err := c.Ping(ctx); err != nil {
			t.Fatalf("Ping #%d: %v", i, err)
		}
		if err := c.Kill(ctx, 42, "M"); err != nil {
			t.Fatalf("Kill #%d: %v", i, err)
		}
	}
}

// TestStaleAndForgedLines: lines that are not the answer to the request in
// flight (an earlier request's late answer, junk, an overlong line) are
// ignored.
func TestStaleAndForgedLines(t *testing.T) {
	_, c := newFake(t, func(req string) []string {
		op, rest, _ := strings.Cut(req, " ")
		if op != "o" {
			return nil
		}
		return []string{"o 0 99", "o " + rest + "9 1", strings.Repeat("x", 1000), "junk", "o " + rest + " 7"}
	}, true)
	n, err := c.OOMKills(context.Background())
	if err != nil || n != 7 {
		t.Fatalf("OOMKills = %d, %v; want 7, nil", n, err)
	}
}

// TestNoAnswerBounded: a supervisor that never answers (a paused container)
// makes a request fail with ErrNoAnswer after the Conn's timeout even
// though the caller's context has no deadline; idempotent requests are
// resent within that bound.
func TestNoAnswerBounded(t *testing.T) {
	f, c := newFakeTimeout(t, func(string) []string { return nil }, false, 300*time.Millisecond)
	start := time.Now()
	_, err := c.OOMKills(context.Background())
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("OOMKills: %v; want ErrNoAnswer", err)
	}
	t.Logf("gave up after %v", time.Since(start))
	if err := c.Kill(context.Background(), 7, "M"); !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("Kill: %v; want ErrNoAnswer", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.writes) < 3 || f.writes[len(f.writes)-1][0] != 'k' || f.writes[len(f.writes)-2][0] != 'o' {
		t.Errorf("requests written: %q; want OOMKills resent, then one Kill", f.writes)
	}
}

// TestResendIdempotent: an idempotent request whose first copy got no
// answer is sent again with a new number, and the answer to the second
// copy is taken.
func TestResendIdempotent(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the resend interval")
	}
	first := true
	_, c := newFake(t, func(req string) []string {
		if first {
			first = false
			return nil
		}
		return echo(req)
	}, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if n, err := c.OOMKills(ctx); err != nil || n != 3 {
		t.Fatalf("OOMKills = %d, %v; want 3, nil", n, err)
	}
}

// TestGoneEndsWaits: when the stream ends, a waiting request returns
// ErrGone at once, and so do later ones.
func TestGoneEndsWaits(t *testing.T) {
	pr, pw := io.Pipe()
	c := Start(nopCloser{io.Discard}, pr, 30*time.Second)
	errc := make(chan error, 1)
	go func() { _, err := c.OOMKills(context.Background()); errc <- err }()
	pw.Close()
	if err := <-errc; !errors.Is(err, ErrGone) && !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("OOMKills: %v; want ErrGone", err)
	}
	<-c.Done()
	if err := c.Ping(context.Background()); !errors.Is(err, ErrGone) {
		t.Fatalf("Ping after end: %v; want ErrGone", err)
	}
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
