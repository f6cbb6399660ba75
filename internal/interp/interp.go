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
	"bufio"
	"bytes"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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
	ID     string            `json:"id"`   // out, display, done: the run it belongs to
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

// ValidMIME reports whether s is a media type name, "type/subtype", as
// RFC 6838 spells them: each part 1 to 127 of the characters
// A-Z a-z 0-9 ! # $ & - ^ _ . +, starting with a letter or digit.
func ValidMIME(s string) bool {
	typ, sub, ok := strings.Cut(s, "/")
	return ok && restrictedName(typ) && restrictedName(sub)
}

func restrictedName(s string) bool {
	if len(s) == 0 || len(s) > 127 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && strings.IndexByte("!#$&-^_.+", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// MaxOutputs is the most rich outputs one run keeps.
const MaxOutputs = 1000

// OutputOverhead is what each kept output costs against the bound besides
// its MIME type and data: the host's own record of it.
const OutputOverhead = 64

// Output is one rich output: data of one MIME type.
type Output struct {
	MIME string
	Data []byte
}

// Outputs collects one run's rich outputs within a bound: every byte the
// host keeps of them — MIME names, data, and OutputOverhead for each —
// counts, and no more than MaxOutputs are kept. What does not fit, and
// data that is not of a valid MIME type or not decodable, is dropped and
// sets Truncated.
type Outputs struct {
	List      []Output
	Truncated bool
	limit     int64 // < 0: no bound on bytes
	used      int64
}

// NewOutputs returns an empty collection that keeps at most limit bytes
// (no bound on bytes if limit < 0).
func NewOutputs(limit int64) *Outputs { return &Outputs{limit: limit} }

// Cost is what an output counts against the bound.
func Cost(o Output) int64 { return int64(len(o.MIME)+len(o.Data)) + OutputOverhead }

// Used returns how many bytes the kept outputs count.
func (o *Outputs) Used() int64 { return o.used }

// Add keeps the outputs of one display (MIME type to data, as the driver
// sends it), richest first.
func (o *Outputs) Add(data map[string]string) {
	start := len(o.List)
	for mime, d := range data {
		if !ValidMIME(mime) || len(o.List) >= MaxOutputs {
			o.Truncated = true
			continue
		}
		// Checked before decoding (with the most the data can decode to),
		// so that data over the bound is never copied.
		size := len(d)
		if Binary(mime) {
			size = base64.StdEncoding.DecodedLen(len(d))
		}
		if o.limit >= 0 && o.used+int64(len(mime)+size)+OutputOverhead > o.limit {
			o.Truncated = true
			continue
		}
		b, err := DecodeData(mime, d)
		if err != nil {
			o.Truncated = true
			continue
		}
		out := Output{MIME: mime, Data: b}
		o.used += Cost(out)
		o.List = append(o.List, out)
	}
	slices.SortFunc(o.List[start:], func(a, b Output) int {
		if d := MIMEOrder(a.MIME) - MIMEOrder(b.MIME); d != 0 {
			return d
		}
		return strings.Compare(a.MIME, b.MIME)
	})
}

// ReadLines calls line with each newline-terminated line of r, without
// its newline, until r ends or line returns false. A line longer than
// limit bytes is never held whole: line gets nil and tooBig instead, once
// it has ended. The slice passed is reused after line returns.
func ReadLines(r io.Reader, limit int, line func(b []byte, tooBig bool) bool) error {
	br := bufio.NewReaderSize(r, min(64<<10, limit+1))
	var buf []byte
	tooBig := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooBig {
			buf = append(buf, chunk...)
			if len(buf) > limit+1 { // +1: the newline
				tooBig, buf = true, nil
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		var b []byte
		if !tooBig {
			b = buf[:len(buf)-1]
		}
		if !line(b, tooBig) {
			return nil
		}
		buf, tooBig = buf[:0], false
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
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
