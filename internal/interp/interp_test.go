package interp

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// feed writes s to a Marker in chunks of n bytes and returns what it
// passed on.
func feed(nonce, s string, n int) (out string, m *Marker) {
	var b strings.Builder
	m = NewMarker(nonce, func(p []byte) { b.Write(p) })
	for len(s) > 0 {
		k := min(n, len(s))
		m.Write([]byte(s[:k]))
		s = s[k:]
	}
	return b.String(), m
}

func TestMarker(t *testing.T) {
	const nonce = "as00ff"
	for _, tc := range []struct {
		in, out, rest string
		status        int
		found         bool
	}{
		{"hello\n\nas00ff:0\n", "hello\n", "", 0, true},
		{"hello\nas00ff:17\nlate", "hello", "late", 17, true},
		{"\nas00ff:3\n", "", "", 3, true},
		{"no marker\nas00f", "no marker\nas00f", "", 0, false},
		{"fake\nas00fe:0\nreal\nas00ff:2\n", "fake\nas00fe:0\nreal", "", 2, true},
		{"\nas00ff:x\n\nas00ff:1\n", "\nas00ff:x\n", "", 1, true},
		{"\nas00ff:12345\n", "\nas00ff:12345\n", "", 0, false},
	} {
		for n := 1; n <= len(tc.in); n++ {
			out, m := feed(nonce, tc.in, n)
			status, found := m.Done()
			if !found {
				m.Flush()
				out2, _ := feed(nonce, tc.in, n)
				_ = out2
			}
			if found != tc.found || status != tc.status || string(m.Rest()) != tc.rest {
				t.Errorf("%q in chunks of %d: found %v status %d rest %q", tc.in, n, found, status, m.Rest())
			}
			if found && out != tc.out {
				t.Errorf("%q in chunks of %d: passed on %q, want %q", tc.in, n, out, tc.out)
			}
		}
	}
}

func TestMarkerFlush(t *testing.T) {
	var b strings.Builder
	m := NewMarker("as1", func(p []byte) { b.Write(p) })
	m.Write([]byte("tail\nas"))
	m.Flush()
	if b.String() != "tail\nas" {
		t.Errorf("flushed %q", b.String())
	}
}

func TestMarkerRestBounded(t *testing.T) {
	_, m := feed("as1", "\nas1:0\n", 64)
	for range 100 {
		m.Write(bytes.Repeat([]byte("z"), 4096))
	}
	if len(m.Rest()) != maxRest {
		t.Errorf("rest holds %d bytes", len(m.Rest()))
	}
}

// TestShellRun runs the generated script in the host's sh, with code that
// holds quotes, a heredoc, a line like the delimiter without its nonce and
// no final newline.
func TestShellRun(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	code := "x='it''s'; echo \"$x\"\ncat <<EOF\n__AGENTSANDBOX_\nEOF\nread v; echo \"read=$?\"\n(exit 4)"
	cmd := exec.Command(sh)
	cmd.Stdin = strings.NewReader(ShellRun(code, "asabc") + "echo after\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatal(err, stderr.String())
	}
	want := "its\n__AGENTSANDBOX_\nread=1\n\nasabc:4\nafter\n"
	if stdout.String() != want || stderr.String() != "\nasabc:4\n" {
		t.Errorf("stdout %q, stderr %q; want %q", stdout.String(), stderr.String(), want)
	}
}

func TestDecode(t *testing.T) {
	for _, line := range []string{
		`{"t":"ready","python":"3.11.2"}`,
		`{"t":"out","s":1,"b":"aGk="}`,
		`{"t":"display","data":{"text/plain":"1"}}`,
		`{"t":"done","error":{"name":"KeyError","value":"'a'","traceback":"..."}}`,
	} {
		if _, err := Decode([]byte(line)); err != nil {
			t.Errorf("Decode(%s): %v", line, err)
		}
	}
	for _, line := range []string{
		``, `{}`, `{"t":"out","s":3,"b":""}`, `{"t":"display","data":{}}`, `{"t":"boom"}`, `[1]`, `{"t":"out","s":1,"b":"!!"}`,
	} {
		if _, err := Decode([]byte(line)); err == nil {
			t.Errorf("Decode(%s) accepted", line)
		}
	}
	if m, _ := Decode([]byte(`{"t":"out","s":2,"b":"/wA="}`)); string(m.B) != "\xff\x00" {
		t.Errorf("bytes %q", m.B)
	}
}

