package egress_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/agentsandbox/sandbox/internal/egress"
)

// Names not on the allow-list are never resolved: a DNS query for
// x.y.evil would carry data out. Requests, absolute https:// URLs,
// CONNECTs and fronted requests inside an intercepted connection are all
// refused before any lookup, with name rules, CIDR rules only, or both.
func TestEgressNoResolveForDenied(t *testing.T) {
	names := []string{"evil.test", "x.y.evil", "secret-data.x.y.evil", "a.ok.test.evil", "ok.test", "api.test.evil", "API.TEST.EVIL."}
	ca, _ := egress.NewCA()
	for _, pol := range [][]string{
		{"127.0.0.1/32"},
		{"10.0.0.0/8", "fd00::/8"},
		{"api.test", "*.ok.test", "127.0.0.1/32"},
	} {
		var lookups atomic.Int32
		h := startProxy(t, egress.Config{
			Policy:      policy(t, pol...),
			Credentials: map[string]egress.Credential{"api.test": {Header: "X-Key", Value: "k-0123456789"}},
			CA:          ca,
			Resolve:     resolver(map[string][]string{}, &lookups),
		})
		c := h.client(t, nil)
		n := 0
		for _, name := range names {
			for _, u := range []string{"http://" + name + "/", "http://" + name + ":8080/"} {
				if code, body, _ := get(t, c, u); code != http.StatusForbidden {
					t.Errorf("%v: GET %s = %d %q, want 403", pol, u, code, body)
				}
				n++
			}
			for _, target := range []string{name + ":443", name + ":22"} {
				_, _, resp := rawConnect(t, h.addr, target, nil)
				if resp.StatusCode != http.StatusForbidden {
					t.Errorf("%v: CONNECT %s = %s, want 403", pol, target, resp.Status)
				}
				n++
			}
			pc, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			if code, _ := rawRequest(t, pc, bufio.NewReader(pc), "GET https://"+name+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n"); code != http.StatusForbidden {
				t.Errorf("%v: GET https://%s through the plain proxy = %d, want 403", pol, name, code)
			}
			pc.Close()
			n++
		}
		// Fronting inside an intercepted connection (api.test is allowed
		// only by the third policy).
		if pol[0] == "api.test" {
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(ca.CertPEM())
			conn, _, resp := rawConnect(t, h.addr, "api.test:443", nil)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT api.test = %s", resp.Status)
			}
			tc := tls.Client(conn, &tls.Config{RootCAs: roots, ServerName: "api.test"})
			br := bufio.NewReader(tc)
			for _, name := range names {
				if code, _ := rawRequest(t, tc, br, "GET / HTTP/1.1\r\nHost: "+name+"\r\n\r\n"); code != http.StatusForbidden {
					t.Errorf("Host %s inside api.test = %d, want 403", name, code)
				}
				n++
			}
		}
		for _, d := range h.rec.wait(t, n) {
			if d.Allowed {
				t.Errorf("%v: allowed %+v", pol, d)
			}
		}
		if l := lookups.Load(); l != 0 {
			t.Errorf("%v: %d lookups for names not allowed", pol, l)
		}
		// The counter works: an allowed name is looked up (and unknown).
		if pol[0] == "api.test" {
			if code, _, _ := get(t, c, "http://a.ok.test/"); code != http.StatusBadGateway || lookups.Load() != 1 {
				t.Errorf("allowed a.ok.test: %d, %d lookups; want 502 after 1", code, lookups.Load())
			}
		}
	}
}
