package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"

	"github.com/docker/docker/api/types/network"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/firewall"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// ---- helpers ----

func netRandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// netLog captures a sandbox's audit log as JSON lines.
type netLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *netLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *netLog) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

func (l *netLog) raw() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *netLog) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.raw()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("audit record %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// waitRecords polls the log until want(records) holds: the proxy logs a
// request after answering it.
func (l *netLog) waitRecords(t *testing.T, what string, want func([]map[string]any) bool) []map[string]any {
	t.Helper()
	var rs []map[string]any
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		rs = l.records(t, "sandbox.network")
		return want(rs), fmt.Sprintf("no %s among the audit records:\n%s", what, l.raw())
	})
	return rs
}

// netResolver maps .test names to local addresses for the egress proxy.
func netResolver(m map[string]string) func(context.Context, string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		a, ok := m[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
}

// netPy runs a python script in the sandbox with args, extra env and
// stdin, and returns its output and exit code.
func netPy(t *testing.T, sb *sandbox.Sandbox, script string, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	c := sb.Command(testCtx(t), "python3", append([]string{"-c", script}, args...)...)
	c.Env = env
	if stdin != "" {
		c.Stdin = strings.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	code := 0
	var ee *sandbox.ExitError
	if errors.As(err, &ee) {
		code = ee.Code
	} else if err != nil {
		t.Fatalf("python3: %v", err)
	}
	return stdout.String(), stderr.String(), code
}

// fetchPy fetches each URL with urllib (which follows the *_PROXY
// variables and, for HTTPS, trusts SSL_CERT_FILE) and prints one JSON
// line per URL.
const fetchPy = `
import json, sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    rec = {"url": url, "status": 0}
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            rec.update(status=r.status, headers=dict(r.headers), body=r.read().decode())
    except urllib.error.HTTPError as e:
        rec.update(status=e.code, headers=dict(e.headers), body=e.read().decode())
    except Exception as e:
        rec.update(error=type(e).__name__ + ": " + str(e))
    print(json.dumps(rec), flush=True)
`

type fetched struct {
	URL     string
	Status  int
	Headers map[string]string
	Body    string
	Error   string
}

func netFetch(t *testing.T, sb *sandbox.Sandbox, urls ...string) (map[string]fetched, string) {
	t.Helper()
	out, errOut, code := netPy(t, sb, fetchPy, nil, "", urls...)
	if code != 0 {
		t.Fatalf("fetch: exit %d\n%s%s", code, out, errOut)
	}
	res := map[string]fetched{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var f fetched
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			t.Fatalf("fetch output %q: %v", line, err)
		}
		res[f.URL] = f
	}
	if len(res) != len(urls) {
		t.Fatalf("fetch printed %d results for %d URLs:\n%s%s", len(res), len(urls), out, errOut)
	}
	return res, out
}

// connectPy tries a TCP connection to each host:port at once and prints a
// JSON object: target -> "connected" or the error.
const connectPy = `
import json, socket, sys, threading
res = {}
def attempt(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        res[target] = "connected"
    except Exception as e:
        res[target] = type(e).__name__ + ": " + str(e)
threads = [threading.Thread(target=attempt, args=(t,)) for t in sys.argv[1:]]
for th in threads: th.start()
for th in threads: th.join()
print(json.dumps(res))
`

func netConnect(t *testing.T, sb *sandbox.Sandbox, targets ...string) map[string]string {
	t.Helper()
	out, errOut, code := netPy(t, sb, connectPy, nil, "", targets...)
	var res map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("connect: exit %d\n%s%s", code, out, errOut)
	}
	return res
}

// waitListenPy polls until something accepts connections on host:port (20s).
const waitListenPy = `
import socket, sys, time
deadline = time.time() + 20
while True:
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()
        break
    except OSError as e:
        if time.time() > deadline:
            sys.exit("nothing listens on %s:%s: %s" % (sys.argv[1], sys.argv[2], e))
        time.sleep(0.05)
`

// netListener listens on addr on the host and counts accepted connections.
func netListener(t *testing.T, addr string) (net.Listener, *atomic.Int32) {
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

func netPort(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }

// hostAddr returns an address of this machine the sandbox must not reach:
// the docker0 bridge's, else the first non-loopback IPv4 address of an
// interface that is up.
func hostAddr(t *testing.T) string {
	t.Helper()
	if d := dockerBridgeAddr(); d != "" {
		return d
	}
	ifcs, _ := net.Interfaces()
	for _, ifc := range ifcs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil {
				return ip.IP.String()
			}
		}
	}
	t.Fatal("this machine has no address but loopback")
	return ""
}

