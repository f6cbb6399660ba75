package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/docker/docker/pkg/stdcopy"
)

// frame is one frame of an attach stream, for seeds.
func frame(stream byte, payload string) []byte {
	h := []byte{stream, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[4:], uint32(len(payload)))
	return append(h, payload...)
}

// demuxModel is what Demux should make of stream, written the simplest
// way: the standard output and error it carries, and how it ends ("" for
// a clean end, "cut" for a stream cut inside a frame, or the message of a
// system error frame).
func demuxModel(stream []byte) (stdout, stderr []byte, end string) {
	for len(stream) > 0 {
		if len(stream) < 8 {
			return stdout, stderr, "cut"
		}
		kind, n := stream[0], int64(binary.BigEndian.Uint32(stream[4:8]))
		stream = stream[8:]
		if kind == 3 {
			n = min(n, maxSystemErr)
		}
		payload := stream[:min(int64(len(stream)), n)]
		stream = stream[len(payload):]
		switch kind {
		case 1:
			stdout = append(stdout, payload...)
		case 2:
			stderr = append(stderr, payload...)
		}
		if int64(len(payload)) < n {
			return stdout, stderr, "cut"
		}
		if kind == 3 {
			return stdout, stderr, "engine: attach stream: " + string(payload)
		}
	}
	return stdout, stderr, ""
}

// FuzzDemux reads arbitrary bytes as an attach stream through Demux, with
// the source giving one byte per read or all it has and the caller reading
// with buffers of any size, and compares what comes out with demuxModel:
// the same standard output and error, and the same end (clean, cut:
// io.ErrUnexpectedEOF, or a system error). Where the stream is made only
// of whole stdout and stderr frames (what the engine sends), stdcopy's
// StdCopy must agree too.
func FuzzDemux(f *testing.F) {
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add([]byte{}, false, uint16(0))
	f.Add(cat(frame(1, "hello "), frame(2, "warn\n"), frame(1, "world"), frame(1, "")), false, uint16(3))
	f.Add(cat(frame(1, "out"), frame(2, "err"), frame(1, string(make([]byte, 5000)))), true, uint16(4096))
	f.Add(cat(frame(1, "x"), frame(3, "boom"), frame(1, "after")), false, uint16(1))
	f.Add(cat(frame(0, "stdin?"), frame(7, "unknown"), frame(1, "ok")), false, uint16(0))
	f.Add(frame(1, "cut here")[:12], true, uint16(2))
	f.Add(frame(2, "cut here")[:12], false, uint16(2))
	f.Add(frame(3, "cut here")[:12], false, uint16(2))
	f.Add(frame(1, "x")[:5], false, uint16(2))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'a'}, false, uint16(0))
	f.Add([]byte{3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 'a'}, false, uint16(0))
	f.Fuzz(func(t *testing.T, stream []byte, oneByte bool, bufSize uint16) {
		var src io.Reader = bytes.NewReader(stream)
		if oneByte {
			src = iotest.OneByteReader(src)
		}
		var stderr bytes.Buffer
		d := Demux(src, &stderr)
		var stdout []byte
		var err error
		if bufSize == 0 {
			stdout, err = io.ReadAll(d)
		} else {
			buf := make([]byte, bufSize)
			for reads := 0; ; reads++ {
				if reads > len(stream)+1 {
					t.Fatalf("%d reads of a stream of %d bytes, and no end", reads, len(stream))
				}
				var n int
				n, err = d.Read(buf)
				stdout = append(stdout, buf[:n]...)
				if err != nil {
					break
				}
			}
			if err == io.EOF {
				err = nil
			}
		}
		wantOut, wantErr, end := demuxModel(stream)
		if !bytes.Equal(stdout, wantOut) {
			t.Errorf("stdout %q, want %q", stdout, wantOut)
		}
		if !bytes.Equal(stderr.Bytes(), wantErr) {
			t.Errorf("stderr %q, want %q", stderr.Bytes(), wantErr)
		}
		switch end {
		case "":
			if err != nil {
				t.Errorf("clean end: %v", err)
			}
		case "cut":
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("cut stream: %v, want io.ErrUnexpectedEOF", err)
			}
		default:
			if err == nil || err.Error() != end {
				t.Errorf("system error frame: %v, want %q", err, end)
			}
		}

		if end == "" && onlyOutput(stream) {
			var out, errb bytes.Buffer
			if _, err := stdcopy.StdCopy(&out, &errb, bytes.NewReader(stream)); err != nil {
				t.Fatalf("StdCopy: %v", err)
			}
			if !bytes.Equal(out.Bytes(), wantOut) || !bytes.Equal(errb.Bytes(), wantErr) {
				t.Errorf("StdCopy: stdout %q, stderr %q; Demux: %q, %q", out.Bytes(), errb.Bytes(), wantOut, wantErr)
			}
		}
	})
}

// onlyOutput reports whether the whole stream is stdout and stderr frames
// with the engine's three zero bytes.
func onlyOutput(stream []byte) bool {
	for len(stream) > 0 {
		if len(stream) < 8 || (stream[0] != 1 && stream[0] != 2) || stream[1]|stream[2]|stream[3] != 0 {
			return false
		}
		n := int(binary.BigEndian.Uint32(stream[4:8]))
		if n > len(stream)-8 {
			return false
		}
		stream = stream[8+n:]
	}
	return true
}
