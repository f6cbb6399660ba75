package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"sync"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	big := bytes.Repeat([]byte("x"), 2*MaxData+5)
	if err := w.Write(Stdout, 7, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(Stdout, 7, nil); err != nil { // end of stream marker
		t.Fatal(err)
	}
	if err := w.Write(Stdin, 1<<31, big); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteJSON(Exited, 3, Exit{Code: 137, Signal: 9, Killed: true}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteCount(Ack, 7, 123456); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		kind Kind
		ch   uint32
		n    int
	}{{Stdout, 7, 5}, {Stdout, 7, 0}, {Stdin, 1 << 31, MaxData}, {Stdin, 1 << 31, MaxData}, {Stdin, 1 << 31, 5}, {Exited, 3, -1}, {Ack, 7, 4}}
	var got []byte
	for i, wf := range want {
		f, err := ReadFrame(&buf)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Kind != wf.kind || f.Channel != wf.ch || (wf.n >= 0 && len(f.Data) != wf.n) {
			t.Errorf("frame %d: %v, want %v #%d (%d bytes)", i, f, wf.kind, wf.ch, wf.n)
		}
		if f.Kind == Stdin {
			got = append(got, f.Data...)
		}
		if f.Kind == Ack {
			if n, err := Count(f.Data); err != nil || n != 123456 {
				t.Errorf("Count = %d, %v", n, err)
			}
		}
	}
	if !bytes.Equal(got, big) {
		t.Errorf("split payload: %d bytes back of %d", len(got), len(big))
	}
	if _, err := ReadFrame(&buf); err != io.EOF {
		t.Errorf("after the last frame: %v, want io.EOF", err)
	}
}

// A hostile or corrupt stream cannot make the reader allocate more than
// MaxData, nor pass off a cut frame as whole.
func TestHostileFrames(t *testing.T) {
	h := make([]byte, HeaderSize)
	h[0] = byte(Stdout)
	binary.BigEndian.PutUint32(h[5:], 1<<31)
	if _, err := ReadFrame(bytes.NewReader(h)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("4 GiB length: %v, want ErrTooLarge", err)
	}
	binary.BigEndian.PutUint32(h[5:], 10)
	if _, err := ReadFrame(bytes.NewReader(append(h, "abc"...))); err != io.ErrUnexpectedEOF {
		t.Errorf("cut payload: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := ReadFrame(bytes.NewReader(h[:4])); err != io.ErrUnexpectedEOF {
		t.Errorf("cut header: %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := Count([]byte{1, 2}); err == nil {
		t.Error("Count of 2 bytes succeeded")
	}
}

// Frames written from many goroutines at once arrive whole.
func TestConcurrentWriters(t *testing.T) {
	pr, pw := io.Pipe()
	w := NewWriter(pw)
	var wg sync.WaitGroup
	for ch := range uint32(8) {
		wg.Go(func() {
			for range 50 {
				w.Write(Stdout, ch, bytes.Repeat([]byte{byte(ch)}, 1000+int(ch)))
			}
		})
	}
	go func() { wg.Wait(); pw.Close() }()
	n := 0
	for {
		f, err := ReadFrame(pr)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Data) != 1000+int(f.Channel) || f.Data[0] != byte(f.Channel) || f.Data[len(f.Data)-1] != byte(f.Channel) {
			t.Fatalf("mixed frame: %v", f)
		}
		n++
	}
	if n != 400 {
		t.Errorf("%d frames, want 400", n)
	}
}

// TestCaptureHeaderBound: the bound on a capture's headers grows with the
// contents bound, stays finite, and never overflows.
func TestCaptureHeaderBound(t *testing.T) {
	for _, c := range []struct{ contents, want int64 }{
		{0, 0},
		{-1, 0},
		{64 << 20, 64<<20 + 256<<20},
		{1 << 30, 64<<20 + 4<<30},
		{1 << 62, 1 << 60},
		{math.MaxInt64, 1 << 60},
	} {
		if got := CaptureHeaderBound(c.contents); got != c.want {
			t.Errorf("CaptureHeaderBound(%d) = %d, want %d", c.contents, got, c.want)
		}
	}
	// 60,000 links of 3 nested 250-byte directories (about 3.5 KiB of
	// headers each) fit the bound of a 64 MiB disk.
	if n := int64(60000 * 3584); n > CaptureHeaderBound(64<<20) {
		t.Errorf("60,000 long links (%d bytes of headers) over the bound of a 64 MiB disk", n)
	}
}

// The kinds are the protocol: their numbers never change.
func TestKindNumbers(t *testing.T) {
	for k, want := range map[Kind]uint8{Exec: 1, Accept: 10, Lease: 11, List: 14, UsageQuery: 15, Watch: 16,
		Started: 64, Done: 73, LeaseState: 74, Taken: 76, UsageState: 77, Events: 78} {
		if uint8(k) != want {
			t.Errorf("%v is %d, want %d", k, uint8(k), want)
		}
	}
	if Lease.String() != "lease" || LeaseState.String() != "lease-state" || Watch.String() != "watch" || UsageState.String() != "usage-state" {
		t.Errorf("names %q, %q, %q, %q", Lease, LeaseState, Watch, UsageState)
	}
}

func TestWatchRecord(t *testing.T) {
	b, ok := AppendWatchRecord(nil, WatchRename, []byte("/w/new"), []byte("/w/\xffold"))
	if !ok {
		t.Fatal("refused")
	}
	b, _ = AppendWatchRecord(b, WatchCreate, []byte("/w/a"), nil)
	op, p, from, rest, ok := ParseWatchRecord(b)
	if !ok || op != WatchRename || string(p) != "/w/new" || string(from) != "/w/\xffold" {
		t.Fatalf("%d %q %q %v", op, p, from, ok)
	}
	if op, p, from, rest, ok = ParseWatchRecord(rest); !ok || op != WatchCreate || string(p) != "/w/a" || len(from) != 0 || len(rest) != 0 {
		t.Fatalf("%d %q %q %q %v", op, p, from, rest, ok)
	}
	if _, ok := AppendWatchRecord(nil, WatchCreate, make([]byte, MaxWatchPath+1), nil); ok {
		t.Error("a path over MaxWatchPath accepted")
	}
	for _, bad := range [][]byte{{}, {WatchCreate, 0}, {0, 0, 0, 0, 0}, {WatchOverflow + 1, 0, 0, 0, 0}, {WatchCreate, 0, 2, 'a'}, {WatchCreate, 0xff, 0xff, 0, 0}} {
		if _, _, _, rest, ok := ParseWatchRecord(bad); ok || !bytes.Equal(rest, bad) {
			t.Errorf("ParseWatchRecord(%x) = ok %v", bad, ok)
		}
	}
}
