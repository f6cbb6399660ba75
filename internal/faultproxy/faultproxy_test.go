package faultproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/internal/poll"
)

// These tests run without Docker: the proxy stands in front of a local echo
// server on a unix socket.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every connection back (passing a half-close on) and
// records what it received, per connection.
type echoServer struct {
	path string
	ln   net.Listener
	wg   sync.WaitGroup
	got  chan string // each chunk read, as it arrives
	// ended counts the connections the server is done with: all they
	// carried to it is in got.
	ended atomic.Int32
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	e := &echoServer{path: filepath.Join(t.TempDir(), "echo.sock"), got: make(chan string, 100)}
	var err error
	if e.ln, err = net.Listen("unix", e.path); err != nil {
		t.Fatal(err)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := e.ln.Accept()
			if err != nil {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer e.ended.Add(1)
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						select {
						case e.got <- string(buf[:n]):
						default:
						}
						c.Write(buf[:n])
					}
					if err != nil {
						c.(*net.UnixConn).CloseWrite()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { e.ln.Close(); e.wg.Wait() })
	return e
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) *net.UnixConn {
	t.Helper()
	c, err := net.Dial("unix", p.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

// readWithin reads exactly len(want) bytes within d, or reports what came.
func readWithin(c net.Conn, n int, d time.Duration) (string, error) {
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, n)
	k, err := io.ReadFull(c, buf)
	return string(buf[:k]), err
}

func TestForwardAndHalfClose(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	c := dial(t, p)
	msg := strings.Repeat("0123456789", 10000) // more than one pump buffer
	go func() {
		c.Write([]byte(msg))
		c.CloseWrite() // the echo server sees EOF only if the half-close is passed on
	}()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != msg {
		t.Fatalf("echo through the proxy: %d bytes, %v; want %d bytes", len(got), err, len(msg))
	}
	c.Close()
	waitConns(t, p, 0)
}

func TestHook(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	var mu sync.Mutex
	var seen []Request
	p.OnRequest(func(r Request) { mu.Lock(); seen = append(seen, r); mu.Unlock() })

	c1 := dial(t, p)
	req := "GET /v1.41/containers/json?all=1 HTTP/1.1\r\nHost: docker\r\n\r\n"
	c1.Write([]byte(req))
	if got, err := readWithin(c1, len(req), 5*time.Second); err != nil {
		t.Fatalf("echo: %q, %v", got, err)
	}
	// Not a request line at the start of a read: not reported.
	body := "body bytes POST /x HTTP/1.1\r\n"
	c1.Write([]byte(body))
	readWithin(c1, len(body), 5*time.Second)

	// An upgrade request, then raw stream bytes that look like a request.
	c2 := dial(t, p)
	up := "POST /v1.41/containers/abc/attach?stream=1 HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
	c2.Write([]byte(up))
	readWithin(c2, len(up), 5*time.Second)
	raw := "DELETE /v1.41/containers/abc HTTP/1.1\r\n\r\n"
	c2.Write([]byte(raw))
	readWithin(c2, len(raw), 5*time.Second)

	mu.Lock()
	defer mu.Unlock()
	want := []Request{
		{N: 1, Conn: 1, Method: "GET", Path: "/v1.41/containers/json?all=1"},
		{N: 2, Conn: 2, Method: "POST", Path: "/v1.41/containers/abc/attach?stream=1"},
	}
	if len(seen) != len(want) {
		t.Fatalf("hook saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, seen[i], want[i])
		}
	}
	if p.Requests() != 2 {
		t.Errorf("Requests() = %d", p.Requests())
	}
}

func TestFreezeThaw(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	c := dial(t, p)
	c.Write([]byte("a"))
	if got, err := readWithin(c, 1, 5*time.Second); got != "a" {
		t.Fatalf("before Freeze: %q, %v", got, err)
	}

	// "a" came back: the server has it.
	if s := <-e.got; s != "a" {
		t.Fatalf("the server saw %q before the freeze, want \"a\"", s)
	}

	p.Freeze()
	c.Write([]byte("b"))
	waitHeld(t, p, 1) // c's client→engine pump, holding "b"
	select {
	case s := <-e.got:
		t.Fatalf("the server saw %q while frozen", s)
	default:
	}
	// A new connection is accepted but held: its dial of the engine waits.
	c2 := dial(t, p)
	c2.Write([]byte("c"))
	waitHeld(t, p, 2)
	if n := p.Conns(); n != 2 {
		t.Fatalf("%d connections open while frozen, want 2 (the new one accepted)", n)
	}
	select {
	case s := <-e.got:
		t.Fatalf("the server saw %q while frozen", s)
	default:
	}

	p.Thaw()
	if got, err := readWithin(c, 1, 5*time.Second); got != "b" {
		t.Errorf("after Thaw: %q, %v", got, err)
	}
	if got, err := readWithin(c2, 1, 5*time.Second); got != "c" {
		t.Errorf("held connection after Thaw: %q, %v", got, err)
	}
}

func TestFreezeReplies(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	c := dial(t, p)
	p.FreezeReplies()
	c.Write([]byte("x"))
	select {
	case s := <-e.got:
		if s != "x" {
			t.Fatalf("server got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not reach the server while only replies were frozen")
	}
	waitHeld(t, p, 1) // c's engine→client pump, holding the reply
	p.Thaw()
	if got, err := readWithin(c, 1, 5*time.Second); got != "x" {
		t.Errorf("after Thaw: %q, %v", got, err)
	}
}

func TestCut(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	c := dial(t, p)
	c.Write([]byte("w")) // both connections forwarded before the Freeze
	readWithin(c, 1, 5*time.Second)
	frozen := dial(t, p)
	frozen.Write([]byte("y"))
	readWithin(frozen, 1, 5*time.Second)
	p.Freeze() // pumps blocked in a frozen gate must end too
	frozen.Write([]byte("z"))
	waitHeld(t, p, 1)

	p.Cut()
	for _, cc := range []net.Conn{c, frozen} {
		cc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(cc).ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read after Cut: %v, want the connection closed", err)
		}
	}
	_, err := net.Dial("unix", p.Path)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after Cut: %v, want connection refused", err)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close after Cut did not return")
	}
	if _, err := os.Stat(p.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v", err)
	}
}

