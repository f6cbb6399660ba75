package egress_test

import (
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/internal/egress"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FuzzRequestHead feeds arbitrary bytes as the start of a sandbox's
// connection to a fresh proxy (allowing a local upstream by name, by
// address and as a credential host, so requests, tunnels and interception
// are all reachable), then ends the connection's sending side. The proxy
// must not panic, must answer or close within a bound, and Close must
// return promptly with no goroutine left.
func FuzzRequestHead(f *testing.F) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		io.WriteString(w, "upstream")
	}))
	up.Config.SetKeepAlivesEnabled(false)
	up.Start()
	f.Cleanup(up.Close)
	ps := strings.TrimPrefix(up.Listener.Addr().String(), "127.0.0.1:")
	ca, err := egress.NewCA()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"GET http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test:" + ps + "\r\n\r\n",
		"GET http://127.0.0.1:" + ps + "/x?y=z HTTP/1.1\r\nHost: 127.0.0.1:" + ps + "\r\nConnection: close\r\n\r\n",
		"POST http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nhello",
		"POST http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"POST http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\nshort",
		"GET http://api.test:" + ps + "/ HTTP/1.1\r\nHost: api.test\r\n\r\nGET http://api.test:" + ps + "/2 HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"GET https://cred.test:" + ps + "/ HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"GET http://cred.test:" + ps + "/ HTTP/1.1\r\nHost: cred.test\r\n\r\n",
		"CONNECT api.test:" + ps + " HTTP/1.1\r\nHost: api.test:" + ps + "\r\n\r\nGET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"CONNECT cred.test:" + ps + " HTTP/1.1\r\nHost: cred.test:" + ps + "\r\n\r\n\x16\x03\x01\x00\x05hello",
		"CONNECT cred.test:443 HTTP/1.1\r\n\r\n",
		"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n",
		"CONNECT :0 HTTP/1.1\r\n\r\n",
		"CONNECT [::1 HTTP/1.1\r\n\r\n",
		"CONNECT api.test:99999 HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://api.test:" + ps + "/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET http://api.test:" + ps + "/ HTTP/1.1\r\nbad header\r\n\r\n",
		"GET http://api.test:" + ps + "/ HTTP/1.1\r\nX: " + strings.Repeat("a", 70<<10) + "\r\n\r\n",
		"GET http://x.y.evil/ HTTP/1.0\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"GET\r\n\r\n",
		"\x00\x01\x02\xff",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		before := goleak.IgnoreCurrent()
		var logs syncBuffer
		p := egress.New(egress.Config{
			Policy:      policy(t, "api.test:"+ps, "cred.test:"+ps, "cred.test", "127.0.0.1/32"),
			Credentials: map[string]egress.Credential{"cred.test": {Header: "X-Key", Value: "k-0123456789", AllowHTTP: true}},
			CA:          ca,
			Resolve:     resolver(map[string][]string{"api.test": {"127.0.0.1"}, "cred.test": {"127.0.0.1"}}, nil),
			MaxConns:    4,
			IdleTimeout: time.Second,
			ErrorLog:    log.New(&logs, "", 0),
		})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- p.Serve(l) }()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const bound = 5 * time.Second
		c.SetDeadline(time.Now().Add(bound))
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			c.Write(head)
			c.(*net.TCPConn).CloseWrite()
		}()
		_, err = io.Copy(io.Discard, c)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("the proxy neither answered nor closed within %v", bound)
		}
		c.Close()
		<-wrote
		closed := make(chan error, 1)
		go func() { closed <- p.Close() }()
		select {
		case <-closed:
		case <-time.After(bound):
			t.Fatalf("Close did not return within %v", bound)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if strings.Contains(logs.String(), "panic") {
			t.Errorf("the proxy panicked:\n%s", logs.String())
		}
		if err := goleak.Find(before); err != nil {
			t.Errorf("goroutines left after Close: %v", err)
		}
	})
}
