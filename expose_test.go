package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// holdPy accepts connections on 127.0.0.1:PORT and holds them without
// reading or answering: a hung web app.
const holdPy = `
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1024)
print("listening", flush=True)
held = []
while True:
    c, _ = s.accept()
    held.append(c)
`

// holdLimits keeps a holding server running for the whole test.
var holdLimits = sandbox.WithLimits(sandbox.Limits{ExecTimeout: time.Hour})

// startHold starts holdPy on port in sb and waits until it listens.
func startHold(t *testing.T, sb *sandbox.Sandbox, port string) {
	t.Helper()
	ctx, stop := context.WithCancel(testCtx(t))
	cmd := sb.Command(ctx, "python3", "-c", holdPy, port)
	out, _ := cmd.StdoutPipe()
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		if err := cmd.Wait(); !strings.Contains(fmt.Sprint(err), "killed") {
			t.Errorf("the holding server ended before the test: %v %s", err, errOut.String())
		}
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "listening\n" {
		t.Fatalf("the holding server: %q %v", line, err)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(es)
}

// hostFigures are the host's costs measured by the Expose tests.
type hostFigures struct {
	fds, goroutines int
	heap            int64
}

func measure(t *testing.T) hostFigures {
	return hostFigures{fds: openFDs(t), goroutines: runtime.NumGoroutine(), heap: heapNow()}
}

// closedClients connects n clients to addr, 100 at a time; each sends a
// request and closes without waiting for an answer.
func closedClients(t *testing.T, addr string, n int) {
	t.Helper()
	for done := 0; done < n; done += 100 {
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		for range min(100, n-done) {
			wg.Go(func() {
				c, err := net.DialTimeout("tcp", addr, 20*time.Second)
				if err != nil {
					errs <- err
					return
				}
				io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				c.Close()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("client: %v", err)
		}
	}
}

// Every connection to an Expose URL whose host client has closed goes,
// with its descriptors and goroutines, within the library's bound, even
// when the sandbox's server never reads or answers (the red team's probe:
// 800 such clients). Serial: it counts the process's descriptors and
// goroutines.
func TestExposeClosedClients(t *testing.T) {
	// The cap raised, so that every client is served rather than refused;
	// no idle bound in reach: it is the end of the client that counts.
	sb := newPython(t, holdLimits, sandbox.WithTestExposeBounds(time.Hour, 2*time.Second, 1024))
	startHold(t, sb, "8000")
	ctx := testCtx(t)
	u, err := sb.Expose(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	base := measure(t)
	closedClients(t, strings.TrimPrefix(u, "http://"), 800)
	peak := measure(t)
	t.Logf("800 closed clients: descriptors %d → %d, goroutines %d → %d, heap %+d KiB",
		base.fds, peak.fds, base.goroutines, peak.goroutines, (peak.heap-base.heap)>>10)
	var now hostFigures
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		now = measure(t)
		return now.fds <= base.fds && now.goroutines <= base.goroutines,
			fmt.Sprintf("%d descriptors (baseline %d), %d goroutines (baseline %d), heap %+d KiB: the closed clients' connections are held",
				now.fds, base.fds, now.goroutines, base.goroutines, (now.heap-base.heap)>>10)
	})
	t.Logf("back to %d descriptors, %d goroutines, heap %+d KiB", now.fds, now.goroutines, (now.heap-base.heap)>>10)
	// In the sandbox, the agent closed its ends (the server holds its own).
	waitHeld(t, sb, 8000, 0)
}

// heldIn counts the established connections to port in the sandbox made
// by its agent (the server's ends are not counted).
func heldIn(t *testing.T, sb *sandbox.Sandbox, port int) int {
	t.Helper()
	r := mustExec(t, sb, "cat /proc/net/tcp")
	n := 0
	for _, line := range strings.Split(r.Stdout, "\n")[1:] {
		f := strings.Fields(line)
		// sl local_address rem_address st ...; 01 is ESTABLISHED
		if len(f) > 3 && strings.HasSuffix(f[2], fmt.Sprintf(":%04X", port)) && f[3] == "01" {
			n++
		}
	}
	return n
}

// waitHeld polls until the sandbox holds want connections to port.
func waitHeld(t *testing.T, sb *sandbox.Sandbox, port, want int) {
	t.Helper()
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		n := heldIn(t, sb, port)
		return n == want, fmt.Sprintf("the sandbox holds %d connections to port %d, want %d", n, port, want)
	})
}

// A connection through an Expose URL on which nothing moves is closed at
// the idle bound, on the host and in the sandbox.
func TestExposeIdle(t *testing.T) {
	t.Parallel()
	sb := newPython(t, holdLimits, sandbox.WithTestExposeBounds(time.Second, time.Hour, 16))
	startHold(t, sb, "8000")
	u, err := sb.Expose(testCtx(t), 8000)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(u, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitHeld(t, sb, 8000, 1)
	c.SetReadDeadline(time.Now().Add(testenv.HangGuard))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("reading an idle connection: %d, %v; want EOF", n, err)
	}
	waitHeld(t, sb, 8000, 0)
}

// echoPy answers each line of each connection with "pong LINE", many
// connections at once.
const echoPy = `
import asyncio, sys
async def handle(r, w):
    while True:
        line = await r.readline()
        if not line:
            break
        w.write(b"pong " + line)
        await w.drain()
    w.close()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    print("listening", flush=True)
    await srv.serve_forever()
asyncio.run(main())
`

// ping sends a line on c and checks the answer.
func ping(c net.Conn, r *bufio.Reader, line string) error {
	c.SetDeadline(time.Now().Add(testenv.HangGuard))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != "pong "+line+"\n" {
		return fmt.Errorf("answer %q", got)
	}
	return nil
}

