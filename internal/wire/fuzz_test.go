package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
	"testing/iotest"
)

// frameBytes encodes frames with Writer, for seeds.
func frameBytes(tb testing.TB, frames ...Frame) []byte {
	tb.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	for _, f := range frames {
		if err := w.Write(f.Kind, f.Channel, f.Data); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

// header is a frame header claiming n bytes of payload, for seeds.
func header(kind Kind, channel, n uint32) []byte {
	h := []byte{byte(kind), 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:5], channel)
	binary.BigEndian.PutUint32(h[5:9], n)
	return h
}

// FuzzReadFrame reads frames from arbitrary bytes, as the library does from
// the agent's stdout, until an error. It must not panic; every frame
// respects MaxData (so no read allocates more than MaxData, whatever the
// header claims); Writer re-encodes the frames read into exactly the bytes
// they came from; and the error says why the stream stopped: io.EOF only
// at a frame boundary, io.ErrUnexpectedEOF for a cut frame, ErrTooLarge
// for a header over MaxData.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{}, false)
	f.Add(frameBytes(f, Frame{Hello, 0, []byte(`{"Version":"2","PID":1}`)}, Frame{Stdout, 7, []byte("hi")},
		Frame{Stdout, 7, nil}, Frame{Exited, 7, []byte(`{"Code":0}`)}), false)
	f.Add(frameBytes(f, Frame{Stdout, 1, bytes.Repeat([]byte("x"), MaxData)}), true)
	f.Add(header(Stdout, 1, MaxData+1), false)
	f.Add(header(Stdout, 1, 1<<32-1), false)
	f.Add(append(header(Stderr, 3, 10), "short"...), true)
	f.Add(header(Done, 2, 0)[:5], false)
	f.Fuzz(func(t *testing.T, data []byte, oneByte bool) {
		var r io.Reader = bytes.NewReader(data)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		var again bytes.Buffer
		w := NewWriter(&again)
		var err error
		for {
			var fr Frame
			if fr, err = ReadFrame(r); err != nil {
				break
			}
			if len(fr.Data) > MaxData {
				t.Fatalf("frame %v: over MaxData", fr)
			}
			if err := w.Write(fr.Kind, fr.Channel, fr.Data); err != nil {
				t.Fatal(err)
			}
		}
		used := again.Bytes()
		if !bytes.HasPrefix(data, used) {
			t.Fatalf("frames re-encoded differ from the input they came from")
		}
		left := data[len(used):]
		switch {
		case err == io.EOF:
			if len(left) != 0 {
				t.Fatalf("io.EOF with %d bytes left", len(left))
			}
		case errors.Is(err, ErrTooLarge):
			if len(left) < HeaderSize || binary.BigEndian.Uint32(left[5:9]) <= MaxData {
				t.Fatalf("%v at %x", err, left[:min(len(left), HeaderSize)])
			}
		case err == io.ErrUnexpectedEOF:
			if len(left) == 0 {
				t.Fatal("io.ErrUnexpectedEOF at a frame boundary")
			}
			if len(left) >= HeaderSize && int(binary.BigEndian.Uint32(left[5:9])) <= len(left)-HeaderSize {
				t.Fatalf("io.ErrUnexpectedEOF with a whole frame left (%d bytes)", len(left))
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}
	})
}

// FuzzParseDirRecord parses a ReadDir listing as the library does. The
// encoding is fixed-width, so whatever ParseDirRecord accepts,
// AppendDirRecord re-encodes to the very bytes it was parsed from, and the
// rest is what follows; what it refuses is shorter than a whole record, and
// comes back whole as the rest.
func FuzzParseDirRecord(f *testing.F) {
	f.Add([]byte{})
	f.Add(AppendDirRecord(AppendDirRecord(nil, []byte("a.txt"), FileInfo{Mode: 0o644, Size: 5, Mtime: 1e18}),
		[]byte("\xff\x00odd"), FileInfo{Mode: uint32(1<<31 | 0o755), Size: -1, Mtime: -1}))
	f.Add(AppendDirRecord(nil, nil, FileInfo{}))
	f.Add(AppendDirRecord(nil, []byte("cut"), FileInfo{})[:DirRecordSize+1])
	f.Add(bytes.Repeat([]byte{0xff}, DirRecordSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			name, fi, rest, ok := ParseDirRecord(b)
			if !ok {
				if !bytes.Equal(rest, b) {
					t.Fatal("a refused record does not come back whole")
				}
				if len(b) >= DirRecordSize && len(b) >= DirRecordSize+int(binary.BigEndian.Uint16(b[20:22])) {
					t.Fatalf("whole record of %d bytes refused", len(b))
				}
				return
			}
			if len(rest) >= len(b) || !bytes.Equal(b[len(b)-len(rest):], rest) {
				t.Fatal("rest is not a proper suffix of the input")
			}
			if got := AppendDirRecord(nil, name, fi); !bytes.Equal(got, b[:len(b)-len(rest)]) {
				t.Fatalf("re-encoded record %x, parsed from %x", got, b[:len(b)-len(rest)])
			}
			b = rest
		}
	})
}

