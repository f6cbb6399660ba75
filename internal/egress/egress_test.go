package egress_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/poll"
)

// Every proxy, upstream and client a test starts is gone when it ends: no
// goroutine may outlive the tests (an intercepted request waiting on a slow
// upstream after Close, a tunnel still copying...).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ---- rules ----

func TestEgressParseRules(t *testing.T) {
	pfx := netip.MustParsePrefix
	for _, tc := range []struct {
		in   string
		want egress.Rule
		str  string // Rule.String
	}{
		{"api.test", egress.Rule{Host: "api.test"}, "api.test"},
		{"API.Test.", egress.Rule{Host: "api.test"}, "api.test"},
		{"  files.test\t", egress.Rule{Host: "files.test"}, "files.test"},
		{"under_score-1.test", egress.Rule{Host: "under_score-1.test"}, "under_score-1.test"},
		{"localhost", egress.Rule{Host: "localhost"}, "localhost"},
		{"*.example.test", egress.Rule{Host: "example.test", Wildcard: true}, "*.example.test"},
		{"api.test:8443", egress.Rule{Host: "api.test", Port: 8443}, "api.test:8443"},
		{"api.test:1", egress.Rule{Host: "api.test", Port: 1}, "api.test:1"},
		{"api.test:65535", egress.Rule{Host: "api.test", Port: 65535}, "api.test:65535"},
		{"*.Example.Test:8080", egress.Rule{Host: "example.test", Wildcard: true, Port: 8080}, "*.example.test:8080"},
		{"10.1.2.0/24", egress.Rule{Prefix: pfx("10.1.2.0/24")}, "10.1.2.0/24"},
		{"10.1.2.3/24", egress.Rule{Prefix: pfx("10.1.2.0/24")}, "10.1.2.0/24"}, // masked
		{"10.1.2.3", egress.Rule{Prefix: pfx("10.1.2.3/32")}, "10.1.2.3/32"},
		{"127.0.0.1/32", egress.Rule{Prefix: pfx("127.0.0.1/32")}, "127.0.0.1/32"},
		{"fd00::/8", egress.Rule{Prefix: pfx("fd00::/8")}, "fd00::/8"},
		{"::1", egress.Rule{Prefix: pfx("::1/128")}, "::1/128"},
		{"[2001:db8::1]", egress.Rule{Prefix: pfx("2001:db8::1/128")}, "2001:db8::1/128"},
	} {
		rules, err := egress.ParseRules([]string{tc.in})
		if err != nil {
			t.Errorf("ParseRules(%q): %v", tc.in, err)
			continue
		}
		if len(rules) != 1 || rules[0] != tc.want {
			t.Errorf("ParseRules(%q) = %+v, want %+v", tc.in, rules, tc.want)
			continue
		}
		if s := rules[0].String(); s != tc.str {
			t.Errorf("ParseRules(%q).String() = %q, want %q", tc.in, s, tc.str)
		}
	}
	// Empty and nil lists are fine: nothing is allowed.
	for _, in := range [][]string{nil, {}} {
		if rules, err := egress.ParseRules(in); err != nil || len(rules) != 0 {
			t.Errorf("ParseRules(%v) = %v, %v; want no rules", in, rules, err)
		}
	}
	// Several patterns keep their order.
	rules, err := egress.ParseRules([]string{"a.test", "*.b.test:81", "10.0.0.0/8"})
	if err != nil || len(rules) != 3 || rules[0].String() != "a.test" || rules[1].String() != "*.b.test:81" || rules[2].String() != "10.0.0.0/8" {
		t.Errorf("ParseRules(3 patterns) = %v, %v", rules, err)
	}
}

func TestEgressParseRulesErrors(t *testing.T) {
	for _, tc := range []struct{ in, msg string }{
		{"", "empty"},
		{"   ", "empty"},
		{"api.test:0", "out of range"},
		{"api.test:65536", "out of range"},
		{"api.test:abc", "out of range"},
		{"api.test:-1", "out of range"},
		{"api.test:", "out of range"},
		{"api.test:80:81", "host:port"},
		{"*.test:99999", "out of range"},
		{"bad host.test", "bad character"},
		{"ex!ample.test", "bad character"},
		{"über.test", "bad character"},
		{"a..b.test", "bad host name"},
		{".test", "bad host name"},
		{"*", "bad character"},
		{"*.", "bad character"},
		{"**.test", "bad character"},
		{"*.*.test", "bad character"},
		{"a.*.test", "bad character"},
		{"*api.test", "bad character"},
		{strings.Repeat("a", 64) + ".test", "bad host name"},
		{strings.Repeat("abcdefghi.", 26) + "test", "bad host name"}, // 264 characters
		{"http://api.test", "CIDR"},
		{"api.test/path", "CIDR"},
		{"10.0.0.0/33", "CIDR"},
		{"10.0.0.0/", "CIDR"},
		{"300.1.1.1/8", "CIDR"},
		{"10.1.2.3:80", "address"},
		{"[::1]:443", "address"},
	} {
		rules, err := egress.ParseRules([]string{"ok.test", tc.in})
		if err == nil {
			t.Errorf("ParseRules(%q) = %v, want an error", tc.in, rules)
			continue
		}
		if !strings.Contains(err.Error(), strconv.Quote(tc.in)) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseRules(%q) error %q should name the pattern and say %q", tc.in, err, tc.msg)
		}
	}
}

