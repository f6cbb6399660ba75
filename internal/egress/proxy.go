package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The proxy is built on net/http (an http.Server for the sandbox side, a
// second one for the requests inside intercepted TLS connections, and
// httputil.ReverseProxy for forwarding) rather than a proxy library: the
// parts that matter here — resolving names once and dialing only checked
// addresses, bounding connections, and TLS interception for credential
// hosts only — are hooks a library would have to be bent around, while the
// standard library already does HTTP/1.1 parsing, header bounds,
// keep-alive, hop-by-hop headers and streaming correctly.

// Bounds on what a sandbox (or an upstream) can make the proxy hold.
const (
	// MaxHeaderBytes bounds a request's head (request line and headers),
	// on the proxy connection and inside intercepted TLS connections. A
	// larger head is answered 431 (or the connection is closed).
	MaxHeaderBytes = 64 << 10
	// MaxResponseHeaderBytes bounds an upstream response's head.
	MaxResponseHeaderBytes = 1 << 20
	// ReadHeaderTimeout bounds the time to read a request's head, and the
	// sandbox's side of the TLS handshake of an intercepted connection.
	ReadHeaderTimeout = 30 * time.Second
	// KeepAliveTimeout bounds the time a kept-alive connection from the
	// sandbox waits for its next request (or Config.IdleTimeout if that is
	// shorter).
	KeepAliveTimeout = 2 * time.Minute
	// DefaultIdleTimeout is the default Config.IdleTimeout.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultMaxConns is the default Config.MaxConns.
	DefaultMaxConns = 128
	// UpstreamBuffer is the kernel send and receive buffer size (SO_SNDBUF,
	// SO_RCVBUF) asked for each upstream connection; Linux allots twice
	// that, bookkeeping included. It bounds what the host's kernel holds
	// for a sandbox that writes to an upstream that stops reading (or
	// stops reading what an upstream sends): at most 4×UpstreamBuffer per
	// upstream connection, so 128 MiB at DefaultMaxConns, where the
	// kernel's autotuning lets each grow to several MiB. It also caps a
	// single connection's throughput to about UpstreamBuffer per round trip
	// (some 10 MiB/s at 25 ms).
	UpstreamBuffer = 256 << 10
)

// Bounds on the proxy's waits for upstreams.
const (
	// resolveTimeout bounds the resolution of an upstream's name.
	resolveTimeout = 10 * time.Second
	// upstreamTLSTimeout bounds the TLS handshake with an upstream.
	upstreamTLSTimeout = 30 * time.Second
	// upstreamHeaderTimeout bounds the wait for an upstream's answer to
	// start (its response's head), once the request is sent.
	upstreamHeaderTimeout = 2 * time.Minute
	// upstreamIdleTimeout closes a kept-alive upstream connection unused
	// for so long.
	upstreamIdleTimeout = 30 * time.Second
)

// Credential is a header added to requests for one host. The proxy adds it
// only to requests whose Host header, TLS server name and dialed address all
// belong to that host, and scrubs its value from responses (see the package
// documentation for what the scrubber covers).
type Credential struct {
	Header, Value string
	// AllowHTTP sends the credential over plain HTTP too; off by default,
	// because the value would cross the network readable. Without it a
	// plain http:// request to the host is refused (403).
	AllowHTTP bool
}

// Decision is one audit record: a request or tunnel allowed or denied.
type Decision struct {
	Method     string // CONNECT, GET, ...
	Host       string
	Port       int
	Addr       string // the address dialed, when allowed
	Allowed    bool
	Reason     string // why it was denied
	Credential string // the header name injected, if any (never its value)
	BytesUp    int64  // sandbox to upstream
	BytesDown  int64  // upstream to sandbox
	// Traffic counts the same bytes as they move: a Decision passed to
	// Config.Decided can read how far the request or tunnel has gone.
	// BytesUp and BytesDown are its values at the end.
	Traffic *Traffic
	// Conn is the sandbox's connection the request came on, as the
	// Listener given to Serve returned it (a connection may carry several
	// requests).
	Conn net.Conn

	decided, logged bool
}

// Traffic counts the bytes of one request or tunnel as they move: Up
// read from the sandbox and passed upstream, Down written to the sandbox.
type Traffic struct {
	Up, Down atomic.Int64
}

// Config configures a Proxy.
type Config struct {
	Policy      Policy
	Credentials map[string]Credential // by lower-case host name
	CA          *CA                   // required when Credentials is not empty
	// Resolve looks up a host name; nil means the system resolver. Tests
	// point names at local servers with it. It is called only for names the
	// policy allows.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// UpstreamRoots verifies upstream TLS for credential hosts; nil means
	// the system roots.
	UpstreamRoots *x509.CertPool
	// MaxConns bounds the sandbox's concurrent connections to the proxy,
	// tunnels and intercepted TLS connections included; further
	// connections wait in the listen queue. Default DefaultMaxConns.
	MaxConns int
	// IdleTimeout closes a CONNECT tunnel that carried no byte either way
	// for that long. Kept-alive connections wait for their next request at
	// most min(IdleTimeout, KeepAliveTimeout). Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Log receives one Decision per request or tunnel, at its end (with
	// its bytes).
	Log func(Decision)
	// Decided, if set, receives each Decision once, as soon as the
	// request or tunnel is allowed or denied: before the sandbox hears
	// the answer (its bytes are not counted yet).
	Decided func(Decision)
	// ErrorLog receives the HTTP servers' own errors (such as a handler's
	// panic); nil means the log package's standard logger.
	ErrorLog *log.Logger
}

// Proxy is a forward proxy for one sandbox.
type Proxy struct {
	cfg     Config
	scrub   map[string]*matcher // by credential host
	srv     *http.Server        // the sandbox's connections
	inner   *http.Server        // requests inside intercepted TLS connections
	innerL  *chanListener
	rp      *httputil.ReverseProxy
	tr      *http.Transport
	wg      sync.WaitGroup // connections being served, tunnels, the inner server
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // accepted connections and upstream connections
	closed  bool
	once    sync.Once       // Close
	started bool            // the inner server runs
	ctx     context.Context // ends at Close; every request runs under it
	cancel  context.CancelFunc
	full    atomic.Bool // an accept loop waits for a free MaxConns slot
}

// New returns a proxy; call Serve to run it.
func New(cfg Config) *Proxy {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Log == nil {
		cfg.Log = func(Decision) {}
	}
	if cfg.Decided == nil {
		cfg.Decided = func(Decision) {}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	p := &Proxy{cfg: cfg, conns: map[net.Conn]struct{}{}, scrub: map[string]*matcher{}}
	for host, c := range cfg.Credentials {
		p.scrub[host] = newMatcher(c.Value)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.tr = &http.Transport{
		DialContext:            p.dialChecked,
		TLSClientConfig:        &tls.Config{RootCAs: cfg.UpstreamRoots},
		ForceAttemptHTTP2:      false,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        upstreamIdleTimeout,
		ResponseHeaderTimeout:  upstreamHeaderTimeout,
		TLSHandshakeTimeout:    upstreamTLSTimeout,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
	}
	p.rp = &httputil.ReverseProxy{
		// The upstream's Host header is the URL's host, which forward set
		// to the checked target: never a Host header of the sandbox's.
		Rewrite:       func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL; r.Out.Host = "" },
		Transport:     p.tr,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status, reason := http.StatusBadGateway, "upstream: "+err.Error()
			var de *deniedError
			if errors.As(err, &de) {
				status, reason = http.StatusForbidden, de.reason
			}
			if t, _ := r.Context().Value(ctxKey{}).(*target); t != nil {
				t.dec.Reason = reason
				p.decide(t.dec)
			}
			http.Error(w, "agentsandbox proxy: "+r.URL.Host+": "+reason, status)
		},
	}
	keepAlive := min(KeepAliveTimeout, cfg.IdleTimeout)
	base := func(net.Listener) context.Context { return p.ctx }
	p.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveHTTP),
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       keepAlive,
		BaseContext:       base,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if lc, ok := c.(*limitConn); ok {
				c = lc.Conn
			}
			return context.WithValue(ctx, clientKey{}, c)
		},
		ConnState: p.connState,
		ErrorLog:  cfg.ErrorLog,
	}
	p.innerL = newChanListener()
	p.inner = &http.Server{
		Handler:           http.HandlerFunc(p.serveIntercepted),
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       keepAlive,
		BaseContext:       base,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if ic, ok := c.(*interceptedConn); ok {
				ctx = context.WithValue(ctx, connKey{}, ic.t)
			}
			return ctx
		},
		ConnState: p.connState,
		ErrorLog:  cfg.ErrorLog,
	}
	return p
}

