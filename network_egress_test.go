package sandbox_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// proxyConnectPy sends CONNECT for each target through the sandbox's
// proxy and prints each answer's status line.
const proxyConnectPy = `
import json, os, socket, sys
from urllib.parse import urlparse
u = urlparse(os.environ["HTTP_PROXY"])
res = {}
for target in sys.argv[1:]:
    s = socket.create_connection((u.hostname, u.port), timeout=20)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    res[target] = data.split(b"\r\n")[0].decode() + " " + data.partition(b"\r\n\r\n")[2].decode(errors="replace")
    s.close()
print(json.dumps(res))
`

// "The Internet" written as Allow ["0.0.0.0/0", "::/0"] reaches neither
// the host's loopback services nor the docker bridge's gateway address (the
// host); rules naming exactly that range and address do.
func TestNetworkAllowInternetNotHost(t *testing.T) {
	t.Parallel()
	gw := dockerBridgeAddr()
	if gw == "" {
		gw = hostAddr(t)
	}
	lLoop, nLoop := netListener(t, "127.0.0.1:0")
	lGw, nGw := netListener(t, net.JoinHostPort(gw, "0"))
	targets := []string{lLoop.Addr().String(), lGw.Addr().String()}
	sbs := netNewPythons(t,
		[]sandbox.Option{sandbox.WithNetwork(sandbox.AllowHosts("0.0.0.0/0", "::/0"))},
		[]sandbox.Option{sandbox.WithNetwork(sandbox.AllowHosts("127.0.0.0/8", gw))},
	)
	run := func(sb *sandbox.Sandbox) map[string]string {
		out, errOut, code := netPy(t, sb, proxyConnectPy, nil, "", targets...)
		var res map[string]string
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("connect script: exit %d %s %s", code, out, errOut)
		}
		return res
	}
	res := run(sbs[0])
	for _, target := range targets {
		if !strings.HasPrefix(res[target], "HTTP/1.1 403") || !strings.Contains(res[target], "only an allow rule inside that range") {
			t.Errorf("Allow 0.0.0.0/0, ::/0: CONNECT %s = %q, want 403 naming the rule it needs", target, res[target])
		}
	}
	if n := nLoop.Load() + nGw.Load(); n != 0 {
		t.Errorf("the host's listeners accepted %d connections from a sandbox allowed 0.0.0.0/0", n)
	}
	t.Logf("Allow 0.0.0.0/0, ::/0: %v", res)
	res = run(sbs[1])
	for _, target := range targets {
		if !strings.HasPrefix(res[target], "HTTP/1.1 200") {
			t.Errorf("Allow 127.0.0.0/8, %s: CONNECT %s = %q, want 200", gw, target, res[target])
		}
	}
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		l, g := nLoop.Load(), nGw.Load()
		return l == 1 && g == 1, fmt.Sprintf("the listeners accepted %d (loopback) and %d (%s) connections, want 1 each", l, g, gw)
	})
}

// rawHTTPSPy sends one GET through the proxy over TLS (trusting the
// sandbox's CA) and prints the raw response, hex-encoded.
const rawHTTPSPy = `
import os, socket, ssl, sys
from urllib.parse import urlparse
u = urlparse(os.environ["HTTPS_PROXY"])
host, port = sys.argv[1], sys.argv[2]
s = socket.create_connection((u.hostname, u.port), timeout=20)
s.sendall(("CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n" % (host, port, host, port)).encode())
data = b""
while b"\r\n\r\n" not in data:
    data += s.recv(1)
assert data.startswith(b"HTTP/1.1 200"), data
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
t = ctx.wrap_socket(s, server_hostname=host)
t.sendall(("GET / HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n" % (host, port)).encode())
out = b""
while True:
    try:
        b = t.recv(65536)
    except ssl.SSLEOFError:
        break
    if not b:
        break
    out += b
print(out.hex())
`

