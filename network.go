package sandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
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
// at all: the sandbox has only a loopback interface.
//
// With Allow set (even to an empty list, as AllowHosts() returns), the
// sandbox still has no network interface but loopback. The only way out is
// an egress proxy that the library runs in this process: the sandbox's
// agent listens on a port of the sandbox's 127.0.0.1 (before any of the
// sandbox's code runs) and carries each connection to it over the agent's
// own stream to the proxy; HTTP_PROXY, HTTPS_PROXY and NO_PROXY (and their
// lower-case forms) point at it. So no host service, other sandbox or
// address is reachable except through the proxy, and nothing outside this
// process is changed: no network, no firewall rule, no privilege — it
// works the same on every backend, for any user of the engine and any
// runtime (gVisor's runsc included). The proxy resolves names itself and connects
// only to the addresses it checked, refusing loopback, private, link-local
// (cloud metadata), other special-purpose ranges and the host's own
// addresses unless a CIDR in Allow names that range itself (see Allow):
// "0.0.0.0/0" means the public Internet, as Open does. DNS from inside the sandbox
// goes nowhere: only the proxy resolves names. Programs that ignore the
// proxy variables cannot connect anywhere.
//
// Open is the one policy the backend puts in force: full egress, as an
// explicit opt-in. What else an open sandbox reaches, and what the backend
// needs for it, is in the backend's package doc (docker: a bridge of its
// own whose firewall rules keep the host's services and other sandboxes
// out, which needs root on the engine's host; kubernetes: the pod's
// network as the cluster shapes it). Where the backend cannot give it,
// New fails with ErrNetworkUnsupported.
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
	// Open gives full egress, put in force by the backend (see above).
	// It is an explicit opt-in and excludes Allow.
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

// parse checks the policy and parses its Allow rules, once: the proxy
// decides by them. It returns the policy as a sandbox keeps it: the zero
// policy for one that allows nothing at all, the caller's slices copied.
func (p NetworkPolicy) parse() (NetworkPolicy, netRules, error) {
	if p.Open && len(p.Allow) > 0 {
		return p, nil, errors.New("sandbox: WithNetwork: Open and Allow exclude each other")
	}
	if len(p.Credentials) > 0 && p.Open {
		return p, nil, errors.New("sandbox: WithNetwork: Credentials need an allow-list, not Open")
	}
	if len(p.Credentials) > 0 && p.Allow == nil {
		return p, nil, errors.New("sandbox: WithNetwork: Credentials need an allow-list")
	}
	// The one parse of the rules: the proxy decides by these.
	rules, err := egress.ParseRules(p.Allow)
	if err != nil {
		return p, nil, fmt.Errorf("sandbox: WithNetwork: %w", err)
	}
	pol := egress.Policy{Rules: rules}
	for _, cr := range p.Credentials {
		switch {
		case cr.Header == "" || strings.ContainsAny(cr.Header, " :\r\n") || strings.ContainsAny(cr.Value, "\r\n"):
			return p, nil, fmt.Errorf("sandbox: WithNetwork: credential for %q: bad header name or value", cr.Host)
		case !pol.AllowHost(strings.ToLower(cr.Host)):
			return p, nil, fmt.Errorf("sandbox: WithNetwork: credential host %q is not allowed by the policy", cr.Host)
		}
	}
	if p.none() {
		p = NetworkPolicy{} // an empty Credentials slice is no policy either
	}
	// The caller's slices are copied; an empty Allow (AllowHosts())
	// stays non-nil.
	if p.Allow != nil {
		p.Allow = append([]string{}, p.Allow...)
	}
	p.Credentials = slices.Clone(p.Credentials)
	return p, rules, nil
}

// netRules are the parsed NetworkPolicy.Allow patterns.
type netRules = []egress.Rule

// resolveFunc resolves a host name to addresses, as the proxy does.
type resolveFunc = func(ctx context.Context, host string) ([]netip.Addr, error)

// relayPortMin and relayPortSpan are the range the relay port is drawn
// from: the sandbox's loopback interface is its own, so any port is free
// at the start.
const relayPortMin, relayPortSpan = 20000, 30000

// relayPending is how many connections to the relay port the library is
// ready to take at once (more wait in the sandbox's listen queue).
const relayPending = 4

// proxy is a sandbox's egress proxy, for an allow-list or credentials (see
// NetworkPolicy). It is made before the sandbox's instance, which needs
// its relay port and the environment that points at it; started once the
// instance's agent runs, on the connections the agent relays; and closed
// once the instance is gone.
type proxy struct {
	relayPort int        // the port of the sandbox's 127.0.0.1 the agent relays
	ca        *egress.CA // the sandbox's CA, for credentials over HTTPS; nil without credentials
	srv       *egress.Proxy
	relay     net.Listener // the relayed connections; nil until start
	served    chan error   // Serve's end, once started
	traffic   traffic      // the bytes of the relayed connections (Usage)
}

