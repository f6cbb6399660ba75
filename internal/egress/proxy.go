package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
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

// The proxy is built on net/http (an http.Server for the sandbox side and
// httputil.ReverseProxy for forwarding) rather than a proxy library: the
// parts that matter here — resolving names once and dialing only checked
// addresses, bounding connections, and TLS interception for credential
// hosts only — are hooks a library would have to be bent around, while the
// standard library already does HTTP/1.1 parsing, hop-by-hop headers and
// streaming correctly.

// Credential is a header added to requests for one host.
type Credential struct {
	Header, Value string
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

	logged bool
}

// Config configures a Proxy.
type Config struct {
	Policy      Policy
	Credentials map[string]Credential // by lower-case host name
	CA          *CA                   // required when Credentials is not empty
	// Resolve looks up a host name; nil means the system resolver. Tests
	// point names at local servers with it.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// UpstreamRoots verifies upstream TLS for credential hosts; nil means
	// the system roots.
	UpstreamRoots *x509.CertPool
	// MaxConns bounds the sandbox's concurrent connections to the proxy;
	// further connections wait in the listen queue. Default 128.
	MaxConns int
	// Log receives one Decision per request or tunnel.
	Log func(Decision)
}

// Proxy is a forward proxy for one sandbox.
type Proxy struct {
	cfg    Config
	local  map[netip.Addr]bool // this host's own addresses
	srv    *http.Server
	rp     *httputil.ReverseProxy
	tr     *http.Transport
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	done   chan struct{}
	ctx    context.Context // ends at Close; intercepted requests run under it
	cancel context.CancelFunc
}

// New returns a proxy; call Serve to run it.
func New(cfg Config) *Proxy {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 128
	}
	if cfg.Log == nil {
		cfg.Log = func(Decision) {}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	p := &Proxy{cfg: cfg, local: localAddrs(), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.tr = &http.Transport{
		DialContext:           p.dialChecked,
		TLSClientConfig:       &tls.Config{RootCAs: cfg.UpstreamRoots},
		ForceAttemptHTTP2:     false,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		TLSHandshakeTimeout:   30 * time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL; r.Out.Host = r.In.Host },
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
			}
			http.Error(w, "agentsandbox proxy: "+r.URL.Host+": "+reason, status)
		},
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serveHTTP), ReadHeaderTimeout: 30 * time.Second}
	return p
}

// Serve accepts connections on l until Close.
func (p *Proxy) Serve(l net.Listener) error {
	err := p.srv.Serve(&limitListener{Listener: l, sem: make(chan struct{}, p.cfg.MaxConns), track: p.track})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	close(p.done)
	p.cancel()
	err := p.srv.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.tr.CloseIdleConnections()
	return err
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

type ctxKey struct{}

// target is where a request is allowed to go.
type target struct {
	host string
	port int
	cred *Credential
	dec  *Decision
}

// check applies the name rules to host:port.
func (p *Proxy) check(method, hostport string, defPort int) (*target, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		host, ps = hostport, strconv.Itoa(defPort)
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	port, err := strconv.Atoi(ps)
	dec := &Decision{Method: method, Host: host, Port: port}
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
		t.cred = &c
		dec.Credential = c.Header
	}
	return t, nil
}

func (p *Proxy) deny(d *Decision, reason string) error {
	d.Reason = reason
	p.logOnce(d)
	return errors.New(reason)
}

func (p *Proxy) logOnce(d *Decision) {
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
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err = p.cfg.Resolve(rctx, t.host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cannot resolve %s: %w", t.host, err)
		}
	}
	var ok []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if p.cfg.Policy.InCIDR(a) || (p.cfg.Policy.AllowAddr(a) && !p.local[a]) {
			ok = append(ok, a)
		}
	}
	if len(ok) == 0 {
		return nil, &deniedError{fmt.Sprintf("resolves to forbidden address %v", addrs)}
	}
	var d net.Dialer
	var err error
	for _, a := range ok {
		var c net.Conn
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(t.port)).String())
		if err == nil {
			return c, nil
		}
	}
	return nil, err
}

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		// Close waits for tunnels and intercepted connections, which
		// http.Server does not track once hijacked.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
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
	t, err := p.check(r.Method, r.URL.Host, def)
	if err != nil {
		http.Error(w, "agentsandbox proxy: "+r.URL.Host+": "+err.Error(), http.StatusForbidden)
		return
	}
	p.forward(w, r, t)
}

