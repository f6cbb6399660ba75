package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/egress"
)

// NetworkPolicy says what a sandbox may reach. The zero policy is no network
// at all: the container has only a loopback interface.
//
// With Allow set (even to an empty list, as AllowHosts() returns), the
// sandbox still has no network interface but loopback. The only way out is
// an egress proxy that the library runs in this process: the sandbox's
// agent listens on a port of the sandbox's 127.0.0.1 (before any of the
// sandbox's code runs) and carries each connection to it over the agent's
// own stream to the proxy; HTTP_PROXY, HTTPS_PROXY and NO_PROXY (and their
// lower-case forms) point at it. So no host service, other sandbox or
// address is reachable except through the proxy, and nothing on the
// engine's host is changed: no network, no firewall rule, no root — it
// works the same for a docker-group user, a remote engine and any runtime
// (gVisor's runsc included). The proxy resolves names itself and connects
// only to the addresses it checked, refusing loopback, private, link-local
// (cloud metadata), other special-purpose ranges and the host's own
// addresses unless a CIDR in Allow names that range itself (see Allow):
// "0.0.0.0/0" means the public Internet, as Open does. DNS from inside the sandbox
// goes nowhere: only the proxy resolves names. Programs that ignore the
// proxy variables cannot connect anywhere.
//
// Open is the one policy that needs the engine's host: it gives the sandbox
// a bridge network of its own with host firewall rules (iptables) that keep
// host services out of reach, so it needs root on that host and a runc
// runtime; elsewhere New fails with ErrNetworkUnsupported.
type NetworkPolicy struct {
	// Allow lists what may be reached through the proxy:
	//   "files.example.org"      that host, ports 80 and 443
	//   "*.example.com"          any name under example.com (not example.com itself)
	//   "api.example.com:8443"   that host and port only
	//   "10.1.2.0/24", "10.1.2.3" addresses (any port), also allowed as literal hosts
	//
	// Whatever the rules, an address that is not public unicast —
	// loopback (127.0.0.0/8, ::1), private (10/8, 172.16/12, 192.168/16,
	// fc00::/7), link-local (169.254/16, fe80::/10), CGNAT (100.64/10),
	// 0.0.0.0/8, multicast, documentation, benchmarking and other
	// special-purpose ranges, and their NAT64, 6to4, Teredo and
	// IPv4-mapped forms — is reached only through an address rule that
	// lies inside its range: "10.1.2.0/24" reaches 10.1.2.x and
	// "127.0.0.1" the host's loopback, but "0.0.0.0/0", "::/0",
	// "0.0.0.0/1" or "8.0.0.0/5" reach public addresses only. An address
	// of the host's own interfaces other than loopback (a bridge's
	// gateway, a public address) is reached only through a rule naming
	// exactly that address ("172.17.0.1"). A name rule never opens such an
	// address: a name that resolves to one needs an address rule too.
	Allow []string
	// Open gives full egress (a NAT'ed bridge of its own, host services still
	// firewalled off). It is an explicit opt-in and excludes Allow.
	Open bool
	// Credentials are added by the proxy to requests for their hosts. For
	// HTTPS the proxy terminates TLS with a per-sandbox CA that the sandbox
	// trusts (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE and
	// NODE_EXTRA_CA_CERTS point at it), so the value never enters the
	// sandbox; it is also scrubbed from responses. Each host must be allowed
	// (by a name rule, on any port, or as an IP literal in a CIDR rule).
	Credentials []Credential
}