func TestDecodeData(t *testing.T) {
	if b, err := DecodeData("image/png", "iVBORw=="); err != nil || string(b) != "\x89PNG" {
		t.Errorf("png: %v %v", b, err)
	}
	if _, err := DecodeData("image/png", "not base64"); err == nil {
		t.Error("bad base64 accepted")
	}
	if b, _ := DecodeData("text/html", "<b>"); string(b) != "<b>" {
		t.Errorf("html: %q", b)
	}
}

func TestValidMIME(t *testing.T) {
	for s, want := range map[string]bool{
		"text/plain": true, "image/svg+xml": true, "application/vnd.ms-excel": true, "a/b": true,
		"": false, "text": false, "/plain": false, "text/": false, "text/plain/x": false,
		"text/pl ain": false, "-x/y": false, "x/" + strings.Repeat("y", 127): true,
		"x/" + strings.Repeat("y", 128): false, "tëxt/plain": false, "text/plain\n": false,
	} {
		if got := ValidMIME(s); got != want {
			t.Errorf("ValidMIME(%q) = %v, want %v", s, got, want)
		}
	}
}

// Every byte kept counts: long MIME names are refused, names and the
// per-output overhead count against the bound, the count is capped, and
// what does not fit is dropped with Truncated set.
func TestOutputsBound(t *testing.T) {
	o := NewOutputs(1000)
	o.Add(map[string]string{strings.Repeat("x", 5<<20): ""})
	if len(o.List) != 0 || !o.Truncated {
		t.Fatalf("a 5 MiB MIME name: kept %d, truncated %v", len(o.List), o.Truncated)
	}
	o = NewOutputs(1000)
	o.Add(map[string]string{"text/plain": strings.Repeat("a", 1000-OutputOverhead-len("text/plain"))})
	if len(o.List) != 1 || o.Used() != 1000 || o.Truncated {
		t.Fatalf("exactly the bound: kept %d, used %d, truncated %v", len(o.List), o.Used(), o.Truncated)
	}
	o.Add(map[string]string{"a/b": ""})
	if len(o.List) != 1 || !o.Truncated {
		t.Fatalf("one more empty output past the bound: kept %d", len(o.List))
	}
	o = NewOutputs(-1)
	for range MaxOutputs + 10 {
		o.Add(map[string]string{"a/b": ""})
	}
	if len(o.List) != MaxOutputs || !o.Truncated {
		t.Fatalf("unbounded bytes: kept %d outputs, want %d", len(o.List), MaxOutputs)
	}
	o = NewOutputs(-1)
	o.Add(map[string]string{"image/png": "not base64!", "text/plain": "x", "text/html": "<b>"})
	if len(o.List) != 2 || o.List[0].MIME != "text/html" || o.List[1].MIME != "text/plain" || !o.Truncated {
		t.Fatalf("bad base64 dropped, rest richest first: %+v", o.List)
	}
}

// A line over the limit is reported, never held whole; lines around it
// arrive intact.
func TestReadLinesBound(t *testing.T) {
	in := "short\n" + strings.Repeat("z", 1<<20) + "\nlast\ncut"
	var got []string
	err := ReadLines(strings.NewReader(in), 1000, func(b []byte, tooBig bool) bool {
		if tooBig {
			got = append(got, "TOO BIG")
		} else {
			got = append(got, string(b))
		}
		return true
	})
	if err != nil || strings.Join(got, "|") != "short|TOO BIG|last" {
		t.Fatalf("lines %q, %v", got, err)
	}
}