// netMode returns the container's network mode, as the engine has it.
func netMode(t *testing.T, sb *sandbox.Sandbox) string {
	t.Helper()
	info, err := engineClient(t).ContainerInspect(testCtx(t), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	return string(info.HostConfig.NetworkMode)
}

// netRules returns the host's INPUT rules tagged for a network.
func netRules(t *testing.T, networkID string) []string {
	t.Helper()
	out, err := exec.Command("iptables", "-w", "-S", "INPUT").Output()
	if err != nil {
		t.Fatalf("iptables -S INPUT: %v", err)
	}
	var rules []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "agentsandbox:"+networkID) {
			rules = append(rules, line)
		}
	}
	return rules
}

// netNewPythons makes python sandboxes concurrently, closed when the test
// ends.
func netNewPythons(t *testing.T, optSets ...[]sandbox.Option) []*sandbox.Sandbox {
	t.Helper()
	sbs := make([]*sandbox.Sandbox, len(optSets))
	errs := make([]error, len(optSets))
	var wg sync.WaitGroup
	for i, opts := range optSets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sbs[i], errs[i] = sandbox.New(ctx, append([]sandbox.Option{sandbox.WithImage(pythonImage)}, opts...)...)
		}()
	}
	wg.Wait()
	for _, sb := range sbs {
		if sb != nil {
			t.Cleanup(func() {
				if err := sb.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		}
	}
	for _, err := range errs {
		if err != nil {
			t.Fatalf("New: %v", err)
		}
	}
	return sbs
}

// dockerBridgeAddr returns the host's docker0 address, if it has one.
func dockerBridgeAddr() string {
	ifc, err := net.InterfaceByName("docker0")
	if err != nil {
		return ""
	}
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil {
			return ip.IP.String()
		}
	}
	return ""
}

// ---- tests ----

// The zero policy: no interface but loopback, no proxy settings.
func TestNetworkNone(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	r := mustExec(t, sb, `ls /sys/class/net; echo "proxy=$HTTP_PROXY$HTTPS_PROXY$http_proxy"; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; cat /proc/net/route | wc -l`)
	if want := "lo\nproxy=\nlo\n1\n"; r.Stdout != want || r.ExitCode != 0 {
		t.Errorf("interfaces, proxy, routes = %q (stderr %q), want %q", r.Stdout, r.Stderr, want)
	}
}

