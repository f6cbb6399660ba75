package egress_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/poll"
)

// streamHeader sends head, then a header line of size bytes (written from a
// small buffer, so the client allocates nothing), then reads the answer:
// the status code, or 0 when the proxy closed the connection. It returns
// how many bytes of the line the proxy took.
func streamHeader(t *testing.T, c net.Conn, head string, size int) (code int, sent int64) {
	t.Helper()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	done := make(chan int64, 1)
	go func() {
		n, _ := io.WriteString(c, head+"X-Big: ")
		chunk := []byte(strings.Repeat("a", 64<<10))
		total := int64(n)
		for sent := 0; sent < size; sent += len(chunk) {
			m, err := c.Write(chunk)
			total += int64(m)
			if err != nil {
				break
			}
		}
		io.WriteString(c, "\r\n\r\n")
		done <- total
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err == nil {
		code = resp.StatusCode
		resp.Body.Close()
	}
	c.Close() // ends the writer if the proxy answered early
	return code, <-done
}

// heapGrowth runs f and returns the bytes allocated meanwhile (the test's
// own client allocates next to nothing).
func heapGrowth(f func()) (alloc uint64, inuse int64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, int64(after.HeapInuse) - int64(before.HeapInuse)
}

// A header line of many MiB, on a plain proxy request and inside an
// intercepted TLS connection, is cut off at the header bound (431 or a
// closed connection) and the host's heap does not grow with it.
func TestEgressHugeHeader(t *testing.T) {
	const size = 64 << 20
	up, upRoots := newUpstreamTLS(t, "api.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	port := portOf(t, up.Listener.Addr().String())
	ca, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	h := startProxy(t, egress.Config{
		Policy:        policy(t, "api.test:"+port, "127.0.0.1/32"),
		Credentials:   map[string]egress.Credential{"api.test": {Header: "X-Key", Value: "secret-value-123"}},
		CA:            ca,
		UpstreamRoots: upRoots,
		Resolve:       resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())

	for _, tc := range []struct {
		name string
		conn func() net.Conn
		head string
	}{
		{"plain", func() net.Conn {
			c, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, "GET http://api.test:" + port + "/ HTTP/1.1\r\nHost: api.test:" + port + "\r\n"},
		{"intercepted", func() net.Conn {
			c, br, resp := rawConnect(t, h.addr, "api.test:"+port, nil)
			if resp.StatusCode != 200 || br.Buffered() != 0 {
				t.Fatalf("CONNECT = %s", resp.Status)
			}
			tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: "api.test"})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			return tc
		}, "GET / HTTP/1.1\r\nHost: api.test:" + port + "\r\n"},
	} {
		c := tc.conn()
		var code int
		var sent int64
		alloc, inuse := heapGrowth(func() { code, sent = streamHeader(t, c, tc.head, size) })
		t.Logf("%s: a %d MiB header line: status %d, %d KiB sent before the proxy stopped reading, %d KiB allocated, heap in use %+d KiB",
			tc.name, size>>20, code, sent>>10, alloc>>10, inuse>>10)
		if code != 0 && code != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("%s: status %d, want 431 or a closed connection", tc.name, code)
		}
		if alloc > 8<<20 {
			t.Errorf("%s: the host allocated %d MiB for one header line, want under 8 MiB", tc.name, alloc>>20)
		}
	}
}

// echoServer accepts connections on loopback and echoes them until the test
// ends.
func echoServer(t *testing.T) net.Listener {
	t.Helper()
	l := l2(t, "127.0.0.1:0")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l
}

// closedWithin reads from br until the connection ends and returns how
// long that took (failing after max).
func closedWithin(t *testing.T, c net.Conn, br *bufio.Reader, max time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(max))
	_, err := io.Copy(io.Discard, br)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection is still open after %v", max)
	}
	return time.Since(start)
}