// Credential is a header the proxy adds to every request to Host, such as
// {Host: "api.example.com", Header: "Authorization", Value: "Bearer ..."}.
//
// The proxy adds it only to requests it sends to Host itself: the upstream
// request's Host header, TLS server name and dialed address all belong to
// Host, and a request from the sandbox naming another host in its Host
// header (domain fronting) is refused (403). It goes over HTTPS only unless
// AllowHTTP is set. The value, and its base64 (standard and URL, also at any
// offset inside a larger encoded blob), hex, URL-encoded and JSON/JS-escaped
// forms in any ASCII case, are replaced by "[redacted]" in response header
// values (1xx responses included), bodies and trailers, even when split
// across reads, and a header or trailer whose name holds one is dropped;
// encoded forms shorter than 8 bytes are not looked for. The scrubber
// cannot find a value the upstream transforms otherwise (encrypts, hashes,
// reverses, ...) or returns piecewise (a few bytes per Range request or
// offset): give credentials scoped to the minimum and short-lived, and none
// for hosts that echo requests.
type Credential struct {
	Host, Header, Value string
	// AllowHTTP sends the credential over plain HTTP too; off by default,
	// because the value would cross the network readable. Without it a
	// plain http:// request to Host is refused (403).
	AllowHTTP bool
}

// AllowHosts returns a policy allowing only the given hosts (patterns as in
// NetworkPolicy.Allow), through the proxy. With no hosts the sandbox
// reaches nothing but has the proxy, which refuses every request (and logs
// it). It is the same as NetworkPolicy{Allow: hosts} with a non-nil slice:
// Allow: nil (the zero policy) means no proxy at all.
func AllowHosts(hosts ...string) NetworkPolicy {
	return NetworkPolicy{Allow: append([]string{}, hosts...)}
}

func (p NetworkPolicy) none() bool {
	return p.Allow == nil && !p.Open && len(p.Credentials) == 0
}

// WithNetwork sets the sandbox's network policy (default: none).
func WithNetwork(p NetworkPolicy) Option {
	return func(c *config) error {
		if p.Open && len(p.Allow) > 0 {
			return errors.New("sandbox: WithNetwork: Open and Allow exclude each other")
		}
		if p.Open && len(p.Credentials) > 0 {
			return errors.New("sandbox: WithNetwork: Credentials need an allow-list, not Open")
		}
		rules, err := egress.ParseRules(p.Allow)
		if err != nil {
			return fmt.Errorf("sandbox: WithNetwork: %w", err)
		}
		pol := egress.Policy{Rules: rules}
		for _, cr := range p.Credentials {
			h := strings.ToLower(cr.Host)
			switch {
			case cr.Header == "" || strings.ContainsAny(cr.Header, " :\r\n") || strings.ContainsAny(cr.Value, "\r\n"):
				return fmt.Errorf("sandbox: WithNetwork: credential for %q: bad header name or value", cr.Host)
			case !pol.AllowHost(h):
				return fmt.Errorf("sandbox: WithNetwork: credential host %q is not allowed by the policy", cr.Host)
			}
		}
		if p.Allow == nil && !p.Open && len(p.Credentials) > 0 {
			return errors.New("sandbox: WithNetwork: Credentials need an allow-list")
		}
		if p.Allow != nil { // an empty list (AllowHosts()) must stay non-nil
			p.Allow = append([]string{}, p.Allow...)
		}
		if !p.Open && p.Allow == nil && len(p.Credentials) == 0 {
			p = NetworkPolicy{}
		}
		c.network, c.rules = p, rules
		return nil
	}
}

// netRules are the parsed NetworkPolicy.Allow patterns.
type netRules = []egress.Rule

// netState is what a sandbox's network policy made.
type netState struct {
	// The egress proxy, reached through the agent's relay port.
	relayPort int
	proxy     *egress.Proxy
	proxyL    net.Listener
	proxyErr  chan error
	ca        *egress.CA
}

// exposures are a sandbox's exposed ports.
type exposures struct {
	mu     sync.Mutex
	m      map[int]*exposure
	closed bool
	addr   netip.Addr   // the loopback address of the sandbox's URLs, drawn at the first Expose
	open   atomic.Int32 // open connections, all ports
}

type exposure struct {
	url string
	l   net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	cs  map[net.Conn]struct{}
}

