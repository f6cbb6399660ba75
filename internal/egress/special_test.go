package egress_test

import (
	"net/netip"
	"strings"
	"testing"
)

// Special-purpose addresses are reached only through a CIDR rule that
// names their range (or a part of it) itself; a rule for "the Internet"
// (0.0.0.0/0, ::/0, or halves and slices of it) reaches public addresses
// only. The host's own addresses other than loopback need a rule naming
// exactly that address.
func TestUnitSpecialRanges(t *testing.T) {
	for _, tc := range []struct {
		rules []string
		addr  string
		own   bool
		want  bool
	}{
		// The Internet, however written, is public unicast only.
		{[]string{"0.0.0.0/0", "::/0"}, "8.8.8.8", false, true},
		{[]string{"0.0.0.0/0", "::/0"}, "2606:4700::1111", false, true},
		{[]string{"0.0.0.0/0", "::/0"}, "127.0.0.1", true, false},
		{[]string{"0.0.0.0/0", "::/0"}, "127.0.0.53", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "::1", true, false},
		{[]string{"0.0.0.0/0", "::/0"}, "::ffff:127.0.0.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "0.0.0.0", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "::", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "10.0.0.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "172.17.0.1", true, false},
		{[]string{"0.0.0.0/0", "::/0"}, "192.168.1.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "169.254.169.254", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "100.64.0.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "224.0.0.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "255.255.255.255", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "198.18.0.1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "203.0.113.5", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "fe80::1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "fd00::1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "ff02::1", false, false},
		{[]string{"0.0.0.0/0", "::/0"}, "64:ff9b::7f00:1", false, false},   // NAT64 of 127.0.0.1
		{[]string{"0.0.0.0/0", "::/0"}, "64:ff9b::808:808", false, false},  // NAT64 even of a public address
		{[]string{"0.0.0.0/0", "::/0"}, "2001::7f00:1", false, false},      // Teredo
		{[]string{"0.0.0.0/0", "::/0"}, "::7f00:1", false, false},          // IPv4-compatible 127.0.0.1
		{[]string{"0.0.0.0/0", "::/0"}, "2002:7f00:1::1", false, false},    // 6to4 of 127.0.0.1
		{[]string{"0.0.0.0/0", "::/0"}, "2002:a9fe:a9fe::1", false, false}, // 6to4 of 169.254.169.254
		{[]string{"0.0.0.0/0", "::/0"}, "2002:808:808::1", false, true},    // 6to4 of 8.8.8.8
		{[]string{"0.0.0.0/0", "::/0"}, "3fff::1", false, false},           // documentation
		{[]string{"0.0.0.0/0", "::/0"}, "203.0.114.1", true, false},        // the host's own public address
		{[]string{"0.0.0.0/1", "128.0.0.0/1"}, "127.0.0.1", false, false},  // halves
		{[]string{"0.0.0.0/1", "128.0.0.0/1"}, "10.1.2.3", false, false},   // halves
		{[]string{"8.0.0.0/5"}, "10.1.2.3", false, false},                  // a slice holding 10/8
		{[]string{"8.0.0.0/5"}, "8.8.8.8", false, true},                    // ...and public addresses
		{[]string{"::/1"}, "::1", false, false},                            // an IPv6 half
		{[]string{"2000::/3"}, "2001:db8::1", false, false},                // global unicast holds documentation
		{[]string{"::ffff:0.0.0.0/96"}, "127.0.0.1", false, false},         // mapped form of 0.0.0.0/0
		// A rule naming the range, or a part of it, reaches it.
		{[]string{"127.0.0.0/8"}, "127.0.0.1", true, true},
		{[]string{"127.0.0.1/32"}, "127.0.0.1", true, true},
		{[]string{"127.0.0.1"}, "::ffff:127.0.0.1", true, true},
		{[]string{"::ffff:127.0.0.1"}, "127.0.0.1", true, true}, // mapped rule: its IPv4 address
		{[]string{"::ffff:127.0.0.0/104"}, "127.0.0.1", true, true},
		{[]string{"127.0.0.1/32"}, "127.0.0.2", false, false},
		{[]string{"::1"}, "::1", true, true},
		{[]string{"10.1.2.0/24"}, "10.1.2.9", false, true},
		{[]string{"10.1.2.0/24"}, "10.1.3.9", false, false},
		{[]string{"10.0.0.0/8"}, "10.200.0.1", false, true},
		{[]string{"169.254.169.254/32"}, "169.254.169.254", false, true},
		{[]string{"fd00::/8"}, "fd00::1", false, true},
		{[]string{"2002:7f00:1::/48"}, "2002:7f00:1::1", false, true},
		{[]string{"2002::/16"}, "2002:7f00:1::1", false, false},
		// The host's own addresses (not loopback): only a rule naming
		// exactly the address, even when its range is named.
		{[]string{"172.16.0.0/12"}, "172.17.0.1", true, false},
		{[]string{"172.16.0.0/12"}, "172.17.0.2", false, true},
		{[]string{"172.17.0.1/32"}, "172.17.0.1", true, true},
		{[]string{"203.0.114.0/24"}, "203.0.114.1", true, false},
		{[]string{"203.0.114.1"}, "203.0.114.1", true, true},
		{[]string{"127.0.0.0/8"}, "127.0.0.2", true, true}, // loopback: its range is enough
		// No CIDR rule: public addresses only (a name rule got this far).
		{nil, "8.8.8.8", false, true},
		{nil, "127.0.0.1", false, false},
	} {
		p := policy(t, tc.rules...)
		got, why := p.AllowAddr(netip.MustParseAddr(tc.addr), tc.own)
		if got != tc.want {
			t.Errorf("rules %v: AllowAddr(%s, own=%v) = %v (%s), want %v", tc.rules, tc.addr, tc.own, got, why, tc.want)
		}
		if !got && (!strings.Contains(why, "only an allow rule inside that range") || !strings.Contains(why, netip.MustParseAddr(tc.addr).Unmap().String())) {
			t.Errorf("rules %v: AllowAddr(%s): reason %q", tc.rules, tc.addr, why)
		}
	}
}
