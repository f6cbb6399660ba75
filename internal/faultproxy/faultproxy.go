// Package faultproxy is a test-only fault injector for the Docker engine's
// API: a proxy on a unix socket of its own that forwards every connection,
// byte for byte, to the engine's socket, and that a test can freeze (the
// engine stops answering, nothing is closed), thaw, or cut (the engine is
// gone: every connection closes and new ones are refused). A hook sees the
// request line of each HTTP request that goes by, so a test can act at an
// exact point of a call: freeze when "/containers/create" goes by, cancel a
// context at the k-th request.
//
// Point a client at it with "unix://" + Proxy.Path (for the sandbox
// package: sandbox.WithHost("unix://" + p.Path)).
//
// The proxy does not understand HTTP beyond spotting request lines: each
// connection is two byte pumps (client to engine, engine to client), so
// hijacked streams (attach, exec start) and half-closes are carried as they
// are. A request line is recognised only at the start of a read from the
// client, which is where Go's HTTP client puts it; once a connection has
// carried an upgrade request (attach, exec start), the rest of it is a raw
// stream and is no longer scanned.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// DefaultSocket is the engine socket used when DOCKER_HOST does not name a
// unix socket.
const DefaultSocket = "/var/run/docker.sock"

// Request describes one HTTP request line seen on its way to the engine.
type Request struct {
	// N numbers the requests the proxy has seen, on all connections,
	// starting at 1, in the order the hook is called.
	N int
	// Conn numbers the client connection that carried the request, starting
	// at 1 in the order connections were accepted.
	Conn int
	// Method is the HTTP method ("GET", "POST", ...).
	Method string
	// Path is the request target as sent, with the API version prefix and
	// query, e.g. "/v1.41/containers/create?name=".
	Path string
}

// String returns "METHOD PATH".
func (r Request) String() string { return r.Method + " " + r.Path }

// Proxy forwards connections from its socket (Path) to the engine's. Its
// methods are safe for concurrent use, including from the request hook.
type Proxy struct {
	// Path is the proxy's unix socket; clients connect to "unix://" + Path.
	Path string

	target string // the engine's socket
	dir    string // temp dir holding Path
	ln     *net.UnixListener

	mu     sync.Mutex
	up     chan struct{} // non-nil while client→engine bytes are frozen; closed by Thaw
	down   chan struct{} // non-nil while engine→client bytes are frozen; closed by Thaw
	dead   chan struct{} // closed by Cut or Close
	isDead bool
	links  map[*link]struct{}
	nconn  int
	nreq   int
	nheld  int // goroutines waiting in pass for a frozen direction to thaw

	hookMu sync.Mutex // guards hook
	hook   func(Request)
	callMu sync.Mutex // serialises hook calls

	wg        sync.WaitGroup // the accept loop and every pump
	closeOnce sync.Once
}

// link is one proxied connection: the client's side and, once dialled, the
// engine's.
type link struct {
	n        int
	client   net.Conn
	engine   net.Conn
	hijacked bool   // set by the client→engine pump once an upgrade request went by
	last     string // the last request line seen on it (guarded by Proxy.mu)
	mu       sync.Mutex
	pumps    int // pumps still running; the last one closes both sides
}

// Target returns the engine socket a proxy started with target "" uses:
// the path of DOCKER_HOST if it is a unix:// address, else DefaultSocket.
func Target() string {
	if h, ok := strings.CutPrefix(os.Getenv("DOCKER_HOST"), "unix://"); ok && h != "" {
		return h
	}
	return DefaultSocket
}

// Start starts a proxy listening on a new socket in a fresh temporary
// directory and forwarding to the unix socket target ("" for Target()).
// Close it when done.
func Start(target string) (*Proxy, error) {
	if target == "" {
		target = Target()
	}
	dir, err := os.MkdirTemp("", "faultproxy-")
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		Path:   filepath.Join(dir, "engine.sock"),
		target: target,
		dir:    dir,
		dead:   make(chan struct{}),
		links:  map[*link]struct{}{},
	}
	p.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: p.Path, Net: "unix"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// After Cut the socket file stays, so that connecting to it is refused
	// (ECONNREFUSED) like connecting to a stopped engine's socket, rather
	// than failing with "no such file"; Close removes it.
	p.ln.SetUnlinkOnClose(false)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// OnRequest sets the function called with each request line seen (nil for
// none), replacing the previous one. It is called before the bytes holding
// the request are forwarded, so what it does (Freeze, Cut, killing a
// container, cancelling a context) happens before the engine sees the
// request. Calls are serialised; a hook that blocks holds up every
// connection's requests. A hook may call any method but Close.
func (p *Proxy) OnRequest(hook func(Request)) {
	p.hookMu.Lock()
	p.hook = hook
	p.hookMu.Unlock()
}

// Requests returns how many request lines the proxy has seen so far.
func (p *Proxy) Requests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nreq
}

// Conns returns how many connections are open through the proxy now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Open describes the connections open through the proxy now, each as
// "#N LAST-REQUEST" (the last request line seen on it; hijacked streams
// show the request that started them), in no particular order.
func (p *Proxy) Open() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d []string
	for l := range p.links {
		d = append(d, fmt.Sprintf("#%d %s", l.n, l.last))
	}
	return d
}