// An allow-list: the proxy serves listed names only, refuses loopback
// unless a CIDR names it and metadata addresses always, and nothing else
// leaves the sandbox: not TCP to the host, not DNS, not another sandbox.
func TestNetworkAllowList(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "hello from %s %s", r.Host, r.URL.Path)
	}))
	t.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	resolve := sandbox.WithTestResolver(netResolver(map[string]string{
		"api.test": "127.0.0.1", "other.test": "127.0.0.1", "meta.test": "169.254.169.254",
	}))
	var audit netLog
	sbs := netNewPythons(t,
		[]sandbox.Option{sandbox.WithNetwork(sandbox.AllowHosts("api.test:"+port, "meta.test:"+port, "127.0.0.1/32")), resolve, sandbox.WithLogger(audit.logger())},
		[]sandbox.Option{sandbox.WithNetwork(sandbox.AllowHosts("api.test:" + port)), resolve},
	)
	sb, noCIDR := sbs[0], sbs[1]
	host := hostAddr(t)

	t.Run("no interface", func(t *testing.T) {
		// The proxy is on the sandbox's own loopback, relayed by the agent:
		// the sandbox has no network, and the engine's host no rule.
		r := mustExec(t, sb, `ls /sys/class/net; echo "$HTTP_PROXY"; cat /proc/net/route | wc -l`)
		if !regexp.MustCompile(`^lo\nhttp://127\.0\.0\.1:\d+\n1\n$`).MatchString(r.Stdout) || r.ExitCode != 0 {
			t.Errorf("interfaces, proxy, routes = %q (stderr %q), want lo only and a loopback proxy", r.Stdout, r.Stderr)
		}
		if m := netMode(t, sb); m != "none" {
			t.Errorf("the container's network mode is %q, want none", m)
		}
	})

	t.Run("proxy", func(t *testing.T) {
		api, other, meta := "http://api.test:"+port+"/x", "http://other.test:"+port+"/", "http://meta.test:"+port+"/latest/meta-data/"
		res, out := netFetch(t, sb, api, other, meta)
		if f := res[api]; f.Status != 200 || f.Body != "hello from api.test:"+port+" /x" {
			t.Errorf("GET %s = %+v, want 200 with the upstream's body", api, f)
		}
		if f := res[other]; f.Status != 403 || !strings.Contains(f.Body, "host not in the allow-list") {
			t.Errorf("GET %s = %+v, want 403", other, f)
		}
		if f := res[meta]; f.Status != 403 || !strings.Contains(f.Body, "forbidden address [169.254.169.254]") {
			t.Errorf("GET %s = %+v, want 403 before any connection", meta, f)
		}
		if n := hits.Load(); n != 1 {
			t.Errorf("the upstream got %d requests, want 1\n%s", n, out)
		}
	})

	t.Run("loopback needs a CIDR", func(t *testing.T) {
		before := hits.Load()
		u := "http://api.test:" + port + "/"
		res, _ := netFetch(t, noCIDR, u)
		if f := res[u]; f.Status != 403 || !strings.Contains(f.Body, "forbidden address [127.0.0.1]") {
			t.Errorf("GET %s without a CIDR for 127.0.0.1 = %+v, want 403", u, f)
		}
		if hits.Load() != before {
			t.Error("the upstream was reached")
		}
	})

	t.Run("host unreachable", func(t *testing.T) {
		lAny, nAny := netListener(t, "0.0.0.0:0")
		lHost, nHost := netListener(t, net.JoinHostPort(host, "0"))
		// The listeners work for the host itself.
		for _, a := range []string{net.JoinHostPort(host, netPort(lAny)), lHost.Addr().String()} {
			c, err := net.DialTimeout("tcp", a, 5*time.Second)
			if err != nil {
				t.Fatalf("host to its own listener %s: %v", a, err)
			}
			c.Close()
		}
		sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
			n := nAny.Load() + nHost.Load()
			return n == 2, fmt.Sprintf("the listeners counted %d of the host's 2 connections", n)
		})
		nAny.Store(0)
		nHost.Store(0)
		targets := []string{
			net.JoinHostPort(host, netPort(lAny)), // 0.0.0.0 listener, at a host address
			lHost.Addr().String(),                 // listener on that address itself
			"127.0.0.1:" + netPort(lAny),          // the sandbox's own loopback, not the host's
		}
		res := netConnect(t, sb, targets...)
		for _, target := range targets {
			if res[target] == "connected" || res[target] == "" {
				t.Errorf("the sandbox connected to host listener %s: %q", target, res[target])
			}
		}
		if nAny.Load()+nHost.Load() != 0 {
			t.Errorf("host listeners accepted %d connections from the sandbox", nAny.Load()+nHost.Load())
		}
		t.Logf("direct connections from the sandbox: %v", res)
	})

	t.Run("dns", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("listen udp %s: %v", host, err)
		}
		defer pc.Close()
		dnsAddr := pc.LocalAddr().String()
		// The host itself reaches the listener.
		hc, err := net.Dial("udp", dnsAddr)
		if err != nil {
			t.Fatal(err)
		}
		hc.Write([]byte("control"))
		hc.Close()
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		if n, _, err := pc.ReadFrom(buf); err != nil || string(buf[:n]) != "control" {
			t.Fatalf("control packet: %q %v", buf[:n], err)
		}
		pc.SetReadDeadline(time.Time{})
		got := make(chan string, 1)
		go func() {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				got <- "error: " + err.Error()
				return
			}
			got <- fmt.Sprintf("%d bytes from %v", n, from)
		}()
		script := `
import json, socket, sys
res = {}
for name in ("api.test", "nothing.invalid"):
    try:
        res[name] = str(socket.getaddrinfo(name, 80))
    except Exception as e:
        res[name] = "fails: " + str(e)
# A raw DNS query for api.test to a host address.
q = bytes.fromhex("1234010000010000000000000361706904746573740000010001")
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.sendto(q, (sys.argv[1], int(sys.argv[2])))
    res["udp"] = "answer: %r" % (s.recvfrom(512),)
except Exception as e:
    res["udp"] = "fails: " + type(e).__name__ + " " + str(e)
print(json.dumps(res))
`
		dnsHost, dnsPort, _ := net.SplitHostPort(dnsAddr)
		out, errOut, code := netPy(t, sb, script, []string{"RES_OPTIONS=timeout:1 attempts:1"}, "", dnsHost, dnsPort)
		var res map[string]string
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("dns script: %d %s %s", code, out, errOut)
		}
		for _, k := range []string{"api.test", "nothing.invalid", "udp"} {
			if !strings.HasPrefix(res[k], "fails") {
				t.Errorf("%s from inside the sandbox: %s, want a failure", k, res[k])
			}
		}
		// Everything the sandbox sent has arrived by now (it waited for
		// answers); stop the reader.
		pc.SetReadDeadline(time.Now())
		if r := <-got; !strings.Contains(r, "timeout") {
			t.Errorf("the host's UDP listener on %s received a packet from the sandbox: %s", dnsAddr, r)
		}
		t.Logf("DNS from the sandbox: %v", res)
	})

	t.Run("sandboxes are apart", func(t *testing.T) {
		// Sandbox B serves on every address it has; sandbox A, on its own
		// loopback, finds nothing there, and B's server sees no one.
		ctx, cancel := context.WithCancel(testCtx(t))
		srv := noCIDR.Command(ctx, "python3", "-c", `
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", 8000))
s.listen()
print("listening", flush=True)
c, a = s.accept()
print("accepted", a, flush=True)
`)
		out, _ := srv.StdoutPipe()
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); srv.Wait() }()
		br := bufio.NewReader(out)
		if line, err := br.ReadString('\n'); line != "listening\n" {
			t.Fatalf("the server in sandbox B: %q %v", line, err)
		}
		res := netConnect(t, sb, "127.0.0.1:8000")
		if res["127.0.0.1:8000"] == "connected" {
			t.Errorf("sandbox A reached a server at 127.0.0.1:8000")
		}
		cancel()
		rest, _ := io.ReadAll(br)
		if strings.Contains(string(rest), "accepted") {
			t.Errorf("sandbox B's server accepted a connection: %q", rest)
		}
		t.Logf("A -> 127.0.0.1:8000 (B serves on 0.0.0.0:8000): %s", res["127.0.0.1:8000"])
	})

	t.Run("audit", func(t *testing.T) {
		rs := audit.waitRecords(t, "records for api.test, other.test and meta.test", func(rs []map[string]any) bool {
			hosts := map[any]bool{}
			for _, r := range rs {
				hosts[r["host"]] = true
			}
			return hosts["api.test"] && hosts["other.test"] && hosts["meta.test"]
		})
		var allowed, denied int
		for _, r := range rs {
			if r["sandbox"] != sb.ID() || r["port"] != float64(up.Listener.Addr().(*net.TCPAddr).Port) || r["method"] != "GET" {
				t.Errorf("record %v", r)
			}
			switch r["host"] {
			case "api.test":
				allowed++
				if r["allowed"] != true || r["addr"] != "127.0.0.1:"+port || r["bytes_down"] != float64(len("hello from api.test:"+port+" /x")) || r["bytes_up"] != float64(0) {
					t.Errorf("record for the allowed request: %v", r)
				}
			case "other.test", "meta.test":
				denied++
				if r["allowed"] != false || r["reason"] == nil || r["addr"] != nil {
					t.Errorf("record for a denied request: %v", r)
				}
			}
		}
		if allowed != 1 || denied != 2 {
			t.Errorf("%d allowed and %d denied records, want 1 and 2:\n%s", allowed, denied, audit.raw())
		}
	})
}