// Bounds on the connections through Expose URLs (see Expose).
const (
	// exposeIdle closes a connection on which neither side sent a byte
	// for so long.
	exposeIdle = 5 * time.Minute
	// exposeAfterEOF closes a connection whose host client has ended its
	// side (closed, or only half-closed) once the sandbox's side has sent
	// nothing for so long: a client gone, a server that never answers.
	exposeAfterEOF = 10 * time.Second
	// exposeErrorBound bounds reading the request and writing the 502
	// answer on a connection to a port nothing in the sandbox accepts.
	exposeErrorBound = 5 * time.Second
	// exposeMaxConns bounds a sandbox's open Expose connections (all its
	// ports together); a connection past it is closed at once.
	exposeMaxConns = 256
)

// exposeBounds are the bounds in force for a sandbox (a test hook may
// shorten them).
type exposeBounds struct {
	idle, afterEOF time.Duration
	max            int
}

func (s *Sandbox) exposeBounds() exposeBounds {
	b := exposeBounds{idle: exposeIdle, afterEOF: exposeAfterEOF, max: exposeMaxConns}
	if t := s.cfg.expose; t != nil {
		b = *t
	}
	return b
}

// exposeHosts are the loopback addresses of this process's sandboxes'
// Expose URLs: one per sandbox, so that cookies, which ignore ports but
// not hosts, never go from one sandbox's web app to another's.
var exposeHosts struct {
	mu     sync.Mutex
	used   map[netip.Addr]bool
	shared bool // this host routes only 127.0.0.1 (macOS without aliases)
}

var sharedLoopback = netip.MustParseAddr("127.0.0.1")

// drawLoopback reserves an unused address of 127.1.1.1-127.254.254.254
// (127.0.x.x is left to the host's own services: 127.0.0.1, 127.0.0.53,
// 127.0.1.1), or returns 127.0.0.1 on a host that routes nothing else.
func drawLoopback() netip.Addr {
	h := &exposeHosts
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.shared {
		return sharedLoopback
	}
	for {
		var b [3]byte
		rand.Read(b[:])
		a := netip.AddrFrom4([4]byte{127, 1 + b[0]%254, 1 + b[1]%254, 1 + b[2]%254})
		if !h.used[a] {
			if h.used == nil {
				h.used = map[netip.Addr]bool{}
			}
			h.used[a] = true
			return a
		}
	}
}

func releaseLoopback(a netip.Addr) {
	h := &exposeHosts
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.used, a)
}

// listen listens on a new port of the sandbox's loopback address,
// drawing the address first if need be. Called with x.mu held.
func (x *exposures) listen() (net.Listener, error) {
	if x.addr.IsValid() {
		return net.Listen("tcp", netip.AddrPortFrom(x.addr, 0).String())
	}
	for range 16 {
		a := drawLoopback()
		l, err := net.Listen("tcp", netip.AddrPortFrom(a, 0).String())
		switch {
		case err == nil:
			x.addr = a
			return l, nil
		case a == sharedLoopback:
			return nil, err
		}
		releaseLoopback(a)
		switch {
		case errors.Is(err, syscall.EADDRINUSE): // another process's: draw again
		case errors.Is(err, syscall.EADDRNOTAVAIL): // only 127.0.0.1 is there
			exposeHosts.mu.Lock()
			exposeHosts.shared = true
			exposeHosts.mu.Unlock()
		default:
			return nil, err
		}
	}
	return nil, errors.New("no free loopback address found")
}

// relayPorts is the range the relay port is drawn from: the sandbox's
// loopback interface is its own, so any port is free at the start.
const relayPortMin, relayPortSpan = 20000, 30000

