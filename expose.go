package sandbox

import (
	"context"
	"fmt"
	"log/slog"
)

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
	return s.exposed.expose(port, exposeTo{agent: s.agent, id: s.id, log: s.log, timeout: s.cfg.timeout, bounds: s.exposeBounds()})
}

// exposeBounds are the bounds of the sandbox's Expose connections: the
// package's, or a test hook's.
func (s *Sandbox) exposeBounds() exposeBounds {
	b := exposeBounds{idle: exposeIdle, afterEOF: exposeAfterEOF, max: exposeMaxConns}
	if t := s.cfg.expose; t != nil {
		b = *t
	}
	return b
}