// Serve accepts connections on l until Close.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(&limitListener{Listener: l, sem: make(chan struct{}, p.cfg.MaxConns), track: p.track, done: p.ctx.Done(), full: &p.full})
	if errors.Is(err, http.ErrServerClosed) || p.ctx.Err() != nil && errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Close stops the proxy, closes every connection and waits for its
// goroutines. Upstream connections are reset, not shut down, so the
// kernel frees their buffers at once even if the upstream stopped reading.
// Close may be called more than once, also concurrently.
func (p *Proxy) Close() error {
	var err error
	p.once.Do(func() {
		p.cancel()
		// http.Server.Close returns once its Serve loops have ended, so no
		// connection starts being served (or counted in wg) after it.
		err = p.srv.Close()
		p.mu.Lock()
		p.closed = true
		conns := make([]net.Conn, 0, len(p.conns))
		for c := range p.conns {
			conns = append(conns, c)
		}
		p.mu.Unlock()
		for _, c := range conns { // an upConn's Close untracks itself
			abort(c)
		}
		p.inner.Close()
		p.innerL.Close()
		p.wg.Wait()
		p.tr.CloseIdleConnections()
	})
	return err
}

// abort closes c with a reset (SO_LINGER 0) when it is a TCP connection:
// no FIN waits behind unsent bytes in a socket the process no longer
// holds, for as long as the peer keeps its window shut.
func abort(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	c.Close()
}