// createNetwork prepares the sandbox's network policy before the container
// exists. It returns the env vars the container needs.
func (s *Sandbox) createNetwork() (env []string, err error) {
	if s.cfg.network.Open {
		return nil, nil // the backend's (driver.NetworkOpen)
	}
	p := s.cfg.network
	var b [2]byte
	rand.Read(b[:])
	n := &netState{relayPort: relayPortMin + int(binary.BigEndian.Uint16(b[:]))%relayPortSpan}
	s.net = n
	creds := map[string]egress.Credential{}
	for _, c := range p.Credentials {
		creds[strings.ToLower(c.Host)] = egress.Credential{Header: c.Header, Value: c.Value, AllowHTTP: c.AllowHTTP}
	}
	if len(creds) > 0 {
		if n.ca, err = egress.NewCA(); err != nil {
			return nil, err
		}
	}
	n.proxy = egress.New(egress.Config{
		Policy: egress.Policy{Rules: s.cfg.rules}, Credentials: creds, CA: n.ca,
		Resolve: s.cfg.resolve, UpstreamRoots: s.cfg.upstreamRoots,
		Log: s.logDecision,
	})
	proxyURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.relayPort))
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env = append(env, k+"="+proxyURL)
	}
	env = append(env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
	if n.ca != nil {
		env = append(env, "SSL_CERT_FILE="+caBundlePath, "REQUESTS_CA_BUNDLE="+caBundlePath,
			"CURL_CA_BUNDLE="+caBundlePath, "NODE_EXTRA_CA_CERTS="+caPath)
	}
	return env, nil
}

// relayPending is how many connections to the relay port the library is
// ready to take at once (more wait in the sandbox's listen queue).
const relayPending = 4

// serveProxy serves the proxy on the connections the agent relays, once
// the agent runs.
func (s *Sandbox) serveProxy() {
	n := s.net
	n.proxyL = s.agent.Listen(relayPending)
	n.proxyErr = make(chan error, 1)
	go func() { n.proxyErr <- n.proxy.Serve(n.proxyL) }()
	// Once the agent's stream ends (the sandbox is closed, or its
	// container died) no relayed connection is left: close the proxy, and
	// with it every upstream connection, rather than let tunnels wait for
	// their idle timeout with the kernel holding their buffers.
	go func() {
		<-s.agent.Done()
		n.proxy.Close()
	}()
}

// The CA the sandbox trusts lives in /tmp (a tmpfs inside the sandbox).
const (
	caPath       = "/tmp/.agentsandbox-ca.pem"
	caBundlePath = "/tmp/.agentsandbox-ca-bundle.pem"
)

// systemBundles are where images keep their trusted certificates.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/cert.pem",
}

// installCA writes the sandbox's CA, alone and appended to the image's
// system bundle, where the environment variables point.
func (s *Sandbox) installCA(ctx context.Context) error {
	ca := s.net.ca.CertPEM()
	bundle := append([]byte(nil), ca...)
	for _, p := range systemBundles {
		if sys, err := s.ReadFile(ctx, p); err == nil {
			bundle = append(append(sys, '\n'), ca...)
			break
		}
	}
	if err := s.WriteFile(ctx, caPath, ca, 0o644); err != nil {
		return err
	}
	return s.WriteFile(ctx, caBundlePath, bundle, 0o644)
}

func (s *Sandbox) logDecision(d egress.Decision) {
	attrs := []slog.Attr{slog.String("sandbox", s.id), slog.Bool("allowed", d.Allowed),
		slog.String("method", d.Method), slog.String("host", d.Host), slog.Int("port", d.Port)}
	if d.Addr != "" {
		attrs = append(attrs, slog.String("addr", d.Addr))
	}
	if d.Reason != "" {
		attrs = append(attrs, slog.String("reason", d.Reason))
	}
	if d.Credential != "" {
		attrs = append(attrs, slog.String("credential_header", d.Credential))
	}
	attrs = append(attrs, slog.Int64("bytes_up", d.BytesUp), slog.Int64("bytes_down", d.BytesDown))
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "sandbox.network", attrs...)
}

