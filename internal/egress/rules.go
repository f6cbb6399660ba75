// Package egress is the host-side proxy through which an allow-listed
// sandbox reaches the network. It speaks plain HTTP proxying and CONNECT,
// resolves names itself and checks every resolved address, refuses
// loopback, private, link-local (cloud metadata), other special ranges and
// the host's own addresses unless a CIDR rule names that range (or
// address) itself — "0.0.0.0/0" is not enough (see Policy.AllowAddr) —, bounds concurrent connections, and — for
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
//     back at most the length of the longest encoded form of the secret;
//   - kernel memory: each upstream connection asks for UpstreamBuffer
//     send and receive buffers instead of the kernel's autotuned ones
//     (several MiB each), and is reset — its buffers freed — when its
//     tunnel fails or the proxy closes.
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
// secret from response header values (of 1xx responses too), bodies and
// trailers, and drops a header or trailer whose name holds it, as is and in its
// base64 (standard and URL alphabets, at any offset inside a larger
// blob), hex, URL-escaped and JSON/JS-escaped forms, in any ASCII case,
// across write boundaries; encoded forms shorter than 8 bytes are not
// looked for. It cannot catch a secret the upstream transforms otherwise
// (encrypts, hashes, reverses, compresses with an encoding it did not ask
// for — such a response is replaced by a 502 —, wraps across lines, or
// encodes twice), nor one it returns piecewise (Range requests, offsets):
// a credential given to an upstream that echoes requests is readable.
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
		if a := pfx.Addr(); a.Is4In6() && pfx.Bits() >= 96 { // ::ffff:10.0.0.0/104 is 10.0.0.0/8
			pfx = netip.PrefixFrom(a.Unmap(), pfx.Bits()-96)
		}
		return Rule{Prefix: pfx.Masked()}, nil
	}
	if a, err := netip.ParseAddr(strings.Trim(p, "[]")); err == nil {
		a = a.Unmap()
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

// AllowAddr reports whether a connection to addr may be made, and if not,
// why. own says addr is one of this host's addresses.
//
// A public unicast address that is not the host's own may always be
// dialed (a name rule or an IP literal in a CIDR rule got the request this
// far). Any other address is reached only through a CIDR rule that
// contains it and names its range itself:
//   - an address in a special-purpose range (loopback, private, link-local,
//     CGNAT, multicast, documentation, ... — see specialRanges; also the
//     6to4 form of one): a rule whose prefix lies inside that range, such
//     as "127.0.0.1/32", "10.1.2.0/24" or "fd00::/8". A rule covering more,
//     such as "0.0.0.0/0", "::/0", "0.0.0.0/1" or "8.0.0.0/5", does not;
//   - one of the host's own addresses other than loopback (whether private
//     or public): a rule naming exactly that address ("172.17.0.1/32").
//
// IPv4-mapped IPv6 addresses are taken as their IPv4 address.
func (p Policy) AllowAddr(addr netip.Addr, own bool) (ok bool, why string) {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return false, "invalid address"
	}
	need, name, special := specialRange(addr)
	if own && !addr.IsLoopback() {
		need, name, special = netip.PrefixFrom(addr, addr.BitLen()), "an address of this host", true
	}
	if !special {
		return true, ""
	}
	for _, r := range p.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(addr) && r.Prefix.Bits() >= need.Bits() && need.Contains(r.Prefix.Addr()) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("%v is %s (%v): only an allow rule inside that range, such as %v, reaches it; a wider one (0.0.0.0/0, ::/0) does not",
		addr, name, need, netip.PrefixFrom(addr, addr.BitLen()))
}

// InCIDR reports whether addr is in a CIDR rule (so an IP literal may be
// used as the host; AllowAddr still decides whether it may be dialed).
func (p Policy) InCIDR(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, r := range p.Rules {
		if r.Prefix.IsValid() && r.Prefix.Contains(addr) {
			return true
		}
	}
	return false
}

// specialRanges are the address ranges that are not public unicast
// (IANA's special-purpose registries, plus multicast and the deprecated
// site-local range), with what they are.
var specialRanges = func() []specialRangeT {
	var rs []specialRangeT
	for _, e := range [][2]string{
		{"0.0.0.0/8", "\"this network\" (0.0.0.0 reaches this host's loopback)"},
		{"10.0.0.0/8", "private"},
		{"100.64.0.0/10", "shared address space (CGNAT)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local (cloud metadata)"},
		{"172.16.0.0/12", "private"},
		{"192.0.0.0/24", "IETF protocol assignments"},
		{"192.0.2.0/24", "documentation"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private"},
		{"198.18.0.0/15", "benchmarking"},
		{"198.51.100.0/24", "documentation"},
		{"203.0.113.0/24", "documentation"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified (reaches this host's loopback)"},
		{"::1/128", "loopback"},
		{"::/96", "IPv4-compatible (deprecated)"},
		{"64:ff9b::/96", "NAT64"},
		{"64:ff9b:1::/48", "local-use NAT64"},
		{"100::/64", "discard-only"},
		{"2001::/23", "IETF protocol assignments (Teredo included)"},
		{"2001:db8::/32", "documentation"},
		{"3fff::/20", "documentation"},
		{"5f00::/16", "segment routing (SRv6) SIDs"},
		{"fc00::/7", "unique local (private)"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local (deprecated)"},
		{"ff00::/8", "multicast"},
	} {
		rs = append(rs, specialRangeT{netip.MustParsePrefix(e[0]), e[1]})
	}
	return rs
}()

type specialRangeT struct {
	pfx  netip.Prefix
	name string
}

// sixToFour is the 6to4 range: 2002:V4ADDR::/48 carries IPv4 address V4ADDR.
var sixToFour = netip.MustParsePrefix("2002::/16")

// specialRange returns the narrowest special-purpose range holding a, and
// what it is. A 6to4 address is special when the IPv4 address it carries
// is: its range is the 6to4 form of that IPv4 range.
func specialRange(a netip.Addr) (netip.Prefix, string, bool) {
	var best specialRangeT
	for _, r := range specialRanges {
		if r.pfx.Contains(a) && (!best.pfx.IsValid() || r.pfx.Bits() > best.pfx.Bits()) {
			best = r
		}
	}
	if best.pfx.IsValid() {
		return best.pfx, best.name, true
	}
	if sixToFour.Contains(a) {
		b := a.As16()
		v4 := netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		if r, name, ok := specialRange(v4); ok {
			r4 := r.Addr().As4()
			var p [16]byte
			p[0], p[1] = 0x20, 0x02
			copy(p[2:6], r4[:])
			return netip.PrefixFrom(netip.AddrFrom16(p), 16+r.Bits()), "6to4 of " + name, true
		}
	}
	return netip.Prefix{}, "", false
}