// An upstream that echoes the credential into response field names — of a
// 103 Early Hints response, of the final response, of trailers — gets none
// of its forms into the sandbox: the raw bytes the sandbox reads hold
// neither the secret (in any case) nor its hex or base64.
func TestNetworkCredentialHeaderNames(t *testing.T) {
	t.Parallel()
	secret := "sk-" + netRandHex(12) + "QzX"
	forms := map[string]string{
		"raw": secret, "hex": hex.EncodeToString([]byte(secret)),
		"base64": base64.RawStdEncoding.EncodeToString([]byte(secret)), "base64url": base64.RawURLEncoding.EncodeToString([]byte(secret)),
	}
	upCA, err := egress.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := upCA.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var keys []string
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Key")
		mu.Lock()
		keys = append(keys, key)
		mu.Unlock()
		echo := []string{key, hex.EncodeToString([]byte(key)), base64.RawURLEncoding.EncodeToString([]byte(key))}
		h := w.Header()
		h.Set("Link", "</a.css>; rel=preload")
		for _, e := range echo {
			h.Set("X-Hint-"+e, "1")
		}
		w.WriteHeader(http.StatusEarlyHints)
		clear(h)
		var trailers []string
		for _, e := range echo {
			h.Set("X-"+e, "1")
			trailers = append(trailers, "X-T-"+e)
		}
		h.Set("Trailer", strings.Join(trailers, ", "))
		io.WriteString(w, "body ok")
		w.(http.Flusher).Flush()
		for _, e := range echo {
			h.Set("X-T-"+e, "1")
			h.Set(http.TrailerPrefix+"X-U-"+e, "1")
		}
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM())
	sb := newPython(t,
		sandbox.WithNetwork(sandbox.NetworkPolicy{
			Allow:       []string{"api.test:" + port, "127.0.0.1/32"},
			Credentials: []sandbox.Credential{{Host: "api.test", Header: "X-Key", Value: secret}},
		}),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})),
		sandbox.WithTestUpstreamRoots(roots))
	out, errOut, code := netPy(t, sb, rawHTTPSPy, nil, "", "api.test", port)
	raw, err := hex.DecodeString(strings.TrimSpace(out))
	if code != 0 || err != nil {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	mu.Lock()
	if len(keys) != 1 || keys[0] != secret {
		t.Errorf("the upstream got keys %q, want the credential once", keys)
	}
	mu.Unlock()
	lower := strings.ToLower(string(raw))
	for name, f := range forms {
		if strings.Contains(lower, strings.ToLower(f)) {
			t.Errorf("the %s form of the secret (%s) reached the sandbox:\n%s", name, f, raw)
		}
	}
	for _, want := range []string{"HTTP/1.1 103 Early Hints\r\n", "Link: </a.css>; rel=preload\r\n", "HTTP/1.1 200 OK\r\n", "body ok"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("the response lacks %q:\n%s", want, raw)
		}
	}
}

// stallPy opens argv[2] tunnels to argv[1] through the proxy and writes
// into each as fast as it can.
const stallPy = `
import os, socket, sys, threading
from urllib.parse import urlparse
u = urlparse(os.environ["HTTP_PROXY"])
target, n = sys.argv[1], int(sys.argv[2])
socks = []
for i in range(n):
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(1)
    assert data.startswith(b"HTTP/1.1 200"), data
    s.settimeout(None)
    socks.append(s)
def write(s):
    buf = b"\0" * 65536
    while True:
        s.sendall(buf)
for s in socks:
    threading.Thread(target=write, args=(s,), daemon=True).start()
print("writing", flush=True)
threading.Event().wait()
`

// A sandbox writing as fast as it can into 128 tunnels to an upstream that
// never reads: the host's kernel holds bounded send queues for the
// upstream sockets, and once the sandbox's container is gone every
// upstream socket is closed at once (not left to the idle timeout, nor as
// an orphan behind a shut window).
func TestNetworkStalledTunnels(t *testing.T) {
	const tunnels = 128
	up, _ := testenv.HoldingListener(t)
	port := up.Port
	sb := newPython(t, sandbox.WithNetwork(sandbox.AllowHosts("127.0.0.1/32")))
	memBefore, _ := testenv.TCPMemPages()

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	cmd := sb.Command(ctx, "python3", "-c", stallPy, up.String(), strconv.Itoa(tunnels))
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "writing\n" {
		cancel()
		cmd.Wait()
		t.Fatalf("the writer: %q %v %s", line, err, stderr.String())
	}
	const perSocket = 2*egress.UpstreamBuffer + 64<<10
	upstream := func() ([]testenv.TCPSocket, int64) {
		ss, err := testenv.SocketsTo(port)
		if err != nil {
			t.Fatal(err)
		}
		var tx int64
		for _, s := range ss {
			tx += s.TxQueue
		}
		return ss, tx
	}
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		ss, tx := upstream()
		full := 0
		for _, s := range ss {
			if s.TxQueue > perSocket {
				t.Fatalf("an upstream socket holds %d bytes in its send queue, over %d", s.TxQueue, perSocket)
			}
			if s.TxQueue >= egress.UpstreamBuffer/2 {
				full++
			}
		}
		if len(ss) != tunnels || full != tunnels {
			return false, fmt.Sprintf("%d upstream sockets, %d with a full send queue", len(ss), full)
		}
		mem, _ := testenv.TCPMemPages()
		t.Logf("%d stalled tunnels: upstream send queues %.1f MiB; host TCP memory %d pages before, %d now (%+.1f MiB)",
			tunnels, float64(tx)/(1<<20), memBefore, mem, float64((mem-memBefore)*4096)/(1<<20))
		return true, ""
	})

	// The writer killed: the sandbox lives, its tunnels wait for their
	// idle timeout, with their bounded queues.
	cancel()
	cmd.Wait()
	ss, tx := upstream()
	mem, _ := testenv.TCPMemPages()
	t.Logf("writer killed: %d upstream sockets, %.1f MiB queued; host TCP memory %d pages", len(ss), float64(tx)/(1<<20), mem)

	// The container killed: the agent's stream ends, and every upstream
	// socket goes at once.
	if err := engineClient(t).ContainerKill(testCtx(t), sb.ID(), "KILL"); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		ss, tx := upstream()
		return len(ss) == 0, fmt.Sprintf("after the container was killed, %d upstream sockets remain, %d bytes queued", len(ss), tx)
	})
	mem, _ = testenv.TCPMemPages()
	t.Logf("container killed: no upstream socket left; host TCP memory %d pages", mem)
}