// A tunnel with no byte either way for IdleTimeout is closed; one with
// traffic is not. So is a kept-alive proxy connection with no next request.
func TestEgressIdleTimeout(t *testing.T) {
	const idle = 200 * time.Millisecond
	l := echoServer(t)
	port := portOf(t, l.Addr().String())
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	uport := portOf(t, up.Listener.Addr().String())
	h := startProxy(t, egress.Config{
		Policy:      policy(t, "echo.test:"+port, "api.test:"+uport, "127.0.0.1/32"),
		Resolve:     resolver(map[string][]string{"echo.test": {"127.0.0.1"}, "api.test": {"127.0.0.1"}}, nil),
		IdleTimeout: idle,
	})

	// Idle from the start.
	c, br, resp := rawConnect(t, h.addr, "echo.test:"+port, []byte("ping"))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	if d := closedWithin(t, c, br, 5*time.Second); d > 3*time.Second {
		t.Errorf("an idle tunnel was closed after %v, want about %v", d, idle)
	} else {
		t.Logf("an idle tunnel was closed after %v", d)
	}
	if d := h.rec.wait(t, 1)[0]; !d.Allowed || d.BytesUp != 4 || d.BytesDown != 4 {
		t.Errorf("decision for the idle tunnel = %+v", d)
	}

	// Busy for 3×IdleTimeout (of a second proxy with a longer timeout): a
	// byte each way every 50 ms. A machine so loaded that the client saw
	// a gap near the timeout proves nothing, and is not a failure.
	const busyIdle = 600 * time.Millisecond
	hb := startProxy(t, egress.Config{
		Policy:      policy(t, "echo.test:"+port, "127.0.0.1/32"),
		Resolve:     resolver(map[string][]string{"echo.test": {"127.0.0.1"}}, nil),
		IdleTimeout: busyIdle,
	})
	c, br, resp = rawConnect(t, hb.addr, "echo.test:"+port, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	last, maxGap := time.Now(), time.Duration(0)
	for i := 0; i < int(3*busyIdle/(50*time.Millisecond)); i++ {
		time.Sleep(50 * time.Millisecond)
		_, err := c.Write([]byte{'x'})
		if err == nil {
			_, err = br.ReadByte()
		}
		maxGap = max(maxGap, time.Since(last))
		last = time.Now()
		if err != nil {
			if maxGap > busyIdle/2 {
				t.Logf("a busy tunnel closed after a gap of %v on a loaded machine: %v", maxGap, err)
				break
			}
			t.Fatalf("exchange %d on a busy tunnel (longest gap %v): %v", i, maxGap, err)
		}
	}
	c.Close()
	hb.rec.wait(t, 1)

	// The upstream floods, the sandbox reads nothing: the proxy's write
	// blocks, and the deadline ends it.
	flood := l2(t, "127.0.0.1:0")
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		c, err := flood.Accept()
		if err != nil {
			return
		}
		io.Copy(c, zeros{})
		c.Close()
	}()
	defer func() { flood.Close(); <-floodDone }()
	fport := portOf(t, flood.Addr().String())
	h2 := startProxy(t, egress.Config{
		Policy:      policy(t, "flood.test:"+fport, "127.0.0.1/32"),
		Resolve:     resolver(map[string][]string{"flood.test": {"127.0.0.1"}}, nil),
		IdleTimeout: idle,
	})
	c, br, resp = rawConnect(t, h2.addr, "flood.test:"+fport, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %s", resp.Status)
	}
	if d := h2.rec.wait(t, 1)[0]; !d.Allowed || d.BytesDown == 0 {
		t.Errorf("decision for the flooded tunnel = %+v", d)
	} else {
		t.Logf("a tunnel the sandbox stopped reading: closed after %d KiB", d.BytesDown>>10)
	}
	closedWithin(t, c, br, 5*time.Second)

	// A kept-alive connection with no next request.
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://api.test:"+uport+"/ HTTP/1.1\r\nHost: api.test:"+uport+"\r\n\r\n")
	br = bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	if d := closedWithin(t, c, br, 5*time.Second); d > 3*time.Second {
		t.Errorf("an idle kept-alive connection was closed after %v", d)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Close returns promptly when every connection slot is taken (the accept
// loop waits for a free slot) and closes the listener.
func TestEgressCloseAtMaxConns(t *testing.T) {
	l := echoServer(t)
	port := portOf(t, l.Addr().String())
	p := egress.New(egress.Config{
		Policy:   policy(t, "echo.test:"+port, "127.0.0.1/32"),
		Resolve:  resolver(map[string][]string{"echo.test": {"127.0.0.1"}}, nil),
		MaxConns: 2,
	})
	pl := l2(t, "127.0.0.1:0")
	served := make(chan error, 1)
	go func() { served <- p.Serve(pl) }()
	for range 2 {
		if _, _, resp := rawConnect(t, pl.Addr().String(), "echo.test:"+port, nil); resp.StatusCode != 200 {
			t.Fatalf("CONNECT = %s", resp.Status)
		}
	}
	// A third connection waits in the listen queue.
	c, err := net.Dial("tcp", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		return egress.Full(p), "the accept loop does not wait for a free slot with every slot taken"
	})
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s with every connection slot taken")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if c, err := net.Dial("tcp", pl.Addr().String()); err == nil {
		c.Close()
		t.Error("the proxy still accepts connections after Close")
	}
}

// An upstream's response head beyond MaxResponseHeaderBytes is a 502, and
// the proxy does not hold it: the upstream streams a 64 MiB header line.
func TestEgressHugeResponseHeader(t *testing.T) {
	l := l2(t, "127.0.0.1:0")
	upDone := make(chan struct{})
	go func() {
		defer close(upDone)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: ")
		chunk := []byte(strings.Repeat("b", 64<<10))
		for range 1024 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	defer func() { l.Close(); <-upDone }()
	port := portOf(t, l.Addr().String())
	h := startProxy(t, egress.Config{
		Policy:  policy(t, "api.test:"+port, "127.0.0.1/32"),
		Resolve: resolver(map[string][]string{"api.test": {"127.0.0.1"}}, nil),
	})
	c := h.client(t, nil)
	var code int
	var body string
	alloc, _ := heapGrowth(func() { code, body, _ = get(t, c, "http://api.test:"+port+"/") })
	t.Logf("a 64 MiB response header line: %d %q, %d KiB allocated", code, body, alloc>>10)
	if code != http.StatusBadGateway || !strings.Contains(body, "exceeded") {
		t.Errorf("GET = %d %q, want 502 (response headers exceeded)", code, body)
	}
	if alloc > 16<<20 { // 1 MiB read as a growing line, and copies
		t.Errorf("%d MiB allocated for one response header line, want under 16 MiB", alloc>>20)
	}
}