// Credentials: the proxy adds the header upstream over HTTPS, the sandbox
// sees "[redacted]" where the upstream echoes it, and the value is nowhere
// in the sandbox, its processes, its container's configuration or the
// audit log.
func TestNetworkCredentials(t *testing.T) {
	t.Parallel()
	token := "s3cr3t-" + netRandHex(16)
	secret := "Bearer " + token
	upCA, err := egress.NewCA() // the upstream's own test CA
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := upCA.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 10)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		var keys []string
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			w.Header().Set("X-Echo-"+k, r.Header.Get(k))
		}
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s\n", k, r.Header.Get(k))
		}
	}))
	up.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	up.StartTLS()
	t.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM())
	var audit netLog
	sb := newPython(t,
		sandbox.WithNetwork(sandbox.NetworkPolicy{
			Allow:       []string{"api.test:" + port, "127.0.0.1/32"},
			Credentials: []sandbox.Credential{{Host: "api.test", Header: "Authorization", Value: secret}},
		}),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})),
		sandbox.WithTestUpstreamRoots(roots),
		sandbox.WithLogger(audit.logger()))

	u := "https://api.test:" + port + "/echo"
	res, out := netFetch(t, sb, u)
	f := res[u]
	if f.Status != 200 {
		t.Fatalf("GET %s = %+v", u, f)
	}
	select {
	case got := <-seen:
		if got != secret {
			t.Errorf("the upstream got Authorization %q, want the credential", got)
		}
	default:
		t.Fatal("the upstream saw no request")
	}
	if f.Headers["X-Echo-Authorization"] != "[redacted]" || !strings.Contains(f.Body, "Authorization: [redacted]\n") {
		t.Errorf("the sandbox's view of the echo: %+v", f)
	}
	if strings.Contains(out, token) {
		t.Errorf("the secret reached the sandbox:\n%s", out)
	}

	// Search the sandbox. The root filesystem is read-only and was built
	// before the secret existed; every other mount is read in full, file
	// names included, and so is every process's environment and command
	// line. The secret comes in on stdin, so it is in no argument.
	search := `
import json, os, stat, sys
needle = sys.stdin.buffer.read()
assert len(needle) >= 20
mounts = [l.split() for l in open("/proc/self/mounts")]
root_opts = [m[3] for m in mounts if m[1] == "/"]
hits, files, procs = [], 0, 0
def scan(p):
    global files
    try:
        if not stat.S_ISREG(os.lstat(p).st_mode):
            return
        with open(p, "rb") as f:
            data = f.read()
    except OSError:
        return
    files += 1
    if needle in data:
        hits.append(p)
for m in mounts:
    mp = m[1]
    if mp == "/" or mp.split("/")[1] in ("proc", "sys"):
        continue
    if os.path.isfile(mp):
        scan(mp)
        continue
    for d, dirs, names in os.walk(mp):
        for n in names + dirs:
            if needle in n.encode():
                hits.append(os.path.join(d, n))
        for n in names:
            scan(os.path.join(d, n))
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    procs += 1
    for what in ("environ", "cmdline"):
        try:
            with open("/proc/%s/%s" % (pid, what), "rb") as f:
                if needle in f.read():
                    hits.append("/proc/%s/%s" % (pid, what))
        except PermissionError as e:
            if pid != "1":  # the agent's: out of the sandbox's reach (its config is checked from the host)
                hits.append("unreadable /proc/%s/%s: %s" % (pid, what, e))
        except OSError as e:
            hits.append("unreadable /proc/%s/%s: %s" % (pid, what, e))
print(json.dumps({"root": root_opts, "files": files, "procs": procs, "hits": hits}))
`
	sout, serr, code := netPy(t, sb, search, nil, token)
	var found struct {
		Root  []string
		Files int
		Procs int
		Hits  []string
	}
	if code != 0 || json.Unmarshal([]byte(sout), &found) != nil {
		t.Fatalf("search: exit %d %s %s", code, sout, serr)
	}
	if len(found.Root) != 1 || !strings.HasPrefix(found.Root[0], "ro,") {
		t.Errorf("root mount options %v, want read-only", found.Root)
	}
	if len(found.Hits) > 0 || found.Files < 3 || found.Procs < 2 {
		t.Errorf("search for the secret: %+v", found)
	}
	t.Logf("searched %d files and %d processes: %v", found.Files, found.Procs, found.Hits)
	info, err := engineClient(t).ContainerInspect(testCtx(t), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(info); bytes.Contains(b, []byte(token)) {
		t.Error("the container's configuration holds the secret")
	}

	rs := audit.waitRecords(t, "the record of the request", func(rs []map[string]any) bool { return len(rs) > 0 })
	if r := rs[0]; len(rs) != 1 || r["allowed"] != true || r["host"] != "api.test" || r["method"] != "GET" ||
		r["credential_header"] != "Authorization" || r["bytes_down"].(float64) < 10 {
		t.Errorf("audit records: %v", rs)
	}
	if strings.Contains(audit.raw(), token) {
		t.Errorf("the audit log holds the secret:\n%s", audit.raw())
	}
}