func policy(t *testing.T, patterns ...string) egress.Policy {
	t.Helper()
	rules, err := egress.ParseRules(patterns)
	if err != nil {
		t.Fatal(err)
	}
	return egress.Policy{Rules: rules}
}

func TestEgressWildcardAndPorts(t *testing.T) {
	p := policy(t, "*.example.test", "api.test", "alt.test:8443", "127.0.0.1/32")
	for _, tc := range []struct {
		host string
		port int
		want bool
	}{
		{"a.example.test", 443, true},
		{"a.example.test", 80, true},
		{"a.b.example.test", 443, true},
		{"A.Example.TEST.", 443, true},
		{"example.test", 443, false}, // a wildcard does not cover the name itself
		{"badexample.test", 443, false},
		{"a.example.test.evil.test", 443, false},
		{"example.test.a", 443, false},
		{"a.example.test", 8080, false}, // no port: 80 and 443 only
		{"a.example.test", 0, false},
		{"api.test", 80, true},
		{"api.test", 443, true},
		{"API.TEST", 443, true},
		{"api.test", 8443, false},
		{"x.api.test", 443, false}, // a plain name does not cover names under it
		{"api.test.example.test", 443, true},
		{"alt.test", 8443, true},
		{"alt.test", 443, false}, // a port replaces the defaults
		{"alt.test", 80, false},
		{"127.0.0.1", 80, false}, // CIDR rules are not name rules
		{"", 443, false},
	} {
		if got := p.AllowName(tc.host, tc.port); got != tc.want {
			t.Errorf("AllowName(%q, %d) = %v, want %v", tc.host, tc.port, got, tc.want)
		}
	}
	if policy(t).AllowName("api.test", 443) {
		t.Error("an empty policy allows a name")
	}
}

func TestEgressAllowAddr(t *testing.T) {
	none := policy(t)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", false}, {"127.1.2.3", false}, {"0.0.0.0", false}, {"0.1.2.3", false},
		{"10.0.0.1", false}, {"10.213.0.1", false}, {"172.16.0.1", false}, {"172.17.0.1", false}, {"172.31.255.255", false},
		{"192.168.1.1", false}, {"169.254.169.254", false}, {"169.254.0.1", false}, {"100.64.0.1", false},
		{"100.127.255.255", false}, {"192.0.0.8", false}, {"192.0.2.1", false}, {"198.18.0.1", false},
		{"198.51.100.7", false}, {"203.0.113.9", false}, {"224.0.0.1", false}, {"239.255.255.250", false},
		{"240.0.0.1", false}, {"255.255.255.255", false},
		{"::", false}, {"::1", false}, {"fe80::1", false}, {"fc00::1", false}, {"fd12:3456::1", false},
		{"ff02::1", false}, {"2001:db8::1", false}, {"64:ff9b::a9fe:a9fe", false}, // NAT64 of 169.254.169.254
		{"::ffff:127.0.0.1", false}, {"::ffff:169.254.169.254", false}, {"::ffff:10.0.0.1", false},
		// Public unicast (pure function: nothing is contacted).
		{"8.8.8.8", true}, {"1.1.1.1", true}, {"11.0.0.1", true}, {"172.15.255.255", true}, {"172.32.0.1", true},
		{"100.63.255.255", true}, {"100.128.0.1", true}, {"169.253.0.1", true}, {"223.255.255.254", true},
		{"2606:4700::1111", true}, {"::ffff:8.8.8.8", true},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got, _ := none.AllowAddr(a, false); got != tc.want {
			t.Errorf("AllowAddr(%s) = %v, want %v", tc.addr, got, tc.want)
		}
		if none.InCIDR(a) {
			t.Errorf("InCIDR(%s) with no CIDR rules = true", tc.addr)
		}
	}
	if ok, _ := none.AllowAddr(netip.Addr{}, false); ok {
		t.Error("AllowAddr(invalid) = true")
	}
	// A CIDR opens exactly its range, IPv4-mapped forms included.
	p := policy(t, "127.0.0.1/32", "10.1.0.0/16", "fd00::/8", "api.test")
	for _, tc := range []struct {
		addr          string
		allow, inCIDR bool
	}{
		{"127.0.0.1", true, true}, {"::ffff:127.0.0.1", true, true}, {"127.0.0.2", false, false},
		{"10.1.255.255", true, true}, {"10.2.0.0", false, false}, {"fd00::1", true, true}, {"fc00::1", false, false},
		{"169.254.169.254", false, false}, {"8.8.8.8", true, false},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got, _ := p.AllowAddr(a, false); got != tc.allow {
			t.Errorf("with CIDRs: AllowAddr(%s) = %v, want %v", tc.addr, got, tc.allow)
		}
		if got := p.InCIDR(a); got != tc.inCIDR {
			t.Errorf("with CIDRs: InCIDR(%s) = %v, want %v", tc.addr, got, tc.inCIDR)
		}
	}
}

