package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// minVariant is the shortest encoded form of a secret the scrubber looks
// for: shorter ones (the encodings of a tiny secret) would redact common
// text. The secret's own bytes are always looked for.
const minVariant = 8

var redacted = []byte("[redacted]")

// matcher finds a secret and its encoded forms in a stream, ignoring ASCII
// case:
//   - the value itself;
//   - hex;
//   - base64, standard and URL alphabets, padded or not, also when the
//     secret sits at any byte offset inside a larger encoded blob: for each
//     of the three alignments, the run of characters that depend only on
//     the secret's bits (the one or two characters at either end that mix
//     in neighbouring bits are not part of it), and that run URL-escaped;
//   - URL encoding: url.QueryEscape, url.PathEscape and every byte
//     percent-encoded;
//   - JSON and JavaScript string escapes: encoding/json with and without
//     HTML escaping, with "\/" for "/", and with "\u00XX" for every ASCII
//     byte other than a letter or digit.
//
// It cannot find a secret the upstream transforms otherwise: encrypted,
// hashed, reversed, compressed, split by line breaks (MIME base64),
// partially escaped in a way none of the above produces, or nested
// encodings (base64 of the hex, ...).
type matcher struct {
	pats  [][]byte   // lower-case, longest first
	first [256][]int // indexes into pats by lower-case first byte
	max   int
}

func newMatcher(secret string) *matcher {
	m := &matcher{}
	seen := map[string]bool{}
	for i, v := range variants(secret) {
		v = strings.ToLower(v)
		if v == "" || seen[v] || i > 0 && len(v) < minVariant {
			continue
		}
		seen[v] = true
		m.pats = append(m.pats, []byte(v))
	}
	slices.SortStableFunc(m.pats, func(a, b []byte) int { return len(b) - len(a) })
	for i, p := range m.pats {
		m.first[p[0]] = append(m.first[p[0]], i)
		m.max = max(m.max, len(p))
	}
	return m
}

// variants returns the forms of secret the matcher looks for, the value
// itself first.
func variants(secret string) []string {
	s := []byte(secret)
	vs := []string{secret, hex.EncodeToString(s), url.QueryEscape(secret), url.PathEscape(secret)}
	var pct, js strings.Builder
	for _, c := range s {
		fmt.Fprintf(&pct, "%%%02X", c)
		if c < 0x80 && !isAlnum(c) {
			fmt.Fprintf(&js, `\u%04x`, c)
		} else {
			js.WriteByte(c)
		}
	}
	vs = append(vs, pct.String(), js.String())
	for _, html := range []bool{true, false} {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(html)
		enc.Encode(secret)
		q := strings.TrimSuffix(b.String(), "\n")
		q = q[1 : len(q)-1] // the quotes
		vs = append(vs, q, strings.ReplaceAll(q, "/", `\/`))
	}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for k := range 3 {
			core := base64Core(enc, s, k)
			vs = append(vs, core, url.QueryEscape(core))
		}
	}
	return vs
}