// Expose: a web app in a sandbox with no network at all is reached from
// the host (through the agent); a port with nothing behind it answers 502
// at once; Close takes the URLs away and cuts open connections.
func TestNetworkExpose(t *testing.T) {
	t.Parallel()
	sb := newPython(t)
	ctx := testCtx(t)
	if err := sb.WriteFile(ctx, "hello.txt", []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	srv := sb.Command(srvCtx, "python3", "-m", "http.server", "8000")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := netPy(t, sb, waitListenPy, nil, "", "127.0.0.1", "8000"); code != 0 {
		t.Fatalf("http.server does not listen: %s %s", out, errOut)
	}
	u, err := sb.Expose(ctx, 8000)
	if err != nil {
		t.Fatalf("Expose(8000): %v", err)
	}
	if !regexp.MustCompile(`^http://127\.\d+\.\d+\.\d+:\d+$`).MatchString(u) {
		t.Errorf("Expose URL %q, want http://127.X.Y.Z:PORT", u)
	}
	if again, err := sb.Expose(ctx, 8000); err != nil || again != u {
		t.Errorf("Expose(8000) again = %q, %v; want %q", again, err, u)
	}
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(u + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "Directory listing for /") || !strings.Contains(string(body), "hello.txt") {
		t.Errorf("GET %s = %s %q", u, resp.Status, body)
	}
	// Many windows of binary data, byte for byte.
	big := make([]byte, 8<<20+3)
	rand.Read(big)
	if err := sb.WriteFile(ctx, "big.bin", big, 0o644); err != nil {
		t.Fatal(err)
	}
	resp, err = hc.Get(u + "/big.bin")
	if err != nil {
		t.Fatalf("GET %s/big.bin: %v", u, err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Errorf("GET big.bin: %d of %d bytes, equal %v, %v", len(got), len(big), bytes.Equal(got, big), err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := sb.Expose(ctx, p); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("Expose(%d): %v, want out of range", p, err)
		}
	}
	// Nothing listens on 8001: a 502 at once.
	u2, err := sb.Expose(ctx, 8001)
	if err != nil || u2 == u {
		t.Fatalf("Expose(8001) = %q, %v", u2, err)
	}
	start := time.Now()
	resp, err = hc.Get(u2 + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", u2, err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	// hc's 20 s timeout is the hang guard; how fast the 502 comes depends on
	// the machine's load.
	d := time.Since(start)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "nothing accepts connections on port 8001") {
		t.Errorf("GET %s (nothing listening) = %s %q after %v, want 502", u2, resp.Status, body, d)
	}
	t.Logf("GET %s (nothing listening): %s after %v", u2, resp.Status, d)

	if m := netMode(t, sb); m != "none" {
		t.Errorf("the container's network mode is %q, want none", m)
	}
	// A connection open through the URL is cut by Close.
	open, err := net.Dial("tcp", strings.TrimPrefix(u, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	io.WriteString(open, "GET / HTTP/1.1\r\nHost: x\r\n")

	stop()
	srv.Wait()
	if err := sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Closed either way: an orderly end or a reset (the proxy may close
	// with the request still unread, which makes the kernel send RST).
	if _, err := io.ReadAll(open); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the open connection was not closed by Close: %v", err)
	}
	for _, x := range []string{u, u2} {
		if _, err := net.DialTimeout("tcp", strings.TrimPrefix(x, "http://"), 5*time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("connecting to %s after Close: %v, want connection refused", x, err)
		}
	}
	if _, err := sb.Expose(ctx, 8000); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Expose after Close: %v, want ErrClosed", err)
	}
}

// Open: full egress (not exercised here), yet host services stay out of
// reach.
func TestNetworkOpen(t *testing.T) {
	testenv.Requires(t, testenv.Root) // Open: host firewall rules (else ErrNetworkUnsupported, TestNetworkUnsupported)
	t.Parallel()
	sb := newPython(t, sandbox.WithNetwork(sandbox.NetworkPolicy{Open: true}))
	l, n := netListener(t, "0.0.0.0:0")
	r := mustExec(t, sb, `echo "proxy=$HTTP_PROXY"; awk '$2 == "00000000" { print $3 }' /proc/net/route`)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 2 || lines[0] != "proxy=" {
		t.Fatalf("proxy and default route: %q %q", r.Stdout, r.Stderr)
	}
	gwHex, err := hex.DecodeString(lines[1])
	if err != nil || len(gwHex) != 4 {
		t.Fatalf("default gateway %q", lines[1])
	}
	gw := net.IPv4(gwHex[3], gwHex[2], gwHex[1], gwHex[0]).String()
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(gw, netPort(l)), 5*time.Second); err != nil {
		t.Fatalf("the host cannot reach its own listener on %s: %v", gw, err)
	} else {
		c.Close()
	}
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		return n.Load() == 1, "the listener did not count the host's connection"
	})
	n.Store(0)
	targets := []string{net.JoinHostPort(gw, netPort(l))}
	if d := dockerBridgeAddr(); d != "" {
		targets = append(targets, net.JoinHostPort(d, netPort(l)))
	}
	res := netConnect(t, sb, targets...)
	for _, target := range targets {
		if res[target] == "connected" {
			t.Errorf("the open sandbox reached host listener %s", target)
		}
	}
	if n.Load() != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n.Load())
	}
	t.Logf("open sandbox to host services: %v", res)
}