// ---- proxy harness ----

// recorder collects the proxy's audit records.
type recorder struct {
	mu sync.Mutex
	ds []egress.Decision
}

func (r *recorder) add(d egress.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, d)
}

// wait returns the records once there are n (the proxy logs a request after
// answering it, so the client may see the answer first).
func (r *recorder) wait(t *testing.T, n int) []egress.Decision {
	t.Helper()
	var ds []egress.Decision
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		r.mu.Lock()
		ds = append([]egress.Decision(nil), r.ds...)
		r.mu.Unlock()
		return len(ds) >= n, fmt.Sprintf("%d audit records, want %d: %+v", len(ds), n, ds)
	})
	if len(ds) > n {
		t.Fatalf("%d audit records, want %d: %+v", len(ds), n, ds)
	}
	return ds
}

type harness struct {
	p       *egress.Proxy
	addr    string
	url     *url.URL
	rec     *recorder // Log's records
	decided *recorder // Decided's
	l       *recordingListener
}

// recordingListener keeps the connections it accepted, in order.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// accepted returns the connections accepted so far.
func (l *recordingListener) accepted() []net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.conns)
}

// startProxy runs a proxy on loopback until the test ends.
func startProxy(t *testing.T, cfg egress.Config) *harness {
	t.Helper()
	h := &harness{rec: &recorder{}, decided: &recorder{}}
	cfg.Log, cfg.Decided = h.rec.add, h.decided.add
	h.p = egress.New(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.l = &recordingListener{Listener: l}
	h.addr = l.Addr().String()
	h.url = &url.URL{Scheme: "http", Host: h.addr}
	done := make(chan error, 1)
	go func() { done <- h.p.Serve(h.l) }()
	t.Cleanup(func() {
		h.p.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

// client returns an HTTP client that goes through the proxy and trusts
// roots for HTTPS.
func (h *harness) client(t *testing.T, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(h.url), TLSClientConfig: &tls.Config{RootCAs: roots}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// resolver maps names to addresses like a DNS server would, counting
// lookups.
func resolver(m map[string][]string, calls *atomic.Int32) func(context.Context, string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		if calls != nil {
			calls.Add(1)
		}
		var out []netip.Addr
		for _, s := range m[host] {
			out = append(out, netip.MustParseAddr(s))
		}
		if len(out) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return out, nil
	}
}

func portOf(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, c *http.Client, u string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", u, err)
	}
	h := resp.Header.Clone()
	for k, v := range resp.Trailer {
		h["Trailer-"+k] = v
	}
	return resp.StatusCode, string(b), h
}

// rawConnect sends a CONNECT (followed by extra bytes in the same write)
// and returns the connection, its reader and the proxy's answer.
func rawConnect(t *testing.T, proxy, target string, extra []byte) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	msg := append([]byte(fmt.Sprintf("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)), extra...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", target, err)
	}
	return c, br, resp
}

// countingListener accepts TCP connections on addr and counts them.
func countingListener(t *testing.T, addr string) (net.Listener, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l, &n
}

// ---- proxy behaviour ----

func TestEgressProxyAllowDeny(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "hello %s %s %s proxy-authz=%q body=%d", r.Method, r.Host, r.URL.Path, r.Header.Get("Proxy-Authorization"), len(b))
	}))
	defer up.Close()
	port := portOf(t, up.Listener.Addr().String())
	pn, _ := strconv.Atoi(port)
	var lookups atomic.Int32
	h := startProxy(t, egress.Config{
		Policy:  policy(t, "api.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"api.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}, &lookups),
	})
	c := h.client(t, nil)

	// Allowed name.
	code, body, _ := get(t, c, "http://api.test:"+port+"/x", "Proxy-Authorization", "Basic c2VjcmV0")
	if want := fmt.Sprintf(`hello GET api.test:%s /x proxy-authz="" body=0`, port); code != 200 || body != want {
		t.Fatalf("allowed GET = %d %q, want 200 %q", code, body, want)
	}
	ds := h.rec.wait(t, 1)
	if d := ds[0]; !d.Allowed || d.Method != "GET" || d.Host != "api.test" || d.Port != pn ||
		d.Addr != "127.0.0.1:"+port || d.Reason != "" || d.Credential != "" || d.BytesUp != 0 || d.BytesDown != int64(len(body)) {
		t.Errorf("decision for the allowed GET = %+v", d)
	}
	// A POST body is counted up.
	resp, err := c.Post("http://api.test:"+port+"/p", "text/plain", strings.NewReader(strings.Repeat("x", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "body=1000") {
		t.Fatalf("POST = %d %q", resp.StatusCode, b)
	}
	if d := h.rec.wait(t, 2)[1]; !d.Allowed || d.Method != "POST" || d.BytesUp != 1000 || d.BytesDown != int64(len(b)) {
		t.Errorf("decision for the POST = %+v", d)
	}
	// An IP literal in a CIDR rule.
	if code, body, _ := get(t, c, "http://127.0.0.1:"+port+"/ip"); code != 200 || !strings.Contains(body, "hello GET 127.0.0.1:"+port+" /ip") {
		t.Fatalf("GET by address in the CIDR = %d %q", code, body)
	}
	h.rec.wait(t, 3)

	// Denied: a name not listed, a listed name on another port, an address
	// outside the CIDRs. None reaches the upstream or even the resolver.
	hitsBefore, lookupsBefore := hits.Load(), lookups.Load()
	for i, tc := range []struct{ url, host, reason string }{
		{"http://other.test:" + port + "/", "other.test", "host not in the allow-list"},
		{"http://api.test/", "api.test", "host not in the allow-list"},
		{"http://api.test:" + strconv.Itoa(pn%60000+1) + "/", "api.test", "host not in the allow-list"},
		{"http://127.0.0.2:" + port + "/", "127.0.0.2", "address not in the allow-list"},
		{"http://[::1]:" + port + "/", "::1", "address not in the allow-list"},
	} {
		code, body, _ := get(t, c, tc.url)
		if code != http.StatusForbidden || !strings.Contains(body, tc.reason) {
			t.Errorf("GET %s = %d %q, want 403 saying %q", tc.url, code, body, tc.reason)
		}
		d := h.rec.wait(t, 4+i)[3+i]
		if d.Allowed || d.Host != tc.host || d.Reason != tc.reason || d.Addr != "" {
			t.Errorf("decision for %s = %+v", tc.url, d)
		}
	}
	if hits.Load() != hitsBefore || lookups.Load() != lookupsBefore {
		t.Errorf("denied requests reached the upstream (%d) or the resolver (%d)", hits.Load()-hitsBefore, lookups.Load()-lookupsBefore)
	}

	// A CONNECT to a name not listed.
	_, _, resp = rawConnect(t, h.addr, "other.test:443", nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("CONNECT other.test:443 = %s, want 403", resp.Status)
	}
	if d := h.rec.wait(t, 9)[8]; d.Allowed || d.Method != "CONNECT" || d.Host != "other.test" || d.Port != 443 {
		t.Errorf("decision for the denied CONNECT = %+v", d)
	}

	// A request that is not a proxy request.
	r2, err := http.Get("http://" + h.addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != http.StatusBadRequest {
		t.Errorf("plain GET to the proxy = %s, want 400", r2.Status)
	}
	http.DefaultClient.CloseIdleConnections()
}

// Requests on a kept-alive connection are each recorded as allowed, with the
// address the connection goes to.
func TestEgressDecisionsOnReusedConnections(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	port := portOf(t, up.Listener.Addr().String())
	h := startProxy(t, egress.Config{
		Policy:  policy(t, "api.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	c := h.client(t, nil)
	for range 3 {
		if code, body, _ := get(t, c, "http://api.test:"+port+"/"); code != 200 || body != "ok" {
			t.Fatalf("GET = %d %q", code, body)
		}
	}
	for i, d := range h.rec.wait(t, 3) {
		if !d.Allowed || d.Addr != "127.0.0.1:"+port || d.Reason != "" || d.BytesDown != 2 {
			t.Errorf("decision %d = %+v", i, d)
		}
	}
}

// Decided gets each decision once, before the sandbox hears the answer
// (Log comes at the end, with the bytes), with the connection it came on
// as the Listener returned it: allowed and denied requests and tunnels, a
// name resolving to a forbidden address, an upstream that refuses, and
// two requests on one kept-alive connection.
func TestEgressDecided(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	port := portOf(t, up.Listener.Addr().String())
	closed := l2(t, "127.0.0.1:0")
	downPort := portOf(t, closed.Addr().String())
	closed.Close()
	h := startProxy(t, egress.Config{
		Policy: policy(t, "api.test:"+port, "down.test:"+downPort, "meta.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"api.test": {"127.0.0.1"}, "down.test": {"127.0.0.1"},
			"meta.test": {"169.254.169.254"}}, nil),
	})
	c := h.client(t, nil)
	// decidedNow returns Decided's records, which must be there already:
	// the client has had its answer.
	decidedNow := func(n int) []egress.Decision {
		t.Helper()
		h.decided.mu.Lock()
		defer h.decided.mu.Unlock()
		if len(h.decided.ds) != n {
			t.Fatalf("%d decisions passed to Decided once the client had its answer, want %d: %+v", len(h.decided.ds), n, h.decided.ds)
		}
		return slices.Clone(h.decided.ds)
	}
	for i, tc := range []struct {
		url     string
		code    int
		allowed bool
	}{
		{"http://api.test:" + port + "/a", 200, true},
		{"http://api.test:" + port + "/b", 200, true}, // the same connection
		{"http://other.test:" + port + "/", 403, false},
		{"http://meta.test:" + port + "/", 403, false},
		{"http://down.test:" + downPort + "/", 502, false},
	} {
		if code, _, _ := get(t, c, tc.url); code != tc.code {
			t.Fatalf("GET %s = %d, want %d", tc.url, code, tc.code)
		}
		if d := decidedNow(i + 1)[i]; d.Allowed != tc.allowed || d.Method != "GET" || d.Conn == nil {
			t.Errorf("Decided for GET %s: %+v", tc.url, d)
		}
	}
	_, _, resp := rawConnect(t, h.addr, "api.test:"+port, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT api.test = %s", resp.Status)
	}
	if d := decidedNow(6)[5]; !d.Allowed || d.Method != "CONNECT" || d.Host != "api.test" {
		t.Errorf("Decided for the allowed CONNECT: %+v", d)
	}
	_, _, resp = rawConnect(t, h.addr, "other.test:443", nil)
	if resp.StatusCode != 403 {
		t.Fatalf("CONNECT other.test = %s", resp.Status)
	}
	ds := decidedNow(7)
	if d := ds[6]; d.Allowed || d.Method != "CONNECT" || d.Host != "other.test" || d.Reason == "" {
		t.Errorf("Decided for the denied CONNECT: %+v", d)
	}
	// Each decision names the listener's connection it came on.
	conns := h.l.accepted()
	index := func(c net.Conn) int { return slices.Index(conns, c) }
	if ds[0].Conn != ds[1].Conn || index(ds[0].Conn) < 0 {
		t.Errorf("two requests on one kept-alive connection: Conn %p and %p, accepted %v", ds[0].Conn, ds[1].Conn, conns)
	}
	if i, j := index(ds[5].Conn), index(ds[6].Conn); i < 0 || j < 0 || i == j {
		t.Errorf("the two CONNECTs (separate connections) name accepted connections %d and %d", i, j)
	}
	// Log has the same decisions, with the same connections; the open
	// tunnel's comes at its end.
	logged := h.rec.wait(t, 6)
	for i, want := range append(ds[:5:5], ds[6]) {
		if d := logged[i]; d.Conn != want.Conn || d.Allowed != want.Allowed || d.Host != want.Host {
			t.Errorf("Log's record %d = %+v, Decided's %+v", i, d, want)
		}
	}
}

// The proxy resolves names itself and dials only addresses it checked: a
// listed name that resolves to loopback, link-local (cloud metadata) or any
// other special address is denied unless a CIDR rule names the address.
func TestEgressDNSRebinding(t *testing.T) {
	l, accepts := countingListener(t, "127.0.0.1:0")
	port := portOf(t, l.Addr().String())
	_, accepts2 := countingListener(t, "127.0.0.2:"+port)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "upstream") }))
	defer up.Close()

	h := startProxy(t, egress.Config{
		Policy: policy(t, "allowed.test:"+port, "meta.test:"+port, "meta.test", "v6.test:"+port),
		Resolve: resolver(map[string][]string{
			"allowed.test": {"127.0.0.1"},
			"meta.test":    {"169.254.169.254"},
			"v6.test":      {"::1", "::ffff:127.0.0.1", "10.0.0.1"},
		}, nil),
	})
	c := h.client(t, nil)
	n := 0
	for _, tc := range []struct{ url, bad string }{
		{"http://allowed.test:" + port + "/", "127.0.0.1"},
		{"http://meta.test:" + port + "/latest/meta-data/", "169.254.169.254"},
		{"http://meta.test/latest/meta-data/", "169.254.169.254"},
		{"http://v6.test:" + port + "/", "::1"},
	} {
		code, body, _ := get(t, c, tc.url)
		if code != http.StatusForbidden || !strings.Contains(body, "forbidden address") || !strings.Contains(body, tc.bad) {
			t.Errorf("GET %s = %d %q, want 403 naming the forbidden address %s", tc.url, code, body, tc.bad)
		}
		n++
		d := h.rec.wait(t, n)[n-1]
		if d.Allowed || d.Addr != "" || !strings.HasPrefix(d.Reason, "resolves to forbidden address") {
			t.Errorf("decision for %s = %+v, want denied before dialing", tc.url, d)
		}
	}
	for _, target := range []string{"allowed.test:" + port, "meta.test:443"} {
		_, _, resp := rawConnect(t, h.addr, target, nil)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("CONNECT %s = %s, want 403", target, resp.Status)
		}
		n++
		if d := h.rec.wait(t, n)[n-1]; d.Allowed || d.Method != "CONNECT" || !strings.HasPrefix(d.Reason, "resolves to forbidden address") {
			t.Errorf("decision for CONNECT %s = %+v", target, d)
		}
	}
	if accepts.Load() != 0 || accepts2.Load() != 0 {
		t.Errorf("the proxy connected to a forbidden loopback address %d times", accepts.Load()+accepts2.Load())
	}

	// With a CIDR naming 127.0.0.1, only that address of a mixed answer is
	// dialed: 127.0.0.2 (loopback, not in the CIDR) is skipped even though it
	// comes first.
	up.Listener.Close()
	up.Listener = l2(t, "127.0.0.1:0")
	up.Start()
	uport := portOf(t, up.Listener.Addr().String())
	_, accepts3 := countingListener(t, "127.0.0.2:"+uport)
	h2 := startProxy(t, egress.Config{
		Policy:  policy(t, "mixed.test:"+uport, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"mixed.test": {"127.0.0.2", "169.254.169.254", "127.0.0.1"}}, nil),
	})
	code, body, _ := get(t, h2.client(t, nil), "http://mixed.test:"+uport+"/")
	if code != 200 || body != "upstream" {
		t.Errorf("GET mixed.test = %d %q, want 200 from 127.0.0.1", code, body)
	}
	if d := h2.rec.wait(t, 1)[0]; !d.Allowed || d.Addr != "127.0.0.1:"+uport {
		t.Errorf("decision for mixed.test = %+v", d)
	}
	if accepts3.Load() != 0 {
		t.Errorf("the proxy dialed 127.0.0.2, which no rule allows")
	}
}