// upConn is an upstream connection, tracked for Close until closed.
type upConn struct {
	*net.TCPConn
	once    sync.Once
	untrack func()
}

func (c *upConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(c.untrack)
	return err
}

// connState counts the goroutine serving each connection of either server
// in wg, until the connection is closed or hijacked (a hijacking handler
// counts itself).
func (p *Proxy) connState(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		p.wg.Add(1)
	case http.StateHijacked, http.StateClosed:
		p.wg.Done()
	}
}

// track adds or removes a connection Close must close; it reports false
// (and adds nothing) once the proxy is closed.
func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

type (
	ctxKey    struct{} // the *target of a request being forwarded
	connKey   struct{} // the *target of an intercepted connection
	clientKey struct{} // the sandbox's connection a request came on (Decision.Conn)
)

// target is where a request is allowed to go.
type target struct {
	host  string
	port  int
	cred  *Credential
	scrub *matcher
	dec   *Decision
}

// check applies the name rules to host:port. It resolves nothing: a name
// is looked up only once allowed, when dialing.
func (p *Proxy) check(r *http.Request, method, hostport string, defPort int) (*target, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		host, ps = hostport, strconv.Itoa(defPort)
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	port, err := strconv.Atoi(ps)
	client, _ := r.Context().Value(clientKey{}).(net.Conn)
	dec := &Decision{Method: method, Host: host, Port: port, Conn: client, Traffic: new(Traffic)}
	if err != nil || port < 1 || port > 65535 {
		return nil, p.deny(dec, "bad port")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !p.cfg.Policy.InCIDR(a) {
			return nil, p.deny(dec, "address not in the allow-list")
		}
	} else if !p.cfg.Policy.AllowName(host, port) {
		return nil, p.deny(dec, "host not in the allow-list")
	}
	t := &target{host: host, port: port, dec: dec}
	if c, ok := p.cfg.Credentials[host]; ok {
		t.cred, t.scrub = &c, p.scrub[host]
		dec.Credential = c.Header
	}
	return t, nil
}

func (p *Proxy) deny(d *Decision, reason string) error {
	d.Reason = reason
	p.decide(d)
	p.logOnce(d)
	return errors.New(reason)
}

// refuse answers 403 and records the denial.
func (p *Proxy) refuse(w http.ResponseWriter, t *target, reason string) {
	p.deny(t.dec, reason)
	http.Error(w, "agentsandbox proxy: "+t.host+": "+reason, http.StatusForbidden)
}

// decide passes d to Config.Decided, once.
func (p *Proxy) decide(d *Decision) {
	if !d.decided {
		d.decided = true
		p.cfg.Decided(*d)
	}
}

func (p *Proxy) logOnce(d *Decision) {
	p.decide(d)
	if !d.logged {
		d.logged = true
		p.cfg.Log(*d)
	}
}

// deniedError is a dial the policy refused (as opposed to a network
// failure).
type deniedError struct{ reason string }

func (e *deniedError) Error() string { return e.reason }