// base64Core returns the base64 characters that depend only on s when s
// follows k bytes (mod 3) in the encoded data: character i holds bits
// [6i, 6i+6), and s holds bits [8k, 8k+8len(s)).
func base64Core(enc *base64.Encoding, s []byte, k int) string {
	buf := make([]byte, k+len(s))
	copy(buf[k:], s)
	e := enc.EncodeToString(buf)
	from, to := (8*k+5)/6, 8*(k+len(s))/6
	if to <= from {
		return ""
	}
	return e[from:to]
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// matchAt returns the length of the longest pattern at the start of b, or 0.
func (m *matcher) matchAt(b []byte) int {
	for _, i := range m.first[lower(b[0])] {
		p := m.pats[i]
		if len(b) < len(p) {
			continue
		}
		ok := true
		for j := 1; j < len(p); j++ {
			if lower(b[j]) != p[j] {
				ok = false
				break
			}
		}
		if ok {
			return len(p)
		}
	}
	return 0
}

// scrub appends src to dst with every match replaced by "[redacted]" and
// returns it. Unless final, it stops where a match could run past the end
// of src and returns the rest (at most max-1 bytes), to be scrubbed with
// what follows.
func (m *matcher) scrub(dst, src []byte, final bool) (out, rest []byte) {
	start, i := 0, 0
	for i < len(src) {
		if !final && len(src)-i < m.max {
			break
		}
		if l := m.matchAt(src[i:]); l > 0 {
			dst = append(dst, src[start:i]...)
			dst = append(dst, redacted...)
			i += l
			start = i
			continue
		}
		i++
	}
	return append(dst, src[start:i]...), src[i:]
}

func (m *matcher) scrubString(s string) string {
	out, _ := m.scrub(nil, []byte(s), true)
	return string(out)
}

// contains reports whether s holds a match.
func (m *matcher) contains(s string) bool {
	b := []byte(s)
	for i := range b {
		if m.matchAt(b[i:]) > 0 {
			return true
		}
	}
	return false
}

// scrubWriter removes the credential's value and its encodings (see
// matcher) from response headers (names and values, informational 1xx
// responses included), body and trailers, so an upstream that
// echoes requests back cannot hand the secret to the sandbox. It streams:
// it holds back only the longest form's length minus one byte, so a copy
// split across writes is caught.
type scrubWriter struct {
	*countWriter
	m         *matcher
	tail, buf []byte
	out       []byte
	wrote     bool
	drop      bool // the body is encoded and cannot be scrubbed
}

func (s *scrubWriter) WriteHeader(code int) {
	if s.wrote {
		return
	}
	if code < 200 { // informational (103 Early Hints): more headers follow
		s.scrubHeader()
		s.countWriter.ResponseWriter.WriteHeader(code)
		return
	}
	s.scrubHeaders()
	if s.drop {
		code = http.StatusBadGateway
	}
	s.countWriter.ResponseWriter.WriteHeader(code)
	if s.drop {
		s.countWriter.Write([]byte(encodedMsg))
	}
}

const encodedMsg = "agentsandbox proxy: the upstream sent an encoded (compressed) response, which cannot be checked for the credential\n"

func (s *scrubWriter) scrubHeaders() {
	if s.wrote {
		return
	}
	s.wrote = true
	h := s.countWriter.Header()
	h.Del("Content-Length") // the body may change length
	// The transport decompresses gzip it asked for; any other encoding
	// would hide the secret from the scrubber.
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		s.drop = true
		clear(h)
		h.Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	s.scrubHeader()
}

// scrubHeader scrubs the header map about to be sent: the head of an
// informational or final response, or the trailers after the body. A field
// whose name holds the secret in any form the matcher knows is dropped (a
// name cannot say "[redacted]": '[' is not allowed in a field name), and so
// is such a name in the Trailer field's list; values are scrubbed.
func (s *scrubWriter) scrubHeader() {
	h := s.countWriter.Header()
	for k, vs := range h {
		if s.m.contains(k) {
			delete(h, k)
			continue
		}
		if http.CanonicalHeaderKey(k) == "Trailer" {
			vs = s.trailerNames(vs)
			if len(vs) == 0 {
				delete(h, k)
				continue
			}
			h[k] = vs
		}
		for i, v := range vs {
			vs[i] = s.m.scrubString(v)
		}
	}
}

// trailerNames returns the Trailer field's values without the names that
// hold the secret.
func (s *scrubWriter) trailerNames(vs []string) []string {
	var out []string
	for _, v := range vs {
		var keep []string
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" && !s.m.contains(name) {
				keep = append(keep, name)
			}
		}
		if len(keep) > 0 {
			out = append(out, strings.Join(keep, ", "))
		}
	}
	return out
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	if s.drop {
		return len(p), nil
	}
	s.buf = append(append(s.buf[:0], s.tail...), p...)
	var rest []byte
	s.out, rest = s.m.scrub(s.out[:0], s.buf, false)
	s.tail = append(s.tail[:0], rest...)
	if _, err := s.countWriter.Write(s.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *scrubWriter) flushTail() {
	if len(s.tail) > 0 && !s.drop {
		out, _ := s.m.scrub(nil, s.tail, true)
		s.countWriter.Write(out)
		s.tail = nil
	}
}
