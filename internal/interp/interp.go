// Package interp holds what runs inside a sandbox for the library's
// interpreter sessions, and the host-side parsers of what those sessions
// send back: the Python driver (a stdlib-only program speaking JSON lines)
// and the framing of a persistent shell, whose runs end with a marker that
// carries a random nonce.
//
// Everything here parses bytes a sandbox controls: decoders are bounded and
// never panic (see the fuzz tests).
package interp

import (
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Driver is the Python driver's source, run with python3 -c.
//
//go:embed driver.py
var Driver string

// Message is one line the Python driver sends.
type Message struct {
	T      string            `json:"t"`    // ready, out, display, done
	S      int               `json:"s"`    // out: 1 stdout, 2 stderr
	B      []byte            `json:"b"`    // out: the bytes
	Data   map[string]string `json:"data"` // display: MIME type to data
	Error  *Error            `json:"error"`
	Python string            `json:"python"` // ready: the version
}

// Error is an exception a cell raised.
type Error struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Decode parses and checks one line of the driver's.
func Decode(line []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return Message{}, fmt.Errorf("interp: bad message: %w", err)
	}
	switch m.T {
	case "ready", "done":
	case "out":
		if m.S != 1 && m.S != 2 {
			return Message{}, fmt.Errorf("interp: output for stream %d", m.S)
		}
	case "display":
		if len(m.Data) == 0 {
			return Message{}, errors.New("interp: empty display")
		}
	default:
		return Message{}, fmt.Errorf("interp: unknown message %q", m.T)
	}
	return m, nil
}

// Binary reports whether the driver sends data of this MIME type in
// base64.
func Binary(mime string) bool {
	return mime == "image/png" || mime == "image/jpeg"
}

// DecodeData returns the bytes of a display's data of the given MIME type.
func DecodeData(mime, data string) ([]byte, error) {
	if !Binary(mime) {
		return []byte(data), nil
	}
	return base64.StdEncoding.DecodeString(data)
}

// MIMEOrder ranks MIME types for Outputs: richest first, text/plain last.
func MIMEOrder(mime string) int {
	for i, m := range []string{"image/png", "image/jpeg", "image/svg+xml", "text/html", "text/markdown", "text/latex", "application/json"} {
		if m == mime {
			return i
		}
	}
	if mime == "text/plain" {
		return 100
	}
	return 50
}

// ShellRun returns what to write to a persistent POSIX shell's input to
// run code with input from /dev/null and then print the end marker with
// the exit status on both output streams. nonce must be unguessable by the
// code (fresh random letters for each run); the code may contain anything,
// including lines that look like markers.
func ShellRun(code, nonce string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "__agentsandbox_code=$(cat <<'__AGENTSANDBOX_%s'\n", nonce)
	b.WriteString(code)
	if !strings.HasSuffix(code, "\n") {
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "__AGENTSANDBOX_%s\n)\n", nonce)
	b.WriteString("eval \"$__agentsandbox_code\" </dev/null\n")
	b.WriteString("__agentsandbox_rc=$?; unset __agentsandbox_code\n")
	fmt.Fprintf(&b, "printf '\\n%%s:%%s\\n' '%s' \"$__agentsandbox_rc\"; printf '\\n%%s:%%s\\n' '%s' \"$__agentsandbox_rc\" >&2\n", nonce, nonce)
	return b.String()
}

// maxStatus bounds the digits after a marker.
const maxStatus = 3

// maxRest bounds the bytes a Marker keeps after the marker.
const maxRest = 64 << 10

// Marker finds a shell run's end marker, "\n" nonce ":" status "\n", in
// one output stream and passes the bytes before it on. Write it the
// stream's bytes as they come; it holds back only what could be the start
// of the marker.
type Marker struct {
	prefix []byte
	held   []byte
	found  bool
	status int
	rest   []byte // bytes after the marker
	out    func([]byte)
}

// NewMarker returns a Marker for nonce that passes output to out.
func NewMarker(nonce string, out func([]byte)) *Marker {
	return &Marker{prefix: []byte("\n" + nonce + ":"), out: out}
}

// Write takes the next bytes of the stream. Bytes after the marker are
// kept (Rest), not passed on.
func (m *Marker) Write(p []byte) (int, error) {
	if m.found {
		m.keepRest(p)
		return len(p), nil
	}
	buf := append(m.held, p...)
	m.held = nil
	for start := 0; ; {
		i := bytes.Index(buf[start:], m.prefix)
		if i < 0 {
			break
		}
		i += start
		tail := buf[i+len(m.prefix):]
		j := bytes.IndexByte(tail, '\n')
		if j < 0 && len(tail) <= maxStatus && digits(tail) {
			// Perhaps the marker, cut: wait for the rest.
			m.emit(buf[:i])
			m.held = append([]byte(nil), buf[i:]...)
			return len(p), nil
		}
		if j > 0 && j <= maxStatus && digits(tail[:j]) {
			m.status, _ = strconv.Atoi(string(tail[:j]))
			m.emit(buf[:i])
			m.found = true
			m.keepRest(tail[j+1:])
			return len(p), nil
		}
		// Not a marker (the nonce is secret, so only a bug or chance
		// could do this): it is output.
		start = i + 1
	}
	keep := 0
	for k := min(len(m.prefix)-1, len(buf)); k > 0; k-- {
		if bytes.HasPrefix(m.prefix, buf[len(buf)-k:]) {
			keep = k
			break
		}
	}
	m.emit(buf[:len(buf)-keep])
	m.held = append([]byte(nil), buf[len(buf)-keep:]...)
	return len(p), nil
}

// digits reports whether b is ASCII digits only.
func digits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (m *Marker) keepRest(b []byte) {
	m.rest = append(m.rest, b[:min(len(b), maxRest-len(m.rest))]...)
}

func (m *Marker) emit(b []byte) {
	if len(b) > 0 {
		m.out(b)
	}
}

// Done reports whether the marker was seen, and the status it carried.
func (m *Marker) Done() (status int, ok bool) { return m.status, m.found }

// Rest returns the bytes that came after the marker (output of background
// processes, for the next run), at most 64 KiB.
func (m *Marker) Rest() []byte { return m.rest }

// Flush passes on what is held back (the stream ended without a marker).
func (m *Marker) Flush() {
	if !m.found {
		m.emit(m.held)
		m.held = nil
	}
}