// Prune removes a network a dead process left, with its firewall rules,
// and leaves a live owner's alone.
func TestNetworkPrune(t *testing.T) {
	testenv.Requires(t, testenv.Root) // it installs and reads host firewall rules
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	mine := strings.Split(owner.ID(), "/")
	pidMax := 4194304
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		pidMax, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	dead := pidMax - 1
	for ; dead > 1; dead-- {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", dead)); os.IsNotExist(err) {
			break
		}
	}
	deadOwner := fmt.Sprintf("%s/%s/%d/12345", mine[0], mine[1], dead)
	if !owner.Dead(deadOwner) || owner.Dead(owner.ID()) {
		t.Fatalf("owner.Dead(%q) = false or owner.Dead(self) = true", deadOwner)
	}
	mk := func(label string) (string, *firewall.Rules) {
		tag := netRandHex(6)
		labels := owner.Labels("network", nil)
		labels[owner.LabelOwner] = label
		created, err := cli.NetworkCreate(ctx, "agentsandbox-prunetest-"+tag, network.CreateOptions{
			Driver: "bridge", Internal: true, Labels: labels,
			Options: map[string]string{"com.docker.network.bridge.name": "asb" + tag},
		})
		if err != nil {
			t.Fatal(err)
		}
		rules, err := firewall.Isolate(ctx, "asb"+tag, "", 0, created.ID)
		if err != nil {
			cli.NetworkRemove(ctx, created.ID)
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rules.Remove()
			cli.NetworkRemove(context.Background(), created.ID)
		})
		return created.ID, rules
	}
	orphan, _ := mk(deadOwner)
	live, _ := mk(owner.ID())
	if len(netRules(t, orphan)) != 2 || len(netRules(t, live)) != 2 {
		t.Fatalf("rules before Prune: %q %q", netRules(t, orphan), netRules(t, live))
	}
	n, err := prune(ctx)
	if err != nil {
		t.Fatalf("Prune: %v", err)
	}
	// The network and its two rules count, unless a Prune running beside
	// this one (another test or process) took them first: the effects are
	// what is checked.
	t.Logf("Prune removed %d objects", n)
	if _, err := cli.NetworkInspect(ctx, orphan, network.InspectOptions{}); !cerrdefs.IsNotFound(err) {
		t.Errorf("the orphan network after Prune: %v", err)
	}
	if r := netRules(t, orphan); len(r) != 0 {
		t.Errorf("the orphan's firewall rules after Prune: %q", r)
	}
	if _, err := cli.NetworkInspect(ctx, live, network.InspectOptions{}); err != nil {
		t.Errorf("Prune removed a live owner's network: %v", err)
	}
	if r := netRules(t, live); len(r) != 2 {
		t.Errorf("Prune touched a live owner's firewall rules: %q", r)
	}
}