// dialChecked resolves the target once and dials only an allowed address,
// so a name that resolves to a forbidden address (or rebinds) fails with a
// *deniedError. It runs on the http.Transport's dialing goroutine, which can
// outlive the request, so it leaves the target's Decision alone; callers
// record the outcome.
func (p *Proxy) dialChecked(ctx context.Context, network, addr string) (net.Conn, error) {
	t, _ := ctx.Value(ctxKey{}).(*target)
	if t == nil {
		return nil, errors.New("no checked target")
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(t.host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		addrs, err = p.cfg.Resolve(rctx, t.host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cannot resolve %s: %w", t.host, err)
		}
	}
	// The host's addresses now, not when the proxy started: bridges come
	// and go.
	own := localAddrs()
	var ok []netip.Addr
	var why string
	for _, a := range addrs {
		a = a.Unmap()
		if allowed, reason := p.cfg.Policy.AllowAddr(a, own[a]); allowed {
			ok = append(ok, a)
		} else if why == "" {
			why = reason
		}
	}
	if len(ok) == 0 {
		return nil, &deniedError{fmt.Sprintf("resolves to forbidden address %v: %s", addrs, why)}
	}
	var d net.Dialer
	var err error
	for _, a := range ok {
		var c net.Conn
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(t.port)).String())
		if err == nil {
			return p.upstream(c)
		}
	}
	return nil, err
}

// upstream bounds a new upstream connection's kernel buffers and tracks it
// for Close.
func (p *Proxy) upstream(c net.Conn) (net.Conn, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("upstream connection is a %T, not TCP", c)
	}
	tc.SetWriteBuffer(UpstreamBuffer)
	tc.SetReadBuffer(UpstreamBuffer)
	u := &upConn{TCPConn: tc}
	u.untrack = func() { p.track(u, false) }
	if !p.track(u, true) {
		abort(tc)
		return nil, errors.New("the proxy is closing")
	}
	return u, nil
}

// serveHTTP serves the sandbox's connection: CONNECT, or a proxy request
// with an absolute URL.
func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		// Close waits for tunnels and intercepted connections, which
		// http.Server does not track once hijacked. This connection is
		// counted in wg until the hijack, so the count stays positive.
		p.wg.Add(1)
		defer p.wg.Done()
		p.connect(w, r)
		return
	}
	if r.URL.Host == "" || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		http.Error(w, "agentsandbox proxy: only proxy requests (absolute URLs) are served", http.StatusBadRequest)
		return
	}
	def := 80
	if r.URL.Scheme == "https" {
		def = 443
	}
	t, err := p.check(r, r.Method, r.URL.Host, def)
	if err != nil {
		http.Error(w, "agentsandbox proxy: "+r.URL.Host+": "+err.Error(), http.StatusForbidden)
		return
	}
	if t.cred != nil && r.URL.Scheme == "http" && !t.cred.AllowHTTP {
		p.refuse(w, t, "credential host "+t.host+" is served over https only (the proxy adds the credential to https:// requests)")
		return
	}
	// net/http takes the host of an absolute URL and ignores a Host header
	// behind it (RFC 9112, 3.2.2), so r.Host is the URL's; check anyway.
	if !sameHost(r.Host, t) {
		p.refuse(w, t, fmt.Sprintf("Host header %q does not match the URL's host", r.Host))
		return
	}
	p.forward(w, r, t, r.URL.Scheme, def)
}

// sameHost reports whether a Host header names the target: the same host,
// ignoring ASCII case and a trailing dot, and no port or the target's.
// An empty Host (HTTP/1.0) is the target's.
func sameHost(h string, t *target) bool {
	if h == "" {
		return true
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		host, port = h, ""
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return strings.EqualFold(host, strings.TrimSuffix(t.host, ".")) && (port == "" || port == strconv.Itoa(t.port))
}

// forward sends r to the checked target with the credential added and logs
// it. The URL's host (so the Host header, the TLS server name and the
// address dialed) is the target's.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t *target, scheme string, defPort int) {
	r.URL.Scheme, r.URL.Host = scheme, t.host
	if strings.Contains(t.host, ":") {
		r.URL.Host = "[" + t.host + "]"
	}
	if t.port != defPort {
		r.URL.Host = net.JoinHostPort(t.host, strconv.Itoa(t.port))
	}
	r.Header.Del("Proxy-Authorization")
	r.Header.Del("Proxy-Connection")
	if t.cred != nil {
		r.Header.Set(t.cred.Header, t.cred.Value)
		// Let the transport ask for gzip itself, so it decompresses the
		// response before the scrubber reads it.
		r.Header.Del("Accept-Encoding")
	}
	r.Body = &countReader{r: r.Body, n: &t.dec.Traffic.Up}
	cw := &countWriter{ResponseWriter: w, n: &t.dec.Traffic.Down}
	var out http.ResponseWriter = cw
	if t.cred != nil {
		out = &scrubWriter{countWriter: cw, m: t.scrub}
	}
	ctx := context.WithValue(r.Context(), ctxKey{}, t)
	// A kept-alive upstream connection is reused without a dial, so the
	// request is recorded as allowed when it gets a connection.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		t.dec.Allowed, t.dec.Addr = true, i.Conn.RemoteAddr().String()
		p.decide(t.dec)
	}})
	p.rp.ServeHTTP(out, r.WithContext(ctx))
	if s, ok := out.(*scrubWriter); ok {
		s.flushTail()
		s.scrubHeader() // trailers, set after the body
	}
	t.dec.BytesUp, t.dec.BytesDown = t.dec.Traffic.Up.Load(), t.dec.Traffic.Down.Load()
	p.logOnce(t.dec)
}