// Freeze stops moving bytes in both directions on every connection: bytes
// already read are held, nothing more is written either way, and new
// connections are accepted but not forwarded. Nothing is closed. To the
// client the engine looks stopped (SIGSTOP). Thaw resumes.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up == nil {
		p.up = make(chan struct{})
	}
	if p.down == nil {
		p.down = make(chan struct{})
	}
}

// FreezeReplies stops moving bytes from the engine to clients only:
// requests still reach the engine and are carried out, but their answers
// (and the output of attached streams) are held until Thaw.
func (p *Proxy) FreezeReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down == nil {
		p.down = make(chan struct{})
	}
}

// Thaw resumes forwarding after Freeze or FreezeReplies; held bytes are
// delivered in order (to connections whose other side has gone meanwhile,
// as far as they can be).
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up != nil {
		close(p.up)
		p.up = nil
	}
	if p.down != nil {
		close(p.down)
		p.down = nil
	}
}

// Cut makes the engine look gone: it stops accepting (later connections are
// refused) and closes every connection, dropping held bytes. It cannot be
// undone; Close still has to be called.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.isDead {
		p.mu.Unlock()
		return
	}
	p.isDead = true
	close(p.dead)
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.ln.Close()
	for _, l := range links {
		l.closeAll()
	}
}

// Close cuts the proxy (see Cut), waits for all its goroutines to end and
// removes its socket. A hook still running holds it up.
func (p *Proxy) Close() error {
	p.Cut()
	p.closeOnce.Do(func() {
		p.wg.Wait()
		os.RemoveAll(p.dir)
	})
	return nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed by Cut
		}
		p.mu.Lock()
		if p.isDead {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.nconn++
		l := &link{n: p.nconn, client: c, pumps: 2}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l)
	}
}

// serve dials the engine for l (once the proxy is not frozen) and runs its
// two pumps.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	if !p.pass(true) {
		p.drop(l)
		return
	}
	e, err := net.Dial("unix", p.target)
	if err != nil {
		p.drop(l)
		return
	}
	p.mu.Lock()
	if p.isDead {
		p.mu.Unlock()
		e.Close()
		p.drop(l)
		return
	}
	l.mu.Lock()
	l.engine = e
	l.mu.Unlock()
	p.wg.Add(2)
	p.mu.Unlock()
	go p.pump(l, l.client, e, true)
	go p.pump(l, e, l.client, false)
}

// drop closes and forgets a link whose pumps never started.
func (p *Proxy) drop(l *link) {
	l.closeAll()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (l *link) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.client.Close()
	if l.engine != nil {
		l.engine.Close()
	}
}

// pass waits until bytes may move in the given direction (up: client to
// engine). It returns false if the proxy was cut meanwhile.
func (p *Proxy) pass(up bool) bool {
	for {
		p.mu.Lock()
		if p.isDead {
			p.mu.Unlock()
			return false
		}
		gate := p.down
		if up {
			gate = p.up
		}
		if gate == nil {
			p.mu.Unlock()
			return true
		}
		p.nheld++
		p.mu.Unlock()
		var cut bool
		select {
		case <-gate:
		case <-p.dead:
			cut = true
		}
		p.mu.Lock()
		p.nheld--
		p.mu.Unlock()
		if cut {
			return false
		}
	}
}

// held returns how many goroutines wait for a frozen direction to thaw: a
// connection's dial of the engine, or a pump holding bytes it has read.
func (p *Proxy) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nheld
}

// pump copies from src to dst. An EOF from src is passed on as a
// half-close of dst; any other failure closes both sides. The last pump of
// a link to end closes it and forgets it.
func (p *Proxy) pump(l *link, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	clean := false
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if up && !l.hijacked {
				p.scan(l, buf[:n])
			}
			if !p.pass(up) {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && p.pass(up) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
					clean = true
				}
			}
			break
		}
	}
	if !clean {
		l.closeAll()
	}
	l.mu.Lock()
	l.pumps--
	last := l.pumps == 0
	l.mu.Unlock()
	if last {
		l.closeAll()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}
}

// requestLine matches an HTTP/1.x request line at the start of a read.
var requestLine = regexp.MustCompile(`^(GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) (/[^ \r\n]*) HTTP/1\.[01]\r?\n`)

// upgrade matches the header of a request that turns the connection into a
// raw stream (attach, exec start).
var upgrade = regexp.MustCompile(`(?i)\r\n(upgrade:|connection:[^\r\n]*upgrade)`)

// scan reports a request line at the start of b to the hook, and marks the
// link hijacked when the request asks for an upgrade.
func (p *Proxy) scan(l *link, b []byte) {
	m := requestLine.FindSubmatch(b)
	if m == nil {
		return
	}
	head := b
	if i := strings.Index(string(b), "\r\n\r\n"); i >= 0 {
		head = b[:i+2]
	}
	if upgrade.Match(head) {
		l.hijacked = true
	}
	p.callMu.Lock()
	defer p.callMu.Unlock()
	p.mu.Lock()
	p.nreq++
	r := Request{N: p.nreq, Conn: l.n, Method: string(m[1]), Path: string(m[2])}
	l.last = r.String()
	p.mu.Unlock()
	p.hookMu.Lock()
	hook := p.hook
	p.hookMu.Unlock()
	if hook != nil {
		hook(r)
	}
}

// String describes the proxy for test logs.
func (p *Proxy) String() string {
	return fmt.Sprintf("faultproxy %s -> %s", p.Path, p.target)
}
