package egress_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/egress"
)

// upstreamView is what an upstream saw of one request.
type upstreamView struct {
	sni, host, key string
}

// viewServer is an HTTPS upstream for name recording, for each request, the
// TLS server name of its connection, the Host header and the X-Key header.
type viewServer struct {
	mu    sync.Mutex
	views []upstreamView
	sni   map[string]string // by remote address
}

func (v *viewServer) take() []upstreamView {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.views
	v.views = nil
	return out
}

func newViewServer(t *testing.T, name string) (*viewServer, *httptest.Server, *x509.CertPool) {
	t.Helper()
	v := &viewServer{sni: map[string]string{}}
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v.mu.Lock()
		v.views = append(v.views, upstreamView{sni: v.sni[r.RemoteAddr], host: r.Host, key: r.Header.Get("X-Key")})
		v.mu.Unlock()
		io.WriteString(w, "upstream ok")
	}))
	up.TLS = &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
			v.mu.Lock()
			v.sni[hi.Conn.RemoteAddr().String()] = hi.ServerName
			v.mu.Unlock()
			return nil, nil
		},
	}
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return v, up, roots
}

// rawRequest writes a request head on c and reads the answer.
func rawRequest(t *testing.T, c net.Conn, br *bufio.Reader, head string) (int, string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%q: %v", head, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// Domain fronting: inside an intercepted connection to the credential
// host, a request naming another host in its Host header (or in an
// absolute URL) is refused and never reaches the upstream with the secret;
// what reaches it has SNI, Host and address all of the credential host.
func TestEgressCredentialNotRedirectable(t *testing.T) {
	const secret = "k-3f9a1c0d7e5b2a84"
	view, up, upRoots := newViewServer(t, "api.test")
	port := portOf(t, up.Listener.Addr().String())
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	h := startProxy(t, egress.Config{
		Policy:        policy(t, "api.test:"+port, "other.test:"+port, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"api.test": {Header: "X-Key", Value: secret}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}, nil),
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c, br, resp := rawConnect(t, h.addr, "api.test:"+port, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "api.test"})
	tbr := bufio.NewReader(tc)
	if br.Buffered() != 0 {
		t.Fatal("bytes after the CONNECT answer")
	}
	n := 0
	for _, tc2 := range []struct {
		head string
		ok   bool
	}{
		{"GET /a HTTP/1.1\r\nHost: api.test:" + port + "\r\n\r\n", true},
		{"GET /b HTTP/1.1\r\nHost: API.Test\r\n\r\n", true},
		{"GET /c HTTP/1.1\r\nHost: api.test.:" + port + "\r\n\r\n", true},
		{"GET /e HTTP/1.1\r\nHost: other.test\r\n\r\n", false},
		{"GET /f HTTP/1.1\r\nHost: other.test:" + port + "\r\n\r\n", false},
		{"GET /g HTTP/1.1\r\nHost: api.test:1\r\n\r\n", false},
		{"GET /h HTTP/1.1\r\nHost: api.test.other.test\r\n\r\n", false},
		{"GET https://other.test:" + port + "/i HTTP/1.1\r\nHost: api.test:" + port + "\r\n\r\n", false},
		{"GET /j HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n\r\n", false},
		{"GET /d HTTP/1.0\r\n\r\n", true}, // no Host: the target's (last: HTTP/1.0 closes)
	} {
		code, body := rawRequest(t, tc, tbr, tc2.head)
		n++
		d := h.rec.wait(t, n)[n-1]
		views := view.take()
		if tc2.ok {
			if code != 200 || body != "upstream ok" || len(views) != 1 || !d.Allowed {
				t.Errorf("%q = %d %q, upstream saw %+v, decision %+v; want it forwarded", tc2.head, code, body, views, d)
				continue
			}
			if v := views[0]; v.sni != "api.test" || v.host != "api.test:"+port || v.key != secret {
				t.Errorf("%q: the upstream saw SNI %q, Host %q, key %q; want api.test, api.test:%s and the credential", tc2.head, v.sni, v.host, v.key, port)
			}
			continue
		}
		if code != http.StatusForbidden || !strings.Contains(body, "the credential goes to api.test only") || len(views) != 0 {
			t.Errorf("%q = %d %q, upstream saw %+v; want 403 and nothing upstream", tc2.head, code, body, views)
		}
		if d.Allowed || d.Host != "api.test" || !strings.Contains(d.Reason, "is not api.test") || d.Credential != "X-Key" {
			t.Errorf("%q: decision %+v", tc2.head, d)
		}
	}

	// Through the plain proxy with an absolute https:// URL, a Host header
	// behind it is ignored (RFC 9112, 3.2.2): the upstream sees the URL's
	// host, in SNI and Host.
	pc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	pbr := bufio.NewReader(pc)
	for _, host := range []string{"other.test", "api.test:" + port} {
		head := fmt.Sprintf("GET https://api.test:%s/p HTTP/1.1\r\nHost: %s\r\n\r\n", port, host)
		code, body := rawRequest(t, pc, pbr, head)
		n++
		h.rec.wait(t, n)
		views := view.take()
		if code != 200 || body != "upstream ok" || len(views) != 1 {
			t.Fatalf("%q = %d %q, upstream saw %+v", head, code, body, views)
		}
		if v := views[0]; v.sni != "api.test" || v.host != "api.test:"+port || v.key != secret {
			t.Errorf("%q: the upstream saw %+v", head, v)
		}
	}
	// An absolute URL naming the other host gets no credential.
	head := fmt.Sprintf("GET https://other.test:%s/q HTTP/1.1\r\nHost: api.test:%s\r\n\r\n", port, port)
	if code, _ := rawRequest(t, pc, pbr, head); code != http.StatusBadGateway { // other.test's name is not in the certificate
		t.Errorf("%q = %d, want 502 (certificate for api.test only)", head, code)
	}
	n++
	if d := h.rec.wait(t, n)[n-1]; d.Credential != "" {
		t.Errorf("a request to other.test carried the credential: %+v", d)
	}
	if views := view.take(); len(views) != 0 {
		t.Errorf("the upstream saw %+v", views)
	}
}

// Credentials go over TLS only: a plain http:// request to a credential
// host is refused unless the credential allows HTTP; an absolute https://
// URL through the plain proxy is fine (the proxy speaks TLS upstream).
func TestEgressCredentialHTTPSOnly(t *testing.T) {
	const secret = "k-77d0e1f2a3b4c5d6"
	var mu sync.Mutex
	var keys []string
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("X-Key"))
		mu.Unlock()
		io.WriteString(w, "plain ok")
	}))
	defer plain.Close()
	pport := portOf(t, plain.Listener.Addr().String())
	view, up, upRoots := newViewServer(t, "tls.test")
	tport := portOf(t, up.Listener.Addr().String())
	ca, _ := egress.NewCA()
	h := startProxy(t, egress.Config{
		Policy: policy(t, "plain.test:"+pport, "open.test:"+pport, "tls.test:"+tport, "127.0.0.1/32"),
		Credentials: map[string]egress.Credential{
			"plain.test": {Header: "X-Key", Value: secret},
			"open.test":  {Header: "X-Key", Value: secret, AllowHTTP: true},
			"tls.test":   {Header: "X-Key", Value: secret},
		},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"plain.test": {"127.0.0.1"}, "open.test": {"127.0.0.1"}, "tls.test": {"127.0.0.1"}}, nil),
	})
	c := h.client(t, nil)
	code, body, _ := get(t, c, "http://plain.test:"+pport+"/")
	if code != http.StatusForbidden || !strings.Contains(body, "credential host plain.test is served over https only") {
		t.Errorf("http://plain.test = %d %q, want 403 https only", code, body)
	}
	if d := h.rec.wait(t, 1)[0]; d.Allowed || !strings.Contains(d.Reason, "https only") {
		t.Errorf("decision = %+v", d)
	}
	mu.Lock()
	if len(keys) != 0 {
		t.Errorf("the plain upstream got %d requests", len(keys))
	}
	mu.Unlock()

	code, body, _ = get(t, c, "http://open.test:"+pport+"/")
	if code != 200 || body != "plain ok" {
		t.Errorf("http://open.test (AllowHTTP) = %d %q", code, body)
	}
	h.rec.wait(t, 2)
	mu.Lock()
	if len(keys) != 1 || keys[0] != secret {
		t.Errorf("with AllowHTTP the upstream got keys %q, want the credential", keys)
	}
	mu.Unlock()

	pc, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	code, body = rawRequest(t, pc, bufio.NewReader(pc), "GET https://tls.test:"+tport+"/ HTTP/1.1\r\nHost: tls.test:"+tport+"\r\n\r\n")
	if code != 200 || body != "upstream ok" {
		t.Errorf("absolute https:// URL = %d %q", code, body)
	}
	if v := view.take(); len(v) != 1 || v[0].key != secret || v[0].sni != "tls.test" {
		t.Errorf("the TLS upstream saw %+v", v)
	}
}
