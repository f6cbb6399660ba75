package engine

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/docker/docker/pkg/stdcopy"
)

// muxed builds an attach stream with stdcopy's own writers.
func muxed(t *testing.T, parts ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	out := stdcopy.NewStdWriter(&buf, stdcopy.Stdout)
	errw := stdcopy.NewStdWriter(&buf, stdcopy.Stderr)
	for _, p := range parts {
		w := out
		if p[0] == "err" {
			w = errw
		}
		if _, err := w.Write([]byte(p[1])); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestDemux(t *testing.T) {
	stream := muxed(t, [2]string{"out", "hello "}, [2]string{"err", "warn1\n"}, [2]string{"out", "world"},
		[2]string{"err", "warn2\n"}, [2]string{"out", string(bytes.Repeat([]byte("x"), 100000))})
	var stderr bytes.Buffer
	// One byte per underlying read: every boundary is crossed.
	got, err := io.ReadAll(Demux(iotest.OneByteReader(bytes.NewReader(stream)), &stderr))
	if err != nil {
		t.Fatal(err)
	}
	want := "hello world" + string(bytes.Repeat([]byte("x"), 100000))
	if string(got) != want {
		t.Errorf("stdout: %d bytes, want %d", len(got), len(want))
	}
	if stderr.String() != "warn1\nwarn2\n" {
		t.Errorf("stderr: %q", stderr.String())
	}
}

func TestDemuxCut(t *testing.T) {
	stream := muxed(t, [2]string{"out", "hello world"})
	for _, cut := range []int{3, 8, 12} {
		_, err := io.ReadAll(Demux(bytes.NewReader(stream[:cut]), io.Discard))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("stream cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
	// A system error frame ends the stream with its message.
	sys := append([]byte{3, 0, 0, 0, 0, 0, 0, 4}, "boom"...)
	if _, err := io.ReadAll(Demux(bytes.NewReader(sys), io.Discard)); err == nil || err.Error() != "engine: attach stream: boom" {
		t.Errorf("system error frame: %v", err)
	}
}
