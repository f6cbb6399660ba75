package egress_test

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/internal/egress"
)

// secretForms returns the forms of secret an upstream might echo, computed
// with the standard library, by name.
func secretForms(secret string) (names []string, forms, core map[string]string) {
	s := []byte(secret)
	forms, core = map[string]string{}, map[string]string{}
	add := func(name, v string) {
		names = append(names, name)
		forms[name], core[name] = v, v
	}
	add("raw", secret)
	add("upper", strings.ToUpper(secret))
	add("lower", strings.ToLower(secret))
	add("hex", hex.EncodeToString(s))
	add("HEX", strings.ToUpper(hex.EncodeToString(s)))
	add("base64.Std", base64.StdEncoding.EncodeToString(s))
	add("base64.RawStd", base64.RawStdEncoding.EncodeToString(s))
	add("base64.URL", base64.URLEncoding.EncodeToString(s))
	add("base64.RawURL", base64.RawURLEncoding.EncodeToString(s))
	add("query-escaped base64", url.QueryEscape(base64.StdEncoding.EncodeToString(s)))
	// The secret at each offset inside a larger encoded blob.
	// The characters from the secret's bits alone are the ones that must
	// not leak (core); the one or two at either end mix in other bits.
	for k := range 3 {
		from, to := (8*k+5)/6, 8*(k+len(s))/6
		blob := append(append([]byte("xyz"[:k]), s...), "tail"...)
		e := base64.StdEncoding.EncodeToString(blob)
		add(fmt.Sprintf("base64.Std blob+%d", k), e)
		core[fmt.Sprintf("base64.Std blob+%d", k)] = e[from:to]
		e = base64.RawURLEncoding.EncodeToString(append([]byte("\xff\xfe"[:k]), s...))
		add(fmt.Sprintf("base64.RawURL blob+%d", k), e)
		core[fmt.Sprintf("base64.RawURL blob+%d", k)] = e[from:to]
	}
	add("QueryEscape", url.QueryEscape(secret))
	add("PathEscape", url.PathEscape(secret))
	var pct, pctLower, uni, uniUpper strings.Builder
	for _, c := range s {
		fmt.Fprintf(&pct, "%%%02X", c)
		fmt.Fprintf(&pctLower, "%%%02x", c)
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			uni.WriteByte(c)
			uniUpper.WriteByte(c)
		} else {
			fmt.Fprintf(&uni, `\u%04x`, c)
			fmt.Fprintf(&uniUpper, `\u%04X`, c)
		}
	}
	add("percent every byte", pct.String())
	add("percent every byte, lower-case", pctLower.String())
	add("QueryEscape, lower-case escapes", strings.ReplaceAll(url.QueryEscape(secret), "%2F", "%2f"))
	j, _ := json.Marshal(secret)
	add("json", string(j))
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(secret)
	add("json, no HTML escaping", strings.TrimSpace(b.String()))
	add(`json, \/`, strings.ReplaceAll(strings.TrimSpace(b.String()), "/", `\/`))
	add(`\u00xx`, uni.String())
	add(`\u00XX`, uniUpper.String())
	return names, forms, core
}

// leaks reports an 8-byte run of form found in got, ignoring case.
func leaks(form, got string) string {
	lg := strings.ToLower(got)
	lf := strings.ToLower(form)
	for i := 0; i+8 <= len(lf); i++ {
		if strings.Contains(lg, lf[i:i+8]) {
			return form[i : i+8]
		}
	}
	return ""
}