func l2(t *testing.T, addr string) net.Listener {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The upstream being down is a 502, for plain requests and tunnels alike,
// and the record says why.
func TestEgressUpstreamDown(t *testing.T) {
	l := l2(t, "127.0.0.1:0")
	port := portOf(t, l.Addr().String())
	l.Close()
	h := startProxy(t, egress.Config{
		Policy:  policy(t, "down.test:"+port, "unknown.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"down.test": {"127.0.0.1"}}, nil),
	})
	code, body, _ := get(t, h.client(t, nil), "http://down.test:"+port+"/")
	if code != http.StatusBadGateway || !strings.Contains(body, "connection refused") {
		t.Errorf("GET to a closed port = %d %q, want 502 connection refused", code, body)
	}
	if d := h.rec.wait(t, 1)[0]; d.Allowed || !strings.HasPrefix(d.Reason, "upstream: ") || !strings.Contains(d.Reason, "refused") {
		t.Errorf("decision = %+v", d)
	}
	_, _, resp := rawConnect(t, h.addr, "down.test:"+port, nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("CONNECT to a closed port = %s, want 502", resp.Status)
	}
	if d := h.rec.wait(t, 2)[1]; d.Allowed || d.Method != "CONNECT" || !strings.Contains(d.Reason, "refused") {
		t.Errorf("decision for CONNECT = %+v", d)
	}
	// An allowed name the resolver does not know: 502 too (nothing to
	// connect to).
	code, body, _ = get(t, h.client(t, nil), "http://unknown.test:"+port+"/")
	if code != http.StatusBadGateway || !strings.Contains(body, "cannot resolve unknown.test") {
		t.Errorf("GET to an unresolvable name = %d %q, want 502", code, body)
	}
	if d := h.rec.wait(t, 3)[2]; d.Allowed || !strings.Contains(d.Reason, "no such host") {
		t.Errorf("decision for the unresolvable name = %+v", d)
	}
}

// CONNECT tunnels count the bytes each way, including bytes the client sent
// right behind the CONNECT line.
func TestEgressConnectByteCounts(t *testing.T) {
	l := l2(t, "127.0.0.1:0")
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	defer func() { l.Close(); <-echoDone }()
	port := portOf(t, l.Addr().String())
	h := startProxy(t, egress.Config{
		Policy:  policy(t, "echo.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"echo.test": {"127.0.0.1"}}, nil),
	})
	early := bytes.Repeat([]byte("e"), 100)
	c, br, resp := rawConnect(t, h.addr, "echo.test:"+port, early)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	got := make([]byte, 100)
	if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, early) {
		t.Fatalf("echo of the early bytes: %q, %v", got, err)
	}
	more := bytes.Repeat([]byte("0123456789"), 1000)
	go c.Write(more)
	got = make([]byte, len(more))
	if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, more) {
		t.Fatalf("echo: %v", err)
	}
	// While the tunnel is open, the decision Decided had counts the
	// bytes that moved: the client has read every byte written to it,
	// and the upstream echoed only what the proxy passed on.
	h.decided.mu.Lock()
	live := h.decided.ds[0].Traffic
	h.decided.mu.Unlock()
	if want := int64(len(early) + len(more)); live.Up.Load() != want || live.Down.Load() != want {
		t.Errorf("Traffic while the tunnel is open: up %d, down %d; want %d each", live.Up.Load(), live.Down.Load(), want)
	}
	c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after close: %q, %v", rest, err)
	}
	d := h.rec.wait(t, 1)[0]
	want := int64(len(early) + len(more))
	if !d.Allowed || d.Method != "CONNECT" || d.Host != "echo.test" || d.Addr != "127.0.0.1:"+port || d.BytesUp != want || d.BytesDown != want {
		t.Errorf("decision = %+v, want allowed with %d bytes each way", d, want)
	}
}