// Expose returns a URL on the host's loopback interface
// ("http://127.X.Y.Z:PORT") that forwards connections to port on the
// sandbox's loopback interface, for a web app the sandbox runs (listening
// on 127.0.0.1 or on every address). It works whatever the network
// policy, the zero one included: each connection is carried by the
// sandbox's agent over its own stream, not by a network. Exposing the
// same port again returns the same URL. When nothing listens on the port,
// a request gets an HTTP 502 answer saying so. Close removes the
// listener and cuts the connections.
//
// Each sandbox's URLs have a host of their own, an address of
// 127.0.0.0/8 drawn for it (all its ports share it), so a cookie one
// sandbox's app sets is not sent to another's by a browser or cookie jar
// (cookies ignore ports, not hosts). This needs a host that routes all of
// 127.0.0.0/8 to loopback, as Linux and Windows do; where binding such an
// address fails (macOS without aliases) every URL is on 127.0.0.1 and
// cookies are shared.
//
// A connection is closed, both on the host and in the sandbox, once
// neither side has sent a byte for 5 minutes, or once the host client
// has ended its side (closed or half-closed) and the sandbox's side has
// sent nothing for 10 seconds; a client that closes before the answer
// therefore holds nothing for longer. A sandbox has at most 256 open
// connections through its URLs (all ports together): one past them is
// closed at once, and the audit log gets a "sandbox.expose.refused"
// record. These bounds hold the same on every backend: the URLs are
// served by this process.
func (s *Sandbox) Expose(ctx context.Context, port int) (url string, err error) {
	defer func() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.expose", slog.String("sandbox", s.id),
			slog.Int("port", port), slog.String("url", url), errAttr(err))
	}()
	if err := s.check(); err != nil {
		return "", err
	}
	if port < 1 || port > 65535 {
		return "", fmt.Errorf("sandbox: Expose: port %d out of range 1-65535", port)
	}
	x := &s.exposed
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return "", ErrClosed
	}
	if e, ok := x.m[port]; ok {
		return e.url, nil
	}
	l, err := x.listen()
	if err != nil {
		return "", fmt.Errorf("sandbox: Expose: %w", err)
	}
	e := &exposure{url: "http://" + l.Addr().String(), l: l, cs: map[net.Conn]struct{}{}}
	if x.m == nil {
		x.m = map[int]*exposure{}
	}
	x.m[port] = e
	b := s.exposeBounds()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		var pause time.Duration
		for {
			c, err := l.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Out of descriptors, say: try again (as net/http does).
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			pause = 0
			if n := x.open.Add(1); int(n) > b.max {
				x.open.Add(-1)
				s.log.LogAttrs(context.Background(), slog.LevelWarn, "sandbox.expose.refused",
					slog.String("sandbox", s.id), slog.Int("port", port), slog.Int("max_connections", b.max))
				c.Close() // after the record: a client that sees the close finds it
				continue
			}
			e.track(c, true)
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer x.open.Add(-1)
				defer e.track(c, false)
				defer c.Close()
				s.forwardExposed(c, port, b)
			}()
		}
	}()
	return e.url, nil
}

func (e *exposure) track(c net.Conn, add bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if add {
		e.cs[c] = struct{}{}
	} else {
		delete(e.cs, c)
	}
}

func (e *exposure) close() {
	e.l.Close()
	e.mu.Lock()
	for c := range e.cs {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// closeAll closes every exposure (before the agent goes).
func (x *exposures) closeAll() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return
	}
	x.closed = true
	for _, e := range x.m {
		e.close()
	}
	if x.addr.IsValid() && x.addr != sharedLoopback {
		releaseLoopback(x.addr)
	}
}

