package interp

import (
	"bytes"
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