// newProxy makes the egress proxy of policy pol, an allow-list (neither
// the zero policy nor Open) whose Allow parsed to rules, reached at
// relayPort in the sandbox (0: a port drawn at random). Its decisions go
// to the audit log, and with the activity record on, to the record of
// the command they come from; the sandbox's test hooks, if set, replace
// its name resolution and the roots it trusts upstream.
func (s *Sandbox) newProxy(pol NetworkPolicy, rules netRules, relayPort int) (*proxy, error) {
	if relayPort == 0 {
		var b [2]byte
		rand.Read(b[:])
		relayPort = relayPortMin + int(binary.BigEndian.Uint16(b[:]))%relayPortSpan
	}
	p := &proxy{relayPort: relayPort}
	creds := map[string]egress.Credential{}
	for _, c := range pol.Credentials {
		creds[strings.ToLower(c.Host)] = egress.Credential{Header: c.Header, Value: c.Value, AllowHTTP: c.AllowHTTP}
	}
	if len(creds) > 0 {
		var err error
		if p.ca, err = egress.NewCA(); err != nil {
			return nil, err
		}
	}
	var decided func(egress.Decision)
	if s.cfg.activity {
		decided = s.proxyDecided
	}
	p.srv = egress.New(egress.Config{
		Policy: egress.Policy{Rules: rules}, Credentials: creds, CA: p.ca,
		Resolve: s.cfg.resolve, UpstreamRoots: s.cfg.upstreamRoots,
		Log: s.logDecision, Decided: decided,
	})
	return p, nil
}

// env is the environment that points the sandbox's programs at the proxy,
// and at the sandbox's CA if it has one (see caFiles).
func (p *proxy) env() []string {
	var env []string
	proxyURL := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.relayPort))
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env = append(env, k+"="+proxyURL)
	}
	env = append(env, "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1")
	if p.ca != nil {
		env = append(env, "SSL_CERT_FILE="+caBundlePath, "REQUESTS_CA_BUNDLE="+caBundlePath,
			"CURL_CA_BUNDLE="+caBundlePath, "NODE_EXTRA_CA_CERTS="+caPath)
	}
	return env
}

// start serves the proxy on the connections agent relays from the relay
// port. Once the agent's stream ends (the sandbox is closed, or its
// instance died) no relayed connection is left: the proxy is closed then,
// and with it every upstream connection, rather than let tunnels wait for
// their idle timeout with the kernel holding their buffers.
func (p *proxy) start(agent *agentconn.Conn) {
	p.relay = countingListener{agent.Listen(relayPending), &p.traffic}
	p.served = make(chan error, 1)
	go func() { p.served <- p.srv.Serve(p.relay) }()
	go func() {
		<-agent.Done()
		p.srv.Close()
	}()
}

// close stops the proxy and its connections, and waits for it to end.
func (p *proxy) close() {
	if p.relay != nil {
		p.relay.Close()
	}
	p.srv.Close()
	if p.served != nil {
		<-p.served
	}
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

// exposeTo is what an exposure needs of its sandbox: its agent, which
// dials the sandbox's ports, its ID and log for the records, and its
// bounds.
type exposeTo struct {
	agent   *agentconn.Conn
	id      string
	log     *slog.Logger
	timeout time.Duration // bounds a dial through the agent
	bounds  exposeBounds
}

// Backoff of an Expose listener's Accept that fails for want of
// descriptors, say (as net/http does).
const (
	acceptPauseMin = 5 * time.Millisecond
	acceptPauseMax = time.Second
)

// expose returns the URL of port's listener, made at the first call for
// the port: each connection to it is spliced to the sandbox's port
// through to's agent.
func (x *exposures) expose(port int, to exposeTo) (string, error) {
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
	e.wg.Go(func() { x.serve(e, port, to) })
	return e.url, nil
}

// serve accepts e's connections until e is closed, and forwards each to
// port while the sandbox has fewer than its bound open.
func (x *exposures) serve(e *exposure, port int, to exposeTo) {
	var pause time.Duration
	for {
		c, err := e.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, acceptPauseMin), acceptPauseMax)
			time.Sleep(pause)
			continue
		}
		pause = 0
		if n := x.open.Add(1); int(n) > to.bounds.max {
			x.open.Add(-1)
			to.log.LogAttrs(context.Background(), slog.LevelWarn, "sandbox.expose.refused",
				slog.String("sandbox", to.id), slog.Int("port", port), slog.Int("max_connections", to.bounds.max))
			c.Close() // after the record: a client that sees the close finds it
			continue
		}
		e.track(c, true)
		e.wg.Go(func() {
			defer x.open.Add(-1)
			defer e.track(c, false)
			defer c.Close()
			to.forward(c, port)
		})
	}
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

// forward splices a host connection to the sandbox's port.
func (to exposeTo) forward(c net.Conn, port int) {
	ctx, cancel := context.WithTimeout(context.Background(), to.timeout)
	up, err := to.agent.Dial(ctx, port)
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
		msg := fmt.Sprintf("agentsandbox: nothing accepts connections on port %d in sandbox %s: %s\n", port, shortID(to.id), why)
		c.SetWriteDeadline(time.Now().Add(exposeErrorBound))
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(msg), msg)
		return
	}
	w := newExposeWatch(c, up, to.bounds)
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
