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
