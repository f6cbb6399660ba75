package tools

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// truncateUTF8 returns the longest prefix of s of at most n bytes that does
// not split a UTF-8 sequence.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// splitLines splits text into lines without their "\n" terminators. A
// final "\n" ends the last line rather than starting an empty one, so ""
// has no lines and "a\n" has one.
func splitLines(text string) []string {
	if text == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(text, "\n"), "\n")
}

// isBinary reports whether data is not text: it holds a NUL byte or is not
// valid UTF-8.
func isBinary(data []byte) bool {
	return bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data)
}

// numbered renders lines[from-1:to] like `cat -n` (a 6-wide line number and
// a tab before each line), stopping before maxBytes of output or maxLines
// lines. It returns the text and the number of the last line shown; a
// single line longer than maxBytes is cut, with a note.
func numbered(lines []string, from, to, maxBytes, maxLines int) (string, int) {
	var b strings.Builder
	last := from - 1
	for n := from; n <= to; n++ {
		line := fmt.Sprintf("%6d\t%s\n", n, lines[n-1])
		if n > from && (b.Len()+len(line) > maxBytes || n-from >= maxLines) {
			break
		}
		if len(line) > maxBytes {
			cut := truncateUTF8(line, maxBytes)
			line = fmt.Sprintf("%s [... line %d cut: %d more bytes not shown]\n", cut, n, len(line)-1-len(cut))
		}
		b.WriteString(line)
		last = n
	}
	return b.String(), last
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of s.
func trimPartialRune(s string) string {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				return s[:i]
			}
			break
		}
	}
	return s
}

// headTail keeps the first and last bytes written to it, up to limit in
// all, and counts the rest. It is safe for concurrent use.
type headTail struct {
	mu    sync.Mutex
	limit int
	head  []byte
	tail  []byte // ring buffer of the last limit-limit/2 bytes after head
	pos   int    // next write position in tail once it is full
	total int64
}

func newHeadTail(limit int) *headTail {
	return &headTail{limit: max(limit, 2)}
}

func (h *headTail) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(p)
	h.total += int64(n)
	headCap := h.limit / 2
	if room := headCap - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	tailCap := h.limit - headCap
	if len(p) >= tailCap {
		h.tail = append(h.tail[:0], p[len(p)-tailCap:]...)
		h.pos = 0
		return n, nil
	}
	for len(p) > 0 {
		if len(h.tail) < tailCap {
			k := min(tailCap-len(h.tail), len(p))
			h.tail = append(h.tail, p[:k]...)
			p = p[k:]
			continue
		}
		k := copy(h.tail[h.pos:], p)
		h.pos = (h.pos + k) % tailCap
		p = p[k:]
	}
	return n, nil
}

// text returns what was kept. When bytes were dropped, the kept head ends
// and the tail starts at a line break where one is near, and a note in
// between says how much is missing.
func (h *headTail) text() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	tail := append(append([]byte{}, h.tail[h.pos:]...), h.tail[:h.pos]...)
	if h.total <= int64(len(h.head)+len(tail)) {
		return string(h.head) + string(tail)
	}
	head := string(h.head)
	if i := strings.LastIndexByte(head, '\n'); i >= len(head)/2 {
		head = head[:i+1]
	}
	head = trimPartialRune(head)
	t := string(tail)
	if i := strings.IndexByte(t, '\n'); i >= 0 && i < len(t)/2 {
		t = t[i+1:]
	}
	for len(t) > 0 && !utf8.RuneStart(t[0]) {
		t = t[1:]
	}
	omitted := h.total - int64(len(head)) - int64(len(t))
	if !strings.HasSuffix(head, "\n") && head != "" {
		head += "\n"
	}
	return fmt.Sprintf("%s[... %d bytes omitted: output truncated to %d bytes, the start and the end are shown ...]\n%s",
		head, omitted, h.limit, t)
}