// connect handles CONNECT: a checked tunnel, or TLS interception for hosts
// with a credential.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	t, err := p.check(r, "CONNECT", r.Host, 443)
	if err != nil {
		http.Error(w, "agentsandbox proxy: "+r.Host+": "+err.Error(), http.StatusForbidden)
		return
	}
	if t.cred != nil && p.cfg.CA != nil {
		p.intercept(w, t)
		return
	}
	ctx := context.WithValue(r.Context(), ctxKey{}, t)
	up, err := p.dialChecked(ctx, "tcp", r.Host)
	if err != nil {
		status, reason := http.StatusBadGateway, "upstream: "+err.Error()
		var de *deniedError
		if errors.As(err, &de) {
			status, reason = http.StatusForbidden, de.reason
		}
		p.deny(t.dec, reason)
		http.Error(w, "agentsandbox proxy: "+r.Host+": "+reason, status)
		return
	}
	t.dec.Allowed, t.dec.Addr = true, up.RemoteAddr().String()
	p.decide(t.dec)
	defer up.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	p.tunnel(conn, brw.Reader, up, t.dec.Traffic)
	t.dec.BytesUp, t.dec.BytesDown = t.dec.Traffic.Up.Load(), t.dec.Traffic.Down.Load()
	p.logOnce(t.dec)
}

// tunnel copies bytes both ways until either side closes, or until no byte
// moved either way for IdleTimeout: every read that returns data pushes
// both connections' deadlines further. When a side fails (the sandbox's
// connection is gone, a deadline passed) the upstream connection is reset,
// which also ends a write blocked on an upstream that stopped reading.
// It counts the bytes in tr as they are written.
func (p *Proxy) tunnel(conn net.Conn, br *bufio.Reader, up net.Conn, tr *Traffic) {
	idle := &idleDeadline{d: p.cfg.IdleTimeout, conns: [2]net.Conn{conn, up}}
	idle.touch()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := io.Copy(countedWriter{up, &tr.Up}, idleReader{br, idle}) // buffered bytes first
		if cw, ok := up.(interface{ CloseWrite() error }); ok && err == nil {
			cw.CloseWrite()
		} else {
			abort(up) // timed out, or the sandbox's side failed
		}
	}()
	if _, err := io.Copy(countedWriter{conn, &tr.Down}, idleReader{up, idle}); err != nil {
		abort(up) // timed out, or either side failed: nothing more can flow
	}
	conn.Close()
	<-done
}

// countedWriter adds the bytes written through it to n. It counts them
// before the write and takes back what was not written, so a peer that
// has read them finds them counted.
type countedWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countedWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	n, err := c.w.Write(p)
	c.n.Add(int64(n - len(p)))
	return n, err
}

// idleDeadline keeps the deadlines of a tunnel's two connections d ahead
// of the last byte read from either; it refreshes them at most every d/16.
type idleDeadline struct {
	d     time.Duration
	conns [2]net.Conn
	next  atomic.Int64 // UnixNano after which to refresh
}

func (i *idleDeadline) touch() {
	now := time.Now()
	if now.UnixNano() < i.next.Load() {
		return
	}
	i.next.Store(now.Add(i.d / 16).UnixNano())
	for _, c := range i.conns {
		c.SetDeadline(now.Add(i.d))
	}
}

type idleReader struct {
	r    io.Reader
	idle *idleDeadline
}