// forward sends r upstream with the credential added and logs it.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, t *target) {
	r.Header.Del("Proxy-Authorization")
	r.Header.Del("Proxy-Connection")
	if t.cred != nil {
		r.Header.Set(t.cred.Header, t.cred.Value)
		// Let the transport ask for gzip itself, so it decompresses the
		// response before the scrubber reads it.
		r.Header.Del("Accept-Encoding")
	}
	up := &countReader{r: r.Body}
	r.Body = up
	cw := &countWriter{ResponseWriter: w}
	var out http.ResponseWriter = cw
	if t.cred != nil {
		out = &scrubWriter{countWriter: cw, secret: []byte(t.cred.Value)}
	}
	ctx := context.WithValue(r.Context(), ctxKey{}, t)
	// A kept-alive upstream connection is reused without a dial, so the
	// request is recorded as allowed when it gets a connection.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		t.dec.Allowed, t.dec.Addr = true, i.Conn.RemoteAddr().String()
	}})
	p.rp.ServeHTTP(out, r.WithContext(ctx))
	if s, ok := out.(*scrubWriter); ok {
		s.flushTail()
		s.scrubValues() // trailers, set after the body
	}
	t.dec.BytesUp, t.dec.BytesDown = up.n.Load(), cw.n
	p.logOnce(t.dec)
}

// connect handles CONNECT: a checked tunnel, or TLS interception for hosts
// with a credential.
func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	t, err := p.check("CONNECT", r.Host, 443)
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
	defer up.Close()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	p.track(up, true)
	defer p.track(up, false)
	io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
	var upN, downN int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		upN, _ = io.Copy(up, brw.Reader) // buffered bytes first
		if tc, ok := up.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	downN, _ = io.Copy(conn, up)
	conn.Close()
	<-done
	t.dec.BytesUp, t.dec.BytesDown = upN, downN
	p.logOnce(t.dec)
}

// intercept terminates TLS with a certificate from the sandbox's CA and
// serves the requests inside through forward, which adds the credential.
func (p *Proxy) intercept(w http.ResponseWriter, t *target) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n")
	leaf, err := p.cfg.CA.Leaf(t.host)
	if err != nil {
		return
	}
	tc := tls.Server(&bufConn{Conn: conn, r: brw.Reader}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	if err := tc.Handshake(); err != nil {
		p.deny(t.dec, "TLS handshake with the sandbox failed: "+err.Error())
		return
	}
	br := bufio.NewReader(tc)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		req.URL.Scheme, req.URL.Host = "https", net.JoinHostPort(t.host, strconv.Itoa(t.port))
		req.RequestURI = ""
		req = req.WithContext(p.ctx) // Close ends requests still waiting upstream
		rt := &target{host: t.host, port: t.port, cred: t.cred,
			dec: &Decision{Method: req.Method, Host: t.host, Port: t.port, Credential: t.cred.Header}}
		rw := newConnResponseWriter(tc)
		p.forward(rw, req, rt)
		if err := rw.finish(); err != nil || req.Close || rw.closeAfter {
			return
		}
		select {
		case <-p.done:
			return
		default:
		}
	}
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
	track func(net.Conn, bool)
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.track(c, true)
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

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

