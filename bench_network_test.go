package sandbox_test

// Benchmarks of the network policies beside their floors (see
// bench_test.go for the conventions and how to run them):
//
//	go test -c -o /tmp/sandbox.bench .
//	for i in $(seq 8); do
//		/tmp/sandbox.bench -test.run '^$' -test.bench NewNetwork -test.benchtime 2x
//		/tmp/sandbox.bench -test.run '^$' -test.bench Proxy100 -test.benchtime 4x
//		/tmp/sandbox.bench -test.run '^$' -test.bench Expose -test.benchtime 500x
//	done > /tmp/bench-net.txt
//	benchstat -col /impl -filter '.name:NewNetwork' /tmp/bench-net.txt
//	benchstat -col /impl -filter '.name:Proxy100' /tmp/bench-net.txt
//	benchstat -col /impl -filter '.name:Expose' /tmp/bench-net.txt
//
// Every network touched is local: the proxy's upstream is an httptest
// server on 127.0.0.1 (api.test resolves to it through the test resolver),
// the exposed server runs in the sandbox, and the floors reach the same
// servers from the host directly.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// BenchmarkNewNetwork measures New and Close of a busybox sandbox with an
// allow-list (its own internal network, firewall rules and an egress
// proxy) against the same without a network (impl=none, the floor).
func BenchmarkNewNetwork(b *testing.B) {
	run := func(opts ...sandbox.Option) func(b *testing.B) {
		return func(b *testing.B) {
			ctx := b.Context()
			opts := append([]sandbox.Option{sandbox.WithImage(busyboxImage)}, opts...)
			cpu := cpuTime()
			for b.Loop() {
				sb, err := sandbox.New(ctx, opts...)
				if err != nil {
					b.Fatal(err)
				}
				if err := sb.Close(); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		}
	}
	b.Run("impl=none", run())
	b.Run("impl=allowlist", run(sandbox.WithNetwork(sandbox.AllowHosts("api.test"))))
}

// benchGetter makes GETs with the host's Go client and checks the answer.
type benchGetter struct {
	tr   *http.Transport
	hc   *http.Client
	want string
}

// newBenchGetter returns a client through proxy (nil: direct), with or
// without keep-alive, whose idle connections are closed when the benchmark
// ends.
func newBenchGetter(b *testing.B, proxy *url.URL, keepAlive bool, want string) *benchGetter {
	tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 4}
	if proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	b.Cleanup(tr.CloseIdleConnections)
	return &benchGetter{tr: tr, hc: &http.Client{Transport: tr, Timeout: 20 * time.Second}, want: want}
}

func (g *benchGetter) get(u string) error {
	resp, err := g.hc.Get(u)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("GET %s: %v", u, err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != g.want {
		return fmt.Errorf("GET %s = %s %q, want 200 %q", u, resp.Status, body, g.want)
	}
	return nil
}

// proxyLoopPy makes argv[2] sequential GETs of argv[1] with urllib (through
// HTTP_PROXY; a new connection each) and checks each answer is argv[3].
const proxyLoopPy = `
import sys, urllib.request
url, n, want = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for i in range(n):
    with urllib.request.urlopen(url, timeout=20) as r:
        body = r.read().decode()
        if r.status != 200 or body != want:
            sys.exit("request %d: %d %r" % (i, r.status, body))
print(n)
`

// BenchmarkProxy100 measures 100 sequential HTTP GETs of a local upstream
// through a sandbox's egress proxy.
//
//   - impl=floor: the host's Go client straight to the upstream, a new
//     connection per request (as urllib makes).
//   - impl=host-via-proxy: the same client through the library's proxy
//     (on the sandbox network's gateway): the proxy's own cost. The
//     client opens a connection to the proxy per request; the proxy keeps
//     its upstream connection alive.
//   - impl=python-noreq: one Exec of the python loop with 0 requests:
//     the fixed cost (exec, python start, urllib import) of impl=library.
//   - impl=library: one Exec of a python loop of 100 urllib requests from
//     inside an allow-listed sandbox through the proxy.
//
// req-ns is the wall-clock time per request (op ÷ 100); for impl=library
// it includes the fixed cost that impl=python-noreq measures.
func BenchmarkProxy100(b *testing.B) {
	const n = 100
	const want = "ok"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, want)
	}))
	b.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	sb := newPython(b,
		sandbox.WithNetwork(sandbox.AllowHosts("api.test:"+port, "127.0.0.1/32")),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})))
	ctx := b.Context()
	if err := sb.WriteFile(ctx, "loop.py", []byte(proxyLoopPy), 0o644); err != nil {
		b.Fatal(err)
	}
	r, err := sb.Exec(ctx, "printenv HTTP_PROXY")
	if err != nil {
		b.Fatal(err)
	}
	proxy, err := url.Parse(strings.TrimSpace(r.Stdout))
	if r.ExitCode != 0 || err != nil || proxy.Host == "" {
		b.Fatalf("HTTP_PROXY in the sandbox: %q %q", r.Stdout, r.Stderr)
	}
	target := "http://api.test:" + port + "/"

	perReq := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "req-ns")
	}
	host := func(direct string, proxy *url.URL) func(b *testing.B) {
		return func(b *testing.B) {
			g := newBenchGetter(b, proxy, false, want)
			cpu := cpuTime()
			for b.Loop() {
				for range n {
					if err := g.get(direct); err != nil {
						b.Fatal(err)
					}
				}
			}
			reportCPU(b, cpu)
			perReq(b)
		}
	}
	py := func(count int) func(b *testing.B) {
		return func(b *testing.B) {
			script := fmt.Sprintf("python3 loop.py %s %d %q", target, count, want)
			cpu := cpuTime()
			for b.Loop() {
				r, err := sb.Exec(ctx, script)
				if err != nil {
					b.Fatal(err)
				}
				if r.ExitCode != 0 || r.Stdout != strconv.Itoa(count)+"\n" {
					b.Fatalf("%s: exit %d, stdout %q, stderr %q", script, r.ExitCode, r.Stdout, r.Stderr)
				}
			}
			reportCPU(b, cpu)
			if count > 0 {
				perReq(b)
			}
		}
	}
	b.Run("impl=floor", host(up.URL+"/", nil))
	b.Run("impl=host-via-proxy", host(target, proxy))
	b.Run("impl=python-noreq", py(0))
	b.Run("impl=library", py(n))
}