func TestCutFromHook(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	p.OnRequest(func(r Request) {
		if strings.Contains(r.Path, "/start") {
			p.Cut()
		}
	})
	c := dial(t, p)
	c.Write([]byte("POST /v1.41/containers/x/start HTTP/1.1\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); len(b) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("after a Cut from the hook: %q, %v; want closed with nothing", b, err)
	}
	// Once the proxy let go of the connection and the server is done with
	// its side, whatever reached the server is in e.got.
	waitConns(t, p, 0)
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		n := e.ended.Load()
		return n == 1, fmt.Sprintf("the server ended %d connections, want 1", n)
	})
	select {
	case s := <-e.got:
		t.Errorf("the server saw %q after the Cut", s)
	default:
	}
}

func TestCloseWhileFrozen(t *testing.T) {
	e := newEcho(t)
	p := startProxy(t, e.path)
	c := dial(t, p)
	p.Freeze()
	c.Write([]byte("q"))
	dial(t, p)        // held in serve
	waitHeld(t, p, 2) // "q" (or c's dial of the engine) and the new dial
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of a frozen proxy did not return")
	}
}

func TestTarget(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///run/other.sock")
	if got := Target(); got != "/run/other.sock" {
		t.Errorf("Target() = %q", got)
	}
	t.Setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
	if got := Target(); got != DefaultSocket {
		t.Errorf("Target() with tcp DOCKER_HOST = %q", got)
	}
}

// waitHeld waits until n goroutines of p wait for a frozen direction.
func waitHeld(t *testing.T, p *Proxy, n int) {
	t.Helper()
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		h := p.held()
		return h == n, fmt.Sprintf("%d goroutines held by the freeze, want %d", h, n)
	})
}

func waitConns(t *testing.T, p *Proxy, n int) {
	t.Helper()
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		c := p.Conns()
		return c == n, fmt.Sprintf("%d connections open, want %d", c, n)
	})
}