// Bad policies are refused by New before it touches the engine (here, an
// engine that does not exist).
func TestNetworkBadInput(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	noEngine := sandbox.WithHost("unix:///nonexistent/agentsandbox-test.sock")
	for _, tc := range []struct {
		p    sandbox.NetworkPolicy
		want string
	}{
		{sandbox.AllowHosts("api.test:0"), `"api.test:0": port "0" out of range`},
		{sandbox.AllowHosts("api.test:65536"), `port "65536" out of range`},
		{sandbox.AllowHosts("api.test:abc"), `port "abc" out of range`},
		{sandbox.AllowHosts("ok.test", ""), "empty"},
		{sandbox.AllowHosts("bad host.test"), "bad character"},
		{sandbox.AllowHosts("*.*.test"), "bad character"},
		{sandbox.AllowHosts("a..test"), "bad host name"},
		{sandbox.AllowHosts("10.0.0.0/33"), "bad CIDR"},
		{sandbox.AllowHosts("10.1.2.3:80"), "without the port"},
		{sandbox.NetworkPolicy{Open: true, Allow: []string{"api.test"}}, "exclude each other"},
		{sandbox.NetworkPolicy{Open: true, Credentials: []sandbox.Credential{{Host: "api.test", Header: "X-Key", Value: "v"}}}, "not Open"},
		{sandbox.NetworkPolicy{Credentials: []sandbox.Credential{{Host: "api.test", Header: "X-Key", Value: "v"}}}, "need an allow-list"},
		{sandbox.NetworkPolicy{Allow: []string{"api.test"}, Credentials: []sandbox.Credential{{Host: "other.test", Header: "X-Key", Value: "v"}}}, `credential host "other.test" is not allowed`},
		{sandbox.NetworkPolicy{Allow: []string{"*.api.test"}, Credentials: []sandbox.Credential{{Host: "api.test", Header: "X-Key", Value: "v"}}}, "not allowed"},
		{sandbox.NetworkPolicy{Allow: []string{"10.1.2.0/24"}, Credentials: []sandbox.Credential{{Host: "10.1.3.1", Header: "X-Key", Value: "v"}}}, "not allowed"},
		{sandbox.NetworkPolicy{Allow: []string{"api.test"}, Credentials: []sandbox.Credential{{Host: "api.test", Header: "Bad Header", Value: "v"}}}, "bad header"},
		{sandbox.NetworkPolicy{Allow: []string{"api.test"}, Credentials: []sandbox.Credential{{Host: "api.test", Header: "X-Key", Value: "v\r\nX-Evil: 1"}}}, "bad header"},
		{sandbox.NetworkPolicy{Allow: []string{"api.test"}, Credentials: []sandbox.Credential{{Host: "api.test", Header: "", Value: "v"}}}, "bad header"},
	} {
		sb, err := sandbox.New(ctx, noEngine, sandbox.WithNetwork(tc.p))
		if err == nil {
			sb.Close()
			t.Errorf("New with %+v succeeded", tc.p)
			continue
		}
		if errors.Is(err, sandbox.ErrEngineUnavailable) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %+v: %v, want an error saying %q before the engine is contacted", tc.p, err, tc.want)
		}
	}
	// Valid policies get as far as the (missing) engine.
	for _, p := range []sandbox.NetworkPolicy{
		{},
		sandbox.AllowHosts(),
		{Open: true},
		{Allow: []string{"api.test:8443"}, Credentials: []sandbox.Credential{{Host: "API.test", Header: "Authorization", Value: "Bearer x"}}},
		{Allow: []string{"*.api.test"}, Credentials: []sandbox.Credential{{Host: "v1.api.test", Header: "X-Key", Value: "x"}}},
		{Allow: []string{"10.1.2.0/24"}, Credentials: []sandbox.Credential{{Host: "10.1.2.3", Header: "X-Key", Value: "x"}}},
	} {
		if _, err := sandbox.New(ctx, noEngine, sandbox.WithNetwork(p)); !errors.Is(err, sandbox.ErrEngineUnavailable) {
			t.Errorf("New with %+v: %v, want ErrEngineUnavailable (the policy is valid)", p, err)
		}
	}
}