// newUpstreamTLS starts an HTTPS server for name with a certificate from a
// CA of its own, returning the roots that verify it.
func newUpstreamTLS(t *testing.T, name string, h http.Handler) (*httptest.Server, *x509.CertPool) {
	t.Helper()
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewUnstartedServer(h)
	up.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return up, roots
}

// echoHandler answers with every request header, in response headers
// ("X-Echo-Name") and in the body; /split writes the Authorization value a
// few bytes at a time, /gzip compresses when asked to, /trailer sends it
// as a trailer.
func echoHandler(seen chan<- http.Header) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.Header.Clone():
		default:
		}
		var keys []string
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var body bytes.Buffer
		for _, k := range keys {
			w.Header().Set("X-Echo-"+k, r.Header.Get(k))
			fmt.Fprintf(&body, "%s: %s\n", k, r.Header.Get(k))
		}
		switch r.URL.Path {
		case "/split":
			v := r.Header.Get("Authorization")
			w.Write([]byte("<"))
			for i := 0; i < len(v); i += 3 {
				w.Write([]byte(v[i:min(i+3, len(v))]))
				w.(http.Flusher).Flush()
			}
			w.Write([]byte(">"))
		case "/gzip":
			if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				w.Write(body.Bytes())
				return
			}
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			zw.Write(body.Bytes())
			zw.Close()
		case "/br":
			// An encoding the proxy did not ask for and cannot read.
			w.Header().Set("Content-Encoding", "br")
			w.Write(body.Bytes())
		case "/trailer":
			w.Header().Set("Trailer", "X-Auth-Echo")
			w.Write(body.Bytes())
			w.Header().Set("X-Auth-Echo", r.Header.Get("Authorization"))
		default:
			w.Write(body.Bytes())
		}
	})
}

