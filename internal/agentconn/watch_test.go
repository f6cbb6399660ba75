package agentconn

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

func startWatch(t *testing.T, ctx context.Context, c *Conn, f *fake, max int) (<-chan WatchRecord, uint32) {
	t.Helper()
	chs := make(chan uint32, 1)
	go func() {
		fr := f.next(t, wire.Watch)
		f.w.WriteJSON(wire.Started, fr.Channel, wire.Start{})
		chs <- fr.Channel
	}()
	out, err := Watch(c, ctx, wire.WatchRequest{Path: []byte("/w"), Recursive: true}, max, "/w", func(r WatchRecord) WatchRecord { return r })
	if err != nil {
		t.Fatal(err)
	}
	return out, <-chs
}

func records(n int, from int) []byte {
	var b []byte
	for i := range n {
		b, _ = wire.AppendWatchRecord(b, wire.WatchModify, fmt.Appendf(nil, "/w/f%d", from+i), nil)
	}
	return b
}

func drained(t *testing.T, out <-chan WatchRecord) []WatchRecord {
	t.Helper()
	var got []WatchRecord
	for {
		select {
		case r, ok := <-out:
			if !ok {
				return got
			}
			got = append(got, r)
		case <-time.After(10 * time.Second): // a hang guard
			t.Fatal("the channel did not close")
		}
	}
}

// TestWatchOverflow: a reader that does not read gets max events, then one
// overflow; later events are kept again once it has read.
func TestWatchOverflow(t *testing.T) {
	c, f := start(t, 5*time.Second)
	out, ch := startWatch(t, context.Background(), c, f, 10)
	f.w.Write(wire.Events, ch, records(25, 0))
	var got []WatchRecord
	for range 11 {
		got = append(got, <-out)
	}
	if got[9].Path != "/w/f9" || got[10] != (WatchRecord{Op: wire.WatchOverflow, Path: "/w"}) {
		t.Fatalf("got %v", got)
	}
	f.w.Write(wire.Events, ch, records(1, 100))
	f.w.Write(wire.Events, ch, nil) // the watch's end
	if rest := drained(t, out); len(rest) != 1 || rest[0].Path != "/w/f100" {
		t.Fatalf("after reading: %v", rest)
	}
}

// TestWatchForged: records that do not decode end the watch (a Kill), what
// came before delivered; a Failed answer is its errno.
func TestWatchForged(t *testing.T) {
	c, f := start(t, 5*time.Second)
	out, ch := startWatch(t, context.Background(), c, f, 100)
	good := records(2, 0)
	f.w.Write(wire.Events, ch, append(good, 9, 0, 1, 'x', 0, 0))
	f.next(t, wire.Kill)
	if got := drained(t, out); len(got) != 2 {
		t.Fatalf("got %v", got)
	}
	go func() {
		fr := f.next(t, wire.Watch)
		f.w.WriteJSON(wire.Failed, fr.Channel, wire.FileError{Errno: uint32(syscall.ELOOP), Path: []byte("/w"), Text: "loop"})
		fr = f.next(t, wire.Watch)
		f.w.Write(wire.Failed, fr.Channel, []byte("\xffnot json"))
	}()
	_, err := Watch(c, context.Background(), wire.WatchRequest{Path: []byte("/w")}, 10, "/w", func(r WatchRecord) WatchRecord { return r })
	if !errors.Is(err, syscall.ELOOP) {
		t.Errorf("Watch: %v; want ELOOP", err)
	}
	_, err = Watch(c, context.Background(), wire.WatchRequest{Path: []byte("/w")}, 10, "/w", func(r WatchRecord) WatchRecord { return r })
	if err == nil {
		t.Error("Watch answered by garbage: no error")
	}
}

// TestWatchCancel: the context's end sends Kill and closes the channel once
// the agent ended the watch; the stream's end closes it at once.
func TestWatchCancel(t *testing.T) {
	c, f := start(t, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	out, ch := startWatch(t, ctx, c, f, 100)
	f.w.Write(wire.Events, ch, records(3, 0))
	cancel()
	f.next(t, wire.Kill)
	f.w.Write(wire.Events, ch, records(3, 3)) // late: dropped
	f.w.Write(wire.Events, ch, nil)
	drained(t, out)
	out, _ = startWatch(t, context.Background(), c, f, 100)
	f.conn.Close()
	drained(t, out)
}