func (r idleReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if n > 0 {
		r.idle.touch()
	}
	return n, err
}

// intercept terminates TLS with a certificate from the sandbox's CA and
// hands the connection to the inner server, whose handler
// (serveIntercepted) forwards each request with the credential.
func (p *Proxy) intercept(w http.ResponseWriter, t *target) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	handed := false
	defer func() {
		if !handed {
			conn.Close()
		}
	}()
	conn.SetDeadline(time.Now().Add(ReadHeaderTimeout))
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	leaf, err := p.cfg.CA.Leaf(t.host)
	if err != nil {
		p.deny(t.dec, "no certificate: "+err.Error())
		return
	}
	tc := tls.Server(&bufConn{Conn: conn, r: brw.Reader}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(p.ctx, ReadHeaderTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		p.deny(t.dec, "TLS handshake with the sandbox failed: "+err.Error())
		return
	}
	conn.SetDeadline(time.Time{})
	if !p.startInner() {
		return
	}
	// The inner server closes the connection (and so releases its
	// MaxConns slot) when done with it.
	handed = p.innerL.hand(&interceptedConn{Conn: tc, t: t})
}

// startInner starts the inner server on first use; it reports false once
// the proxy is closed.
func (p *Proxy) startInner() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if !p.started {
		p.started = true
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.inner.Serve(p.innerL)
		}()
	}
	return true
}

// serveIntercepted forwards a request read inside an intercepted TLS
// connection to the connection's host, with the credential. A request
// naming another host (domain fronting) is refused.
func (p *Proxy) serveIntercepted(w http.ResponseWriter, r *http.Request) {
	ct, _ := r.Context().Value(connKey{}).(*target)
	if ct == nil {
		http.Error(w, "agentsandbox proxy: no target", http.StatusInternalServerError)
		return
	}
	t := &target{host: ct.host, port: ct.port, cred: ct.cred, scrub: ct.scrub,
		dec: &Decision{Method: r.Method, Host: ct.host, Port: ct.port, Credential: ct.cred.Header, Conn: ct.dec.Conn, Traffic: new(Traffic)}}
	if r.Method == http.MethodConnect {
		p.refuse(w, t, "CONNECT inside an intercepted connection")
		return
	}
	if !sameHost(r.Host, t) {
		p.refuse(w, t, fmt.Sprintf("Host %q is not %s: the credential goes to %s only", r.Host, t.host, t.host))
		return
	}
	p.forward(w, r, t, "https", 443)
}

// localAddrs returns the addresses of this host's interfaces.
func localAddrs() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			m[pfx.Addr().Unmap()] = true
		}
	}
	return m
}

// limitListener bounds open connections, and tracks them for Close.
type limitListener struct {
	net.Listener
	sem   chan struct{}
	track func(net.Conn, bool) bool
	done  <-chan struct{} // closed by Close
	full  *atomic.Bool    // set while Accept waits for a free slot
}

func (l *limitListener) Accept() (net.Conn, error) {
	// Waiting for a free slot must end at Close: http.Server.Close waits
	// for this loop before it closes the connections holding the slots.
	select {
	case l.sem <- struct{}{}:
	default:
		l.full.Store(true)
		select {
		case l.sem <- struct{}{}:
			l.full.Store(false)
		case <-l.done:
			l.full.Store(false)
			l.Listener.Close()
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	if !l.track(c, true) {
		c.Close()
		<-l.sem
		return nil, net.ErrClosed
	}
	return &limitConn{Conn: c, release: func() { l.track(c, false); <-l.sem }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// chanListener is the inner server's listener: intercept hands it
// connections whose TLS handshake is done.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

// hand passes c to Accept; it reports false if the listener is closed.
func (l *chanListener) hand(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "intercepted" }

// interceptedConn is an intercepted TLS connection and its CONNECT target.
// It is not a *tls.Conn, so the inner server takes it as plain HTTP/1.1 and
// does not start a handshake of its own.
type interceptedConn struct {
	net.Conn
	t *target
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

type countReader struct {
	r io.ReadCloser
	n *atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
func (c *countReader) Close() error { return c.r.Close() }

// countWriter counts the body bytes sent to the sandbox. Neither it nor
// scrubWriter has an Unwrap method, so ReverseProxy cannot hijack the
// connection for a protocol switch (101), which would bypass the scrubber.
type countWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p))) // before, as countedWriter
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n - len(p)))
	return n, err
}

func (c *countWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