// Credentials: the header is added upstream, over HTTPS (TLS interception
// with the sandbox's CA) and plain HTTP, and the value is scrubbed from
// everything the upstream sends back.
func TestEgressCredentials(t *testing.T) {
	secret := fmt.Sprintf("Bearer s3cr3t-%d", time.Now().UnixNano())
	seen := make(chan http.Header, 1)
	tlsUp, upRoots := newUpstreamTLS(t, "api.test", echoHandler(seen))
	plainUp := httptest.NewServer(echoHandler(seen))
	defer plainUp.Close()
	tport, pport := portOf(t, tlsUp.Listener.Addr().String()), portOf(t, plainUp.Listener.Addr().String())
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	h := startProxy(t, egress.Config{
		Policy: policy(t, "api.test:"+tport, "plain.test:"+pport, "other.test:"+tport, "127.0.0.1/32"),
		Credentials: map[string]egress.Credential{
			"api.test":   {Header: "Authorization", Value: secret},
			"plain.test": {Header: "Authorization", Value: secret, AllowHTTP: true},
		},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}, "plain.test": {"127.0.0.1"}, "other.test": {"127.0.0.1"}}, nil),
	})
	sandboxRoots := x509.NewCertPool()
	sandboxRoots.AppendCertsFromPEM(ca.CertPEM())
	c := h.client(t, sandboxRoots)
	n := 0
	for _, base := range []string{"https://api.test:" + tport, "http://plain.test:" + pport} {
		// The client's own Authorization is replaced, not passed on.
		code, body, hdr := get(t, c, base+"/echo", "Authorization", "Bearer sandbox-made-this-up")
		if code != 200 {
			t.Fatalf("GET %s/echo = %d %q", base, code, body)
		}
		if got := (<-seen).Values("Authorization"); len(got) != 1 || got[0] != secret {
			t.Errorf("%s: the upstream got Authorization %q, want the credential", base, got)
		}
		if !strings.Contains(body, "Authorization: [redacted]\n") || hdr.Get("X-Echo-Authorization") != "[redacted]" {
			t.Errorf("%s: echo not redacted: headers %v body %q", base, hdr, body)
		}
		for path, want := range map[string]string{"/split": "<[redacted]>", "/gzip": "Authorization: [redacted]\n", "/trailer": "Authorization: [redacted]\n"} {
			code, body, hdr := get(t, c, base+path)
			<-seen
			if code != 200 || !strings.Contains(body, want) {
				t.Errorf("GET %s%s = %d %q, want it to contain %q", base, path, code, body, want)
			}
			if all := fmt.Sprint(hdr) + body; strings.Contains(all, secret) || strings.Contains(all, secret[len("Bearer "):]) {
				t.Errorf("GET %s%s: the secret reached the client: %v %q", base, path, hdr, body)
			}
		}
		// An encoded body the proxy cannot scrub is not passed on.
		code, body, hdr = get(t, c, base+"/br")
		<-seen
		if code != http.StatusBadGateway || !strings.Contains(body, "encoded") || strings.Contains(fmt.Sprint(hdr)+body, "s3cr3t") {
			t.Errorf("GET %s/br = %d %v %q, want 502 without the secret", base, code, hdr, body)
		}
		n += 5
		for _, d := range h.rec.wait(t, n)[n-5:] {
			if u, _ := url.Parse(base); !d.Allowed || d.Credential != "Authorization" || d.Host != u.Hostname() {
				t.Errorf("decision = %+v", d)
			}
			if strings.Contains(fmt.Sprintf("%+v", d), "s3cr3t") {
				t.Errorf("the decision holds the secret: %+v", d)
			}
		}
	}
	// A host with no credential gets a plain tunnel: the client sees the
	// upstream's own certificate, which the sandbox's CA did not sign.
	if _, err := c.Get("https://other.test:" + tport + "/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("GET other.test through the tunnel with only the sandbox CA trusted: %v, want a certificate error", err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(h.url), TLSClientConfig: &tls.Config{RootCAs: upRoots, ServerName: "api.test"}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://other.test:" + tport + "/")
	if err != nil {
		t.Fatalf("GET other.test through a tunnel: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), "Authorization") {
		t.Errorf("a host without a credential got one: %q", b)
	}
	<-seen
}

