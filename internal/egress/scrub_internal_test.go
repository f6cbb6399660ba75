package egress

import (
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// scrubAll runs body through a scrubWriter in writes cut at the given
// points and returns what reached the client.
func scrubAll(m *matcher, body string, cuts ...int) string {
	rec := httptest.NewRecorder()
	s := &scrubWriter{countWriter: &countWriter{ResponseWriter: rec, n: new(atomic.Int64)}, m: m}
	prev := 0
	for _, c := range append(cuts, len(body)) {
		s.Write([]byte(body[prev:c]))
		prev = c
	}
	s.flushTail()
	return rec.Body.String()
}

// Every form the matcher knows is redacted whatever the write boundaries:
// split once at every point, and split at every byte. The bytes held back
// never exceed the longest form.
func TestScrubWriterSplits(t *testing.T) {
	secret := `Bearer a/b+c=d&e<f>"g" sk-0123456789abcdef`
	m := newMatcher(secret)
	for _, v := range variants(secret) {
		body := "<<" + v + ">>"
		for k := 0; k <= len(body); k++ {
			if got := scrubAll(m, body, k); got != "<<[redacted]>>" {
				t.Fatalf("%q cut at %d: %q", v, k, got)
			}
		}
		var every []int
		for k := 1; k < len(body); k++ {
			every = append(every, k)
		}
		if got := scrubAll(m, body, every...); got != "<<[redacted]>>" {
			t.Fatalf("%q written a byte at a time: %q", v, got)
		}
		if got := scrubAll(m, strings.ToUpper(body)); got != "<<[redacted]>>" {
			t.Fatalf("%q upper-case: %q", v, got)
		}
	}
	rec := httptest.NewRecorder()
	s := &scrubWriter{countWriter: &countWriter{ResponseWriter: rec, n: new(atomic.Int64)}, m: m}
	for range 1000 {
		s.Write([]byte("0123456789abcdef-"))
		if len(s.tail) >= m.max {
			t.Fatalf("%d bytes held back, longest form %d", len(s.tail), m.max)
		}
	}
}

// A tiny secret's encoded forms are not looked for (they would match
// common text); the value itself always is.
func TestScrubTinySecret(t *testing.T) {
	m := newMatcher("abc")
	if got := scrubAll(m, "xABCx YWJj 616263 abcd"); got != "x[redacted]x YWJj 616263 [redacted]d" {
		t.Errorf("tiny secret: %q", got)
	}
	if got := scrubAll(newMatcher(""), "anything"); got != "anything" {
		t.Errorf("empty secret: %q", got)
	}
}