// The scrubber removes the secret in every form an echoing upstream might
// send it — raw, case-changed, base64 (also inside a larger blob), hex,
// URL- and JSON-escaped — from headers, body and trailers, with the body
// split at each point.
func TestEgressScrubForms(t *testing.T) {
	secret := "Bearer sk/" + strconv.FormatInt(int64(len(t.Name())), 10) + "A+b&c<d>e=\"f\"?g h~" + randomAlnum(t, 16)
	names, forms, core := secretForms(secret)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		form := forms[r.URL.Query().Get("form")]
		body := "before:" + form + ":after"
		w.Header().Set("X-Echo", "h "+form+" h")
		w.Header().Set("Trailer", "X-Trail")
		switch split := r.URL.Query().Get("split"); split {
		case "bytes": // one byte per write
			for i := range len(body) {
				io.WriteString(w, body[i:i+1])
				w.(http.Flusher).Flush()
			}
		default:
			k, _ := strconv.Atoi(split)
			io.WriteString(w, body[:k])
			w.(http.Flusher).Flush()
			io.WriteString(w, body[k:])
		}
		w.Header().Set("X-Trail", "t "+form+" t")
	})
	up, upRoots := newUpstreamTLS(t, "api.test", handler)
	port := portOf(t, up.Listener.Addr().String())
	ca, _ := egress.NewCA()
	h := startProxy(t, egress.Config{
		Policy:        policy(t, "api.test:"+port, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"api.test": {Header: "Authorization", Value: secret}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c := h.client(t, roots)
	requests := 0
	for _, name := range names {
		form := forms[name]
		body := "before:" + form + ":after"
		splits := []string{"bytes"}
		for k := 0; k <= len(body); k++ {
			splits = append(splits, strconv.Itoa(k))
		}
		failed := 0
		for _, split := range splits {
			code, got, hdr := get(t, c, "https://api.test:"+port+"/?"+url.Values{"form": {name}, "split": {split}}.Encode())
			requests++
			all := got + "\n" + hdr.Get("X-Echo") + "\n" + hdr.Get("Trailer-X-Trail")
			bad := code != 200 || !strings.HasPrefix(got, "before:") || !strings.HasSuffix(got, ":after") ||
				!strings.Contains(got, "[redacted]") || !strings.Contains(hdr.Get("X-Echo"), "[redacted]") || !strings.Contains(hdr.Get("Trailer-X-Trail"), "[redacted]")
			if run := leaks(core[name], all); bad || run != "" {
				t.Errorf("%s (%q), split %s: %d, body %q, X-Echo %q, trailer %q (leaked %q)", name, form, split, code, got, hdr.Get("X-Echo"), hdr.Get("Trailer-X-Trail"), run)
				if failed++; failed > 2 {
					break
				}
			}
		}
	}
	t.Logf("%d forms, %d requests", len(names), requests)
}

func randomAlnum(t *testing.T, n int) string {
	const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alnum[int(b[i])%len(alnum)]
	}
	return string(b)
}

// Bodies that hold no form of the secret pass byte for byte: a large
// random binary body, and text full of base64, hex and escapes.
func TestEgressScrubNoFalsePositives(t *testing.T) {
	secret := "Bearer " + randomAlnum(t, 32)
	bin := make([]byte, 8<<20)
	rand.Read(bin)
	var text bytes.Buffer
	for i := 0; text.Len() < 1<<20; i++ {
		r := make([]byte, 48)
		rand.Read(r)
		fmt.Fprintf(&text, `{"n":%d,"b64":%q,"hex":"%x","url":%q,"esc":"\u003c\/a\u0026"}`+"\n", i,
			base64.StdEncoding.EncodeToString(r), r, url.QueryEscape(string(r)))
	}
	bodies := map[string][]byte{"/bin": bin, "/text": text.Bytes()}
	up, upRoots := newUpstreamTLS(t, "api.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := bodies[r.URL.Path]
		for len(b) > 0 { // odd-sized writes
			n := min(len(b), 12345)
			w.Write(b[:n])
			b = b[n:]
		}
	}))
	port := portOf(t, up.Listener.Addr().String())
	ca, _ := egress.NewCA()
	h := startProxy(t, egress.Config{
		Policy:        policy(t, "api.test:"+port, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"api.test": {Header: "Authorization", Value: secret}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c := h.client(t, roots)
	for path, want := range bodies {
		code, got, _ := get(t, c, "https://api.test:"+port+path)
		if code != 200 || got != string(want) {
			t.Errorf("%s: %d, %d bytes, want %d bytes unchanged (equal: %v)", path, code, len(got), len(want), got == string(want))
		}
	}
}
