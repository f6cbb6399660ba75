package interp

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzDecode: any line a sandbox's driver sends decodes or fails cleanly,
// and what decodes is valid.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"t":"ready","python":"3.11.2"}`, `{"t":"out","s":1,"b":"aGk="}`,
		`{"t":"display","data":{"image/png":"iVBORw==","text/plain":"x"}}`,
		`{"t":"done","error":{"name":"E","value":"v","traceback":"t"}}`, `{"t":"done","error":null}`,
		`{"t":"out","s":1e9}`, `{"t":`, "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := Decode(line)
		if err != nil {
			return
		}
		switch m.T {
		case "out":
			if m.S != 1 && m.S != 2 {
				t.Fatalf("stream %d accepted", m.S)
			}
		case "display":
			for mime, d := range m.Data {
				DecodeData(mime, d)
			}
		case "ready", "done":
		default:
			t.Fatalf("kind %q accepted", m.T)
		}
	})
}

// FuzzMarker: whatever a shell prints, the Marker passes on every byte
// before the marker exactly once, in order, holding back a bounded amount,
// whatever the chunking.
func FuzzMarker(f *testing.F) {
	f.Add([]byte("out\n\nasn0:0\nrest"), uint8(3))
	f.Add([]byte("\nasn0:\nasn0:12\n"), uint8(1))
	f.Add([]byte("\nasn\nasn0:9999\n"), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		n := int(chunk)%16 + 1
		var out bytes.Buffer
		m := NewMarker("asn0", func(p []byte) { out.Write(p) })
		for rest := data; len(rest) > 0; {
			k := min(n, len(rest))
			m.Write(rest[:k])
			rest = rest[k:]
			if _, found := m.Done(); !found && len(data)-len(rest)-out.Len() > len("\nasn0:")+maxStatus {
				t.Fatalf("holding back %d bytes", len(data)-len(rest)-out.Len())
			}
		}
		status, found := m.Done()
		if !found {
			m.Flush()
			if !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("no marker: passed on %q of %q", out.Bytes(), data)
			}
			return
		}
		if !bytes.HasPrefix(data, out.Bytes()) || status < 0 || status > 999 {
			t.Fatalf("passed on %q of %q, status %d", out.Bytes(), data, status)
		}
		if len(m.Rest()) > maxRest {
			t.Fatalf("rest %d bytes", len(m.Rest()))
		}
	})
}

// FuzzOutputs: whatever bytes a driver sends, the host keeps at most the
// bound of its rich outputs — every byte of MIME names and data, and the
// overhead of each output, counted — and at most MaxOutputs of them, and
// never holds a line longer than the line limit.
func FuzzOutputs(f *testing.F) {
	for _, s := range []string{
		`{"t":"display","id":"r","data":{"image/png":"iVBORw==","text/plain":"x"}}`,
		`{"t":"display","id":"r","data":{"` + strings.Repeat("x", 300) + `":""}}`,
		`{"t":"display","id":"r","data":{"text/plain":"` + strings.Repeat("y", 300) + `"}}` + "\n" + `{"t":"display","data":{"a/b":"","c/d":""}}`,
		`{"t":"display","id":"r","data":{"image/png":"!!!"}}`,
	} {
		f.Add([]byte(s+"\n"), uint16(256))
	}
	f.Fuzz(func(t *testing.T, stream []byte, limit uint16) {
		bound := int64(limit)
		o := NewOutputs(bound)
		lineLimit := int(bound)*2 + 64
		ReadLines(bytes.NewReader(stream), lineLimit, func(line []byte, tooBig bool) bool {
			if len(line) > lineLimit {
				t.Fatalf("a line of %d bytes over the limit %d", len(line), lineLimit)
			}
			if m, err := Decode(line); err == nil && m.T == "display" {
				o.Add(m.Data)
			}
			return true
		})
		var used int64
		for _, out := range o.List {
			if !ValidMIME(out.MIME) {
				t.Fatalf("kept an invalid MIME type %q", out.MIME)
			}
			used += Cost(out)
		}
		if used != o.Used() || used > bound || len(o.List) > MaxOutputs {
			t.Fatalf("kept %d outputs costing %d (counted %d), bound %d", len(o.List), used, o.Used(), bound)
		}
	})
}