// A sandbox has at most the cap of Expose connections open (all ports
// together): one more is closed at once and logged, those held keep
// working, and a slot freed is taken again.
func TestExposeCap(t *testing.T) {
	t.Parallel()
	var audit netLog
	sb := newPython(t, holdLimits, sandbox.WithLogger(audit.logger()))
	ctx := testCtx(t)
	for _, port := range []string{"8000", "8001"} {
		cctx, stop := context.WithCancel(ctx)
		cmd := sb.Command(cctx, "python3", "-c", echoPy, port)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop(); cmd.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "listening\n" {
			t.Fatalf("the echo server: %q %v", line, err)
		}
	}
	var addrs [2]string
	for i, port := range []int{8000, 8001} {
		u, err := sb.Expose(ctx, port)
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = strings.TrimPrefix(u, "http://")
	}
	const limit = sandbox.ExposeMaxConns
	type held struct {
		c net.Conn
		r *bufio.Reader
	}
	hs := make([]held, limit)
	for i := range hs {
		c, err := net.Dial("tcp", addrs[i%2])
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hs[i] = held{c, bufio.NewReader(c)}
		if err := ping(c, hs[i].r, "a"+strconv.Itoa(i)); err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
	}
	for i, addr := range addrs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// Closed without a byte: an end or a reset (the request unread).
		c.SetReadDeadline(time.Now().Add(testenv.HangGuard))
		io.WriteString(c, "over\n")
		if n, err := c.Read(make([]byte, 64)); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connection %d past the cap on %s: %d bytes, %v; want it closed", i+1, addr, n, err)
		}
		c.Close()
	}
	if rs := audit.records(t, "sandbox.expose.refused"); len(rs) != 2 || rs[0]["max_connections"] != float64(limit) ||
		rs[0]["port"] != float64(8000) || rs[1]["port"] != float64(8001) || rs[0]["level"] != "WARN" {
		t.Errorf("refusal records: %v", rs)
	}
	for i, h := range hs {
		if err := ping(h.c, h.r, "b"+strconv.Itoa(i)); err != nil {
			t.Fatalf("held connection %d after the refusals: %v", i+1, err)
		}
	}
	// A slot freed is taken again (once the library has seen the close).
	hs[0].c.Close()
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		c, err := net.Dial("tcp", addrs[1])
		if err != nil {
			t.Fatal(err)
		}
		err = ping(c, bufio.NewReader(c), "again")
		c.Close()
		return err == nil, fmt.Sprintf("no connection served after one of the held closed: %v", err)
	})
}

// cookiePy serves GET /login (setting an HttpOnly session cookie named
// after argv[2]) and GET / (echoing the Cookie header).
const cookiePy = `
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cookie=%s" % self.headers.get("Cookie", "")).encode()
        self.send_response(200)
        if self.path == "/login":
            self.send_header("Set-Cookie", "session=%s; HttpOnly; Path=/" % sys.argv[2])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("listening", flush=True)
srv.serve_forever()
`

// Two sandboxes' Expose URLs have different hosts, so a cookie jar (a
// browser, an agent's HTTP tool) does not carry one's session cookie to
// the other; one sandbox's ports share its host.
func TestExposeCookies(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	var urls [2]string
	for i, name := range []string{"alpha", "beta"} {
		sb := newPython(t)
		cctx, stop := context.WithCancel(ctx)
		cmd := sb.Command(cctx, "python3", "-c", cookiePy, "8000", name)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop(); cmd.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); line != "listening\n" {
			t.Fatalf("the cookie server: %q %v", line, err)
		}
		u, err := sb.Expose(ctx, 8000)
		if err != nil {
			t.Fatal(err)
		}
		urls[i] = u
		other, err := sb.Expose(ctx, 9000)
		if err != nil {
			t.Fatal(err)
		}
		if host(t, other) != host(t, u) {
			t.Errorf("one sandbox's URLs %s and %s have different hosts", u, other)
		}
	}
	t.Logf("URLs: %s %s", urls[0], urls[1])
	if host(t, urls[0]) == host(t, urls[1]) {
		t.Errorf("two sandboxes' URLs %s and %s share a host", urls[0], urls[1])
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: testenv.HangGuard}
	get := func(u string) string {
		t.Helper()
		resp, err := hc.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	get(urls[0] + "/login")
	if got := get(urls[0] + "/"); got != "cookie=session=alpha" {
		t.Errorf("the first sandbox got %q, want its session cookie", got)
	}
	if got := get(urls[1] + "/"); got != "cookie=" {
		t.Errorf("the second sandbox got %q: the first's cookie crossed", got)
	}
}

func host(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Hostname()
}

// A client that half-closes (sends its request, then ends its side) still
// gets the answer a server sends after reading that end.
func TestExposeHalfClose(t *testing.T) {
	t.Parallel()
	sb := newPython(t)
	ctx, stop := context.WithCancel(testCtx(t))
	defer stop()
	cmd := sb.Command(ctx, "python3", "-c", `
import socket
s = socket.socket()
s.bind(("127.0.0.1", 8000))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    n += len(b)
c.sendall(b"read %d bytes to the end\n" % n)
c.close()
`)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "listening\n" {
		t.Fatalf("the server: %q %v", line, err)
	}
	u, err := sb.Expose(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(u, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testenv.HangGuard))
	io.WriteString(c, "0123456789")
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if string(got) != "read 10 bytes to the end\n" || err != nil {
		t.Errorf("answer after the half-close: %q, %v", got, err)
	}
}