// forwardExposed splices a host connection to the sandbox's port.
func (s *Sandbox) forwardExposed(c net.Conn, port int, b exposeBounds) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	up, err := s.agent.Dial(ctx, port)
	cancel()
	if err != nil {
		// Answer once the request is in: a response that comes before it
		// is dropped by clients (Go's: "unsolicited response").
		c.SetReadDeadline(time.Now().Add(exposeErrorBound))
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
		}
		c.SetReadDeadline(time.Time{})
		why := err.Error()
		var de *agentconn.DialError
		if errors.As(err, &de) {
			why = de.Msg
		}
		msg := fmt.Sprintf("agentsandbox: nothing accepts connections on port %d in sandbox %s: %s\n", port, shortID(s.id), why)
		c.SetWriteDeadline(time.Now().Add(exposeErrorBound))
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(msg), msg)
		return
	}
	w := newExposeWatch(c, up, b)
	defer w.stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(up, w.reader(c)); err != nil {
			// A reset, or the watch closed it: the sandbox's side goes too.
			c.Close()
			up.Close()
			return
		}
		// The client ended its side: the sandbox's server reads the end,
		// and has exposeAfterEOF of silence to answer.
		w.hostEnded()
		up.(interface{ CloseWrite() error }).CloseWrite()
	}()
	io.Copy(c, w.reader(up))
	c.Close()
	up.Close()
	<-done
}

// exposeWatch closes an Expose connection's two ends once it has been
// quiet past its bound: a timer, no goroutine.
type exposeWatch struct {
	host, up net.Conn
	b        exposeBounds
	start    time.Time
	last     atomic.Int64 // when a byte last moved, as time since start

	mu     sync.Mutex
	t      *time.Timer
	ended  bool // the host client ended its side
	closed bool
}

func newExposeWatch(host, up net.Conn, b exposeBounds) *exposeWatch {
	w := &exposeWatch{host: host, up: up, b: b, start: time.Now()}
	w.mu.Lock()
	w.t = time.AfterFunc(b.idle, w.check)
	w.mu.Unlock()
	return w
}

func (w *exposeWatch) touch() { w.last.Store(int64(time.Since(w.start))) }

// bound is the silence allowed now. Called with w.mu held.
func (w *exposeWatch) bound() time.Duration {
	if w.ended {
		return min(w.b.idle, w.b.afterEOF)
	}
	return w.b.idle
}

func (w *exposeWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	quiet := time.Since(w.start) - time.Duration(w.last.Load())
	if left := w.bound() - quiet; left > 0 {
		w.t.Reset(left)
		return
	}
	w.closed = true
	w.host.Close()
	w.up.Close()
}

// hostEnded shortens the bound to exposeAfterEOF from now.
func (w *exposeWatch) hostEnded() {
	w.touch()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if !w.closed {
		w.t.Reset(w.bound())
	}
}

func (w *exposeWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	w.t.Stop()
}

// reader notes each read of r that moved bytes.
func (w *exposeWatch) reader(r io.Reader) io.Reader { return touchReader{r, w} }

type touchReader struct {
	r io.Reader
	w *exposeWatch
}

func (t touchReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.w.touch()
	}
	return n, err
}

// closeNetwork closes the exposures and the proxy (after the instance is
// gone).
func (s *Sandbox) closeNetwork() {
	s.exposed.closeAll()
	if n := s.net; n != nil && n.proxyL != nil {
		n.proxyL.Close()
		n.proxy.Close()
		<-n.proxyErr
	}
}

// testing hooks, set through export_test.go.
type resolveFunc = func(ctx context.Context, host string) ([]netip.Addr, error)

func withResolver(f resolveFunc) Option {
	return func(c *config) error { c.resolve = f; return nil }
}

func withTimeout(d time.Duration) Option {
	return func(c *config) error { c.timeout = d; return nil }
}

// withExposeBounds replaces Expose's bounds for one sandbox.
func withExposeBounds(idle, afterEOF time.Duration, maxConns int) Option {
	return func(c *config) error {
		c.expose = &exposeBounds{idle: idle, afterEOF: afterEOF, max: maxConns}
		return nil
	}
}

func withUpstreamRoots(p *x509.CertPool) Option {
	return func(c *config) error { c.upstreamRoots = p; return nil }
}
