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
}

type exposure struct {
	url string
	l   net.Listener
	wg  sync.WaitGroup
	mu  sync.Mutex
	cs  map[net.Conn]struct{}
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

// Expose returns a URL on the host's loopback interface ("http://127.0.0.1:PORT")
// that forwards connections to port on the sandbox's loopback interface,
// for a web app the sandbox runs (listening on 127.0.0.1 or on every
// address). It works whatever the network policy, the zero one included:
// each connection is carried by the sandbox's agent over its own stream,
// not by a network. Exposing the same port again returns the same URL.
// When nothing listens on the port, a request gets an HTTP 502 answer
// saying so. Close removes the listener.
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("sandbox: Expose: %w", err)
	}
	e := &exposure{url: "http://" + l.Addr().String(), l: l, cs: map[net.Conn]struct{}{}}
	if x.m == nil {
		x.m = map[int]*exposure{}
	}
	x.m[port] = e
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.track(c, true)
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer e.track(c, false)
				defer c.Close()
				s.forwardExposed(c, port)
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
	x.closed = true
	for _, e := range x.m {
		e.close()
	}
}

// forwardExposed splices a host connection to the sandbox's port.
func (s *Sandbox) forwardExposed(c net.Conn, port int) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	up, err := s.agent.Dial(ctx, port)
	cancel()
	if err != nil {
		// Answer once the request is in: a response that comes before it
		// is dropped by clients (Go's: "unsolicited response").
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
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
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(msg), msg)
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(up, c)
		up.(interface{ CloseWrite() error }).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.Close()
	<-done
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

func withUpstreamRoots(p *x509.CertPool) Option {
	return func(c *config) error { c.upstreamRoots = p; return nil }
}