// FuzzCount decodes an Ack payload: exactly four bytes are a count, which
// WriteCount encodes back to the same payload; anything else is an error.
func FuzzCount(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Count(data)
		if (err == nil) != (len(data) == 4) {
			t.Fatalf("Count(%x) = %d, %v", data, n, err)
		}
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := NewWriter(&buf).WriteCount(Ack, 1, n); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes()[HeaderSize:], data) {
			t.Fatalf("Count(%x) = %d, encoded back as %x", data, n, buf.Bytes()[HeaderSize:])
		}
	})
}

// agentMessage returns a fresh value of the type the library decodes from
// the payload of a frame of kind from the agent (see
// internal/agentconn), or nil for kinds whose payload is not JSON.
func agentMessage(kind Kind) any {
	switch kind {
	case Hello:
		return new(Greeting)
	case Started:
		return new(Start)
	case Exited:
		return new(Exit)
	case Killed:
		return new(KillResult)
	case Done:
		return new(FileResult)
	case OOMCount:
		return new(int)
	case LeaseState:
		return new(LeaseInfo)
	}
	return nil
}

// FuzzAgentMessage decodes the JSON payloads the library takes from the
// agent (Greeting, Start, Exit, KillResult, FileResult with its FileError
// and FileInfo, the OOM count). Decoding must not panic, and what decodes
// is stable: encoding it and decoding that gives the same value (names of
// any bytes survive as []byte, not strings).
func FuzzAgentMessage(f *testing.F) {
	for _, s := range []struct {
		kind Kind
		data string
	}{
		{Hello, `{"Version":"2","PID":1}`},
		{Started, `{"PID":42,"Size":9223372036854775807}`},
		{Started, `{"Size":-1}`},
		{Exited, `{"Code":137,"Signal":9,"Killed":true}`},
		{Killed, `{"Processes":3,"Rounds":2}`},
		{Done, `{"Info":{"Mode":2147484141,"Size":4096,"Mtime":-1},"Bytes":0}`},
		{Done, `{"Err":{"Errno":2,"Path":"/w8=","Text":"no such file"},"Bytes":0}`},
		{Done, `{"Err":{"Code":"too-large","Text":"\ud800 \u0000"},"Bytes":1e3}`},
		{Done, `{"Err":null,"Info":null,"Bytes":-9223372036854775808}`},
		{OOMCount, `-1`},
		{OOMCount, `1e400`},
		{LeaseState, `{"Leased":true,"Lease":30000000000,"Left":29999999999}`},
		{LeaseState, `{"Leased":false,"Lease":-1,"Left":1e30}`},
		{Hello, `{"Version":"2","PID":1,"Lease":5000000000}`},
	} {
		f.Add(byte(s.kind), []byte(s.data))
	}
	f.Fuzz(func(t *testing.T, kind byte, data []byte) {
		v := agentMessage(Kind(kind))
		if v == nil {
			return
		}
		if err := json.Unmarshal(data, v); err != nil {
			return
		}
		enc, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%T %+v: %v", v, v, err)
		}
		again := agentMessage(Kind(kind))
		if err := json.Unmarshal(enc, again); err != nil {
			t.Fatalf("%T: %s does not decode: %v", v, enc, err)
		}
		if !reflect.DeepEqual(v, again) {
			t.Fatalf("%T: %+v decodes back as %+v", v, v, again)
		}
	})
}

// FuzzParseWatchRecord decodes Events payloads: every record parsed
// encodes back to the same bytes; a refused one comes back whole.
func FuzzParseWatchRecord(f *testing.F) {
	b, _ := AppendWatchRecord(nil, WatchRename, []byte("/w/b"), []byte("/w/a"))
	b, _ = AppendWatchRecord(b, WatchOverflow, []byte("/w"), nil)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{WatchCreate, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			op, p, from, rest, ok := ParseWatchRecord(b)
			if !ok {
				if !bytes.Equal(rest, b) {
					t.Fatal("a refused record does not come back whole")
				}
				return
			}
			if op < WatchCreate || op > WatchOverflow || len(p) > MaxWatchPath || len(from) > MaxWatchPath {
				t.Fatalf("accepted op %d, paths of %d and %d bytes", op, len(p), len(from))
			}
			got, ok := AppendWatchRecord(nil, op, p, from)
			if !ok || !bytes.Equal(got, b[:len(b)-len(rest)]) {
				t.Fatalf("re-encoded record %x, parsed from %x", got, b[:len(b)-len(rest)])
			}
			b = rest
		}
	})
}