// Bounded connections: 500 clients at once get at most MaxConns
// connections served at a time, the rest wait in the listen queue, the
// process's descriptors stay bounded, and all are answered in the end.
func TestEgressMaxConns(t *testing.T) {
	const clients, maxConns = 500, 20
	release := make(chan struct{})
	var inflight, peak atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "done")
	}))
	defer up.Close()
	port := portOf(t, up.Listener.Addr().String())
	h := startProxy(t, egress.Config{
		Policy:   policy(t, "api.test:"+port, "127.0.0.1/32"),
		Resolve:  resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
		MaxConns: maxConns,
	})
	before := openFDs(t)

	var dialed atomic.Int32
	tr := &http.Transport{
		Proxy:             http.ProxyURL(h.url),
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				dialed.Add(1)
			}
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	var wg sync.WaitGroup
	var ok atomic.Int32
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get("http://api.test:" + port + "/")
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) == "done" {
				ok.Add(1)
			} else {
				errs <- fmt.Errorf("%s %q", resp.Status, b)
			}
		}()
	}
	// Every client has connected (the kernel completes the handshake for
	// the listen queue) and MaxConns requests reached the upstream.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := poll.Every(ctx, 10*time.Millisecond, func() (bool, string) {
		d, in := dialed.Load(), inflight.Load()
		return d >= clients && in >= maxConns, fmt.Sprintf("%d clients connected, %d requests upstream", d, in)
	})
	cancel()
	if err != nil {
		close(release)
		wg.Wait()
		t.Fatalf("after 30s: %v", err)
	}
	during := openFDs(t)
	atPeak := inflight.Load()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("client: %v", err)
	}
	if ok.Load() != clients {
		t.Errorf("%d of %d clients answered", ok.Load(), clients)
	}
	if atPeak != maxConns || peak.Load() != maxConns {
		t.Errorf("upstream requests at once: %d (peak %d), want exactly MaxConns=%d", atPeak, peak.Load(), maxConns)
	}
	// 500 client sockets are this process's own; the proxy adds at most one
	// accepted and one upstream socket per served connection, and the
	// upstream server one more.
	if extra := during - before; extra < clients || extra > clients+3*maxConns+20 {
		t.Errorf("open descriptors: %d before, %d with %d clients waiting (+%d), want at most +%d", before, during, clients, extra, clients+3*maxConns+20)
	}
	// Afterwards only the proxy's few idle upstream connections remain.
	var after int
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		after = openFDs(t)
		return after <= before+10, fmt.Sprintf("open descriptors: before %d, after %d", before, after)
	})
	t.Logf("open descriptors: before %d, with %d clients %d, after %d", before, clients, during, after)
	for _, d := range h.rec.wait(t, clients) {
		if !d.Allowed {
			t.Fatalf("decision %+v", d)
		}
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// Close ends open tunnels and intercepted requests still waiting on a slow
// upstream, promptly, and leaves no goroutine behind (TestMain checks).
func TestEgressClose(t *testing.T) {
	hang := make(chan struct{})
	defer close(hang)
	arrived, gone := make(chan struct{}, 1), make(chan struct{}, 1)
	tlsUp, upRoots := newUpstreamTLS(t, "slow.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-hang:
		case <-r.Context().Done():
			gone <- struct{}{}
		}
	}))
	port := portOf(t, tlsUp.Listener.Addr().String())
	echo := l2(t, "127.0.0.1:0")
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		c, err := echo.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	defer func() { echo.Close(); <-echoDone }()
	eport := portOf(t, echo.Addr().String())
	ca, _ := egress.NewCA()
	rec := &recorder{}
	p := egress.New(egress.Config{
		Policy:        policy(t, "slow.test:"+port, "echo.test:"+eport, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"slow.test": {Header: "X-Key", Value: "k"}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"slow.test": {"127.0.0.1"}, "echo.test": {"127.0.0.1"}}, nil),
		Log:           rec.add,
	})
	l := l2(t, "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- p.Serve(l) }()

	// An open tunnel.
	c, br, resp := rawConnect(t, l.Addr().String(), "echo.test:"+eport, []byte("ping"))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	if b := make([]byte, 4); func() bool { _, err := io.ReadFull(br, b); return err != nil }() || string(b) != "ping" {
		t.Fatal("no echo through the tunnel")
	}
	// An intercepted request the upstream does not answer.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: l.Addr().String()}), TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	reqErr := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get("https://slow.test:" + port + "/")
		if err == nil {
			resp.Body.Close()
			err = errors.New(resp.Status)
		}
		reqErr <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the intercepted request did not reach the upstream")
	}
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(start))
	if err := <-reqErr; err == nil {
		t.Error("the pending request succeeded after Close")
	}
	select {
	case <-gone:
	case <-time.After(3 * time.Second):
		t.Error("the proxy still waits on the upstream 3s after Close")
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Error("the tunnel is still open after Close")
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Error("the proxy still accepts connections after Close")
	}
}