// A sandbox that floods its proxy port with connections that never finish
// a request holds the proxy's connection slots and nothing else: the
// sandbox answers meanwhile, the host's heap stays flat, and once the
// flood ends the proxy serves again. Serial: it measures the process's
// heap.
func TestNetworkRelayFlood(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "served") }))
	t.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	sb := newPython(t, sandbox.WithNetwork(sandbox.AllowHosts("api.test:"+port, "127.0.0.1/32")),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})))
	ctx := testCtx(t)
	before := heapNow()
	floodCtx, stop := context.WithCancel(ctx)
	defer stop()
	flood := sb.Command(floodCtx, "python3", "-c", `
import os, socket, sys, time
u = os.environ["HTTP_PROXY"].rsplit(":", 1)
held = []
for i in range(400):
    s = socket.create_connection(("127.0.0.1", int(u[1])), timeout=10)
    s.sendall(b"GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\nX-Pad: ")
    held.append(s)
print("held", len(held), flush=True)
time.sleep(600)
`)
	out, _ := flood.StdoutPipe()
	var floodErr bytes.Buffer
	flood.Stderr = &floodErr
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "held 400\n" {
		stop()
		flood.Wait()
		t.Fatalf("the flood: %q %v %s", line, err, floodErr.String())
	}
	if r := mustExec(t, sb, "echo ok"); r.Stdout != "ok\n" {
		t.Errorf("Exec during the flood: %+v", r)
	}
	if grew := heapNow() - before; grew > 32<<20 {
		t.Errorf("the host's heap grew %d MiB with 400 connections held", grew>>20)
	}
	stop()
	flood.Wait()
	u := "http://api.test:" + port + "/"
	res, _ := netFetch(t, sb, u)
	if f := res[u]; f.Status != 200 || f.Body != "served" {
		t.Errorf("GET %s after the flood = %+v, want 200", u, f)
	}
}