// exposeServerPy serves a fixed body on port 8000 with HTTP/1.1 keep-alive
// (http.server's default handler speaks HTTP/1.0 and closes every
// connection).
const exposeServerPy = `
import http.server
BODY = b"hello from the sandbox\n"
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// BenchmarkExpose measures one GET of a python http.server in a sandbox:
// through the Expose URL of a sandbox with no network (impl=library: a
// host loopback listener, each connection relayed by the agent over its
// stream) and straight to the address of an Open sandbox on its bridge
// (impl=floor: the kernel's network path, root only). conn=new opens a
// connection per request; conn=keepalive reuses one.
func BenchmarkExpose(b *testing.B) {
	const want = "hello from the sandbox\n"
	ctx := b.Context()
	// serve runs the server in a new sandbox and waits for it.
	serve := func(opts ...sandbox.Option) *sandbox.Sandbox {
		sb := newPython(b, opts...)
		srvCtx, stop := context.WithCancel(context.Background())
		srv := sb.Command(srvCtx, "python3", "-c", exposeServerPy)
		var srvErr strings.Builder
		srv.Stderr = &srvErr
		if err := srv.Start(); err != nil {
			stop()
			b.Fatal(err)
		}
		b.Cleanup(func() { stop(); srv.Wait() }) // before the sandbox's Close
		if out, err := sb.Command(ctx, "python3", "-c", waitListenPy, "127.0.0.1", "8000").CombinedOutput(); err != nil {
			b.Fatalf("the server does not listen: %v: %s (server: %s)", err, out, srvErr.String())
		}
		return sb
	}
	sb := serve() // no network: Expose goes through the agent
	exposed, err := sb.Expose(ctx, 8000)
	if err != nil {
		b.Fatal(err)
	}
	open := serve(sandbox.WithNetwork(sandbox.NetworkPolicy{Open: true}))
	info, err := benchClient(b).ContainerInspect(ctx, open.ID())
	if err != nil {
		b.Fatal(err)
	}
	ip := ""
	for name, ep := range info.NetworkSettings.Networks {
		if strings.HasPrefix(name, "agentsandbox-") {
			ip = ep.IPAddress
		}
	}
	if ip == "" {
		b.Fatalf("the open sandbox has no address on its network: %v", info.NetworkSettings.Networks)
	}
	direct := "http://" + net.JoinHostPort(ip, "8000") + "/"

	get := func(u string, keepAlive bool) func(b *testing.B) {
		return func(b *testing.B) {
			g := newBenchGetter(b, nil, keepAlive, want)
			if keepAlive { // the first request opens the connection
				if err := g.get(u); err != nil {
					b.Fatal(err)
				}
			}
			cpu := cpuTime()
			for b.Loop() {
				if err := g.get(u); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		}
	}
	b.Run("conn=new/impl=floor", get(direct, false))
	b.Run("conn=new/impl=library", get(exposed+"/", false))
	b.Run("conn=keepalive/impl=floor", get(direct, true))
	b.Run("conn=keepalive/impl=library", get(exposed+"/", true))
}
