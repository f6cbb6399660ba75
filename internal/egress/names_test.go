package egress_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/egress"
)

// isToken reports whether s can be a header field name (RFC 9110 token).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// nameEchoHandler puts each form of the secret that can be part of a field
// name into the names of a 103 Early Hints response's fields, of the final
// response's, and of announced and unannounced trailers.
func nameEchoHandler(forms map[string]string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Link", "</style.css>; rel=preload")
		for name, f := range forms {
			h.Set("X-Hint-"+f, name)
		}
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		var announced []string
		for name, f := range forms {
			h.Set("X-Echo-"+f, name)
			h.Set("X-"+f, name)
			announced = append(announced, "X-Trail-"+f)
		}
		announced = append(announced, "X-Trail-Plain")
		h.Set("Trailer", strings.Join(announced, ", "))
		h.Set("X-Plain", "kept")
		io.WriteString(w, "body ok")
		w.(http.Flusher).Flush()
		for name, f := range forms {
			h.Set("X-Trail-"+f, name)
			h.Set(http.TrailerPrefix+"X-Late-"+f, name)
		}
		h.Set("X-Trail-Plain", "kept")
	})
}

// The secret in a response field's name — of an informational 103
// response, the final response or a trailer, in any form the scrubber
// knows (verbatim, case-folded by canonicalisation, hex, base64...) — never
// reaches the client: such fields are dropped, and the rest pass.
func TestEgressScrubHeaderNames(t *testing.T) {
	secret := "sk-" + randomAlnum(t, 24)
	names, all, _ := secretForms(secret)
	forms := map[string]string{}
	for _, n := range names {
		if isToken(all[n]) {
			forms[n] = all[n]
		}
	}
	for _, want := range []string{"raw", "upper", "lower", "hex", "HEX", "base64.RawURL", "percent every byte"} {
		if _, ok := forms[want]; !ok {
			t.Fatalf("form %s (%q) is not a field name", want, all[want])
		}
	}
	up, upRoots := newUpstreamTLS(t, "api.test", nameEchoHandler(forms))
	port := portOf(t, up.Listener.Addr().String())
	ca, _ := egress.NewCA()
	h := startProxy(t, egress.Config{
		Policy:        policy(t, "api.test:"+port, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"api.test": {Header: "X-Key", Value: secret}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())

	// The raw bytes the client receives hold no form of the secret.
	c, br, resp := rawConnect(t, h.addr, "api.test:"+port, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "api.test"})
	if br.Buffered() != 0 {
		t.Fatal("bytes after the CONNECT answer")
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(tc, "GET / HTTP/1.1\r\nHost: api.test:"+port+"\r\nConnection: close\r\n\r\n")
	raw, err := io.ReadAll(tc)
	if err != nil {
		t.Fatalf("reading the response: %v (%q)", err, raw)
	}
	leaked := 0
	for name, f := range forms {
		if run := leaks(f, string(raw)); run != "" {
			leaked++
			t.Errorf("form %s (%q) reached the client: %q", name, f, run)
		}
	}
	if leaked > 0 {
		t.Logf("%d of %d forms leaked; raw response:\n%s", leaked, len(forms), raw)
	}
	for _, want := range []string{"HTTP/1.1 103 Early Hints\r\n", "Link: </style.css>; rel=preload\r\n", "X-Plain: kept\r\n", "body ok", "X-Trail-Plain: kept\r\n"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the response lacks %q:\n%s", want, raw)
		}
	}

	// A Go client sees the 103's Link, the final X-Plain and the plain
	// trailer, and nothing else from the upstream.
	var hints []textproto.MIMEHeader
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		hints = append(hints, h)
		return nil
	}})
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://api.test:"+port+"/", nil)
	r, err := h.client(t, roots).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(bufio.NewReader(r.Body))
	r.Body.Close()
	if string(body) != "body ok" || len(hints) != 1 || len(hints[0]) != 1 || hints[0].Get("Link") == "" {
		t.Errorf("body %q, 1xx headers %v", body, hints)
	}
	for k := range r.Header {
		if k != "X-Plain" && k != "Trailer" && k != "Date" && k != "Content-Type" {
			t.Errorf("response field %s", k)
		}
	}
	if len(r.Trailer) != 1 || r.Trailer.Get("X-Trail-Plain") != "kept" {
		t.Errorf("trailers %v, want X-Trail-Plain only", r.Trailer)
	}
}