type countReader struct {
	r io.ReadCloser
	n atomic.Int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
func (c *countReader) Close() error { return c.r.Close() }

type countWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// scrubWriter replaces the credential's value in response headers and body
// with "[redacted]", so an upstream that echoes requests back cannot hand
// the secret to the sandbox. It holds back len(secret)-1 bytes so a secret
// split across writes is caught.
type scrubWriter struct {
	*countWriter
	secret []byte
	tail   []byte
	wrote  bool
	drop   bool // the body is encoded and cannot be scrubbed
}

var redacted = []byte("[redacted]")

func (s *scrubWriter) WriteHeader(code int) {
	if s.wrote {
		return
	}
	if code < 200 { // informational (103 Early Hints): more headers follow
		s.scrubValues()
		s.countWriter.ResponseWriter.WriteHeader(code)
		return
	}
	s.scrubHeaders()
	if s.drop {
		code = http.StatusBadGateway
	}
	s.countWriter.ResponseWriter.WriteHeader(code)
	if s.drop {
		s.countWriter.Write([]byte(encodedMsg))
	}
}

const encodedMsg = "agentsandbox proxy: the upstream sent an encoded (compressed) response, which cannot be checked for the credential\n"

func (s *scrubWriter) scrubHeaders() {
	if s.wrote {
		return
	}
	s.wrote = true
	h := s.countWriter.Header()
	h.Del("Content-Length") // the body may change length
	// The transport decompresses gzip it asked for; any other encoding
	// would hide the secret from the scrubber.
	if ce := h.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		s.drop = true
		clear(h)
		h.Set("Content-Type", "text/plain; charset=utf-8")
		return
	}
	s.scrubValues()
}

func (s *scrubWriter) scrubValues() {
	h := s.countWriter.Header()
	for k, vs := range h {
		for i, v := range vs {
			h[k][i] = strings.ReplaceAll(v, string(s.secret), string(redacted))
		}
	}
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	if !s.wrote {
		s.WriteHeader(http.StatusOK)
	}
	if s.drop {
		return len(p), nil
	}
	buf := append(s.tail, p...)
	buf = bytes.ReplaceAll(buf, s.secret, redacted)
	keep := min(len(s.secret)-1, len(buf))
	s.tail = append([]byte(nil), buf[len(buf)-keep:]...)
	if _, err := s.countWriter.Write(buf[:len(buf)-keep]); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *scrubWriter) flushTail() {
	if len(s.tail) > 0 && !s.drop {
		s.countWriter.Write(s.tail)
		s.tail = nil
	}
}

// connResponseWriter is a minimal http.ResponseWriter over an intercepted
// TLS connection: it writes an HTTP/1.1 response, chunked.
type connResponseWriter struct {
	c          net.Conn
	bw         *bufio.Writer
	h          http.Header
	code       int
	started    bool
	chunked    bool
	closeAfter bool
}

func newConnResponseWriter(c net.Conn) *connResponseWriter {
	return &connResponseWriter{c: c, bw: bufio.NewWriter(c), h: http.Header{}}
}

func (w *connResponseWriter) Header() http.Header { return w.h }

func (w *connResponseWriter) WriteHeader(code int) {
	if w.started || code < 200 { // informational responses are not passed on
		return
	}
	w.started, w.code = true, code
	w.h.Del("Transfer-Encoding")
	if w.h.Get("Content-Length") == "" && code != http.StatusNoContent && code != http.StatusNotModified && code >= 200 {
		w.chunked = true
		w.h.Set("Transfer-Encoding", "chunked")
	}
	if strings.EqualFold(w.h.Get("Connection"), "close") {
		w.closeAfter = true
	}
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	w.h.Write(w.bw)
	w.bw.WriteString("\r\n")
}

func (w *connResponseWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if w.chunked {
		fmt.Fprintf(w.bw, "%x\r\n", len(p))
		w.bw.Write(p)
		_, err := w.bw.WriteString("\r\n")
		return len(p), err
	}
	return w.bw.Write(p)
}

func (w *connResponseWriter) Flush() { w.bw.Flush() }

func (w *connResponseWriter) finish() error {
	if !w.started {
		w.WriteHeader(http.StatusOK)
	}
	if w.chunked {
		w.bw.WriteString("0\r\n\r\n")
	}
	return w.bw.Flush()
}
