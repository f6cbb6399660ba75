// Package egress is the host-side proxy through which an allow-listed
// sandbox reaches the network. It speaks plain HTTP proxying and CONNECT,
// resolves names itself and checks every resolved address, refuses
// loopback, private, link-local (cloud metadata) and other special ranges
// unless a CIDR rule names them, bounds concurrent connections, and — for
// hosts with a credential — terminates TLS with a per-sandbox CA to add the
// credential's header upstream, so the secret never enters the sandbox.
//
// What a sandbox can make the host hold is bounded:
//   - connections: at most Config.MaxConns (default 128) at once, tunnels
//     and intercepted TLS connections included; more wait in the listen
//     queue;
//   - request heads: MaxHeaderBytes (64 KiB) on the proxy connection and
//     inside intercepted connections (431 beyond), read within
//     ReadHeaderTimeout (30 s), which also bounds the sandbox's TLS
//     handshake; upstream response heads: MaxResponseHeaderBytes (1 MiB),
//     within 2 minutes;
//   - time: a kept-alive connection waits min(KeepAliveTimeout (2 min),
//     Config.IdleTimeout) for its next request; a tunnel with no byte either
//     way for Config.IdleTimeout (default 5 min) is closed;
//   - bodies are streamed, never buffered; the credential scrubber holds
//     back at most the length of the longest encoded form of the secret.
//
// A request or response in progress is not bounded in time: a sandbox that
// sends its body slowly, or stops reading a response, holds one of its
// MaxConns connections (and one upstream connection).
//
// Names are resolved only once the policy allows them, so no DNS query
// leaves the host for a name not on the allow-list.
//
// A credential is added only to requests sent to its host: the upstream
// request's Host header, TLS server name and dialed address are the
// host's, and a request inside an intercepted connection whose Host header
// (or absolute URL) names another host is refused (403), so it cannot be
// fronted onto another tenant of the same CDN. (Through the plain proxy, an
// absolute URL's host is the one used; a Host header behind it is ignored,
// as HTTP requires.) Plain http:// requests to a credential host are
// refused unless Credential.AllowHTTP is set. The scrubber removes the
// secret from response headers, bodies and trailers, as is and in its
// base64 (standard and URL alphabets, at any offset inside a larger
// blob), hex, URL-escaped and JSON/JS-escaped forms, in any ASCII case,
// across write boundaries; encoded forms shorter than 8 bytes are not
// looked for. It cannot catch a secret the upstream transforms otherwise
// (encrypts, hashes, reverses, compresses with an encoding it did not ask
// for — such a response is replaced by a 502 —, wraps across lines, or
// encodes twice).
package egress

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one allow-list entry.
type Rule struct {
	Host     string       // lower-case name, or suffix for a wildcard ("example.com" for "*.example.com")
	Wildcard bool         // matches any name under Host, not Host itself
	Port     int          // 0: the default ports 80 and 443
	Prefix   netip.Prefix // set for CIDR rules (any port)
}

// String returns the rule in the form it was written.
func (r Rule) String() string {
	if r.Prefix.IsValid() {
		return r.Prefix.String()
	}
	h := r.Host
	if r.Wildcard {
		h = "*." + h
	}
	if r.Port != 0 {
		h += ":" + strconv.Itoa(r.Port)
	}
	return h
}

// ParseRules parses allow-list patterns: "host", "*.suffix", either with an
// optional ":port" (1-65535), and CIDRs ("10.1.2.0/24", "fd00::/8"). A bare
// IP address is taken as a single-address CIDR.
func ParseRules(patterns []string) ([]Rule, error) {
	rules := make([]Rule, 0, len(patterns))
	for _, p := range patterns {
		r, err := parseRule(p)
		if err != nil {
			return nil, fmt.Errorf("allow pattern %q: %w", p, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

func parseRule(p string) (Rule, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		return Rule{}, fmt.Errorf("empty")
	}
	if strings.Contains(p, "/") {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return Rule{}, fmt.Errorf("bad CIDR: %v", err)
		}
		return Rule{Prefix: pfx.Masked()}, nil
	}
	if a, err := netip.ParseAddr(strings.Trim(p, "[]")); err == nil {
		return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	}
	host, port := p, 0
	if h, ps, err := net.SplitHostPort(p); err == nil {
		n, err := strconv.Atoi(ps)
		if err != nil || n < 1 || n > 65535 {
			return Rule{}, fmt.Errorf("port %q out of range 1-65535", ps)
		}
		if _, err := netip.ParseAddr(h); err == nil {
			return Rule{}, fmt.Errorf("an address rule covers every port: write %s without the port", h)
		}
		host, port = h, n
	} else if strings.Contains(p, ":") {
		return Rule{}, fmt.Errorf("bad host:port")
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	r := Rule{Port: port}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard, host = true, rest
	}
	if err := checkName(host); err != nil {
		return Rule{}, err
	}
	r.Host = host
	return r, nil
}

// checkName accepts DNS names made of letters, digits, '-' and '_'.
func checkName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("bad host name")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("bad host name %q", h)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("bad character %q in host name %q", c, h)
			}
		}
	}
	return nil
}

// Policy decides what a sandbox may reach.
type Policy struct {
	Rules []Rule
}

// AllowName reports whether host:port matches a name rule.
func (p Policy) AllowName(host string, port int) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range p.Rules {
		if r.Prefix.IsValid() {
			continue
		}
		var match bool
		if r.Wildcard {
			match = strings.HasSuffix(host, "."+r.Host)
		} else {
			match = host == r.Host
		}
		if match && (r.Port != 0 && r.Port == port || r.Port == 0 && (port == 80 || port == 443)) {
			return true
		}
	}
	return false
}

// AllowHost reports whether requests to host may be made on some port: a
// name rule matches it, or it is an IP literal in a CIDR rule.
func (p Policy) AllowHost(host string) bool {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return p.InCIDR(a)
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range p.Rules {
		if !r.Prefix.IsValid() && (host == r.Host && !r.Wildcard || r.Wildcard && strings.HasSuffix(host, "."+r.Host)) {
			return true
		}
	}
	return false
}

// AllowAddr reports whether a connection to addr may be made: addresses in
// a CIDR rule always may; otherwise only public unicast addresses may.
func (p Policy) AllowAddr(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, r := range p.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(addr) {
			return true
		}
	}
	return isPublic(addr)
}

// InCIDR reports whether addr is named by a CIDR rule (so an IP literal
// may be used as the host).
func (p Policy) InCIDR(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, r := range p.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(addr) {
			return true
		}
	}
	return false
}

var special = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
		"198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32",
		"fc00::/7", "fe80::/10", "ff00::/8",
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// isPublic reports whether a is a globally routable unicast address.
func isPublic(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range special {
		if p.Contains(a) {
			return false
		}
	}
	return true
}
