//go:build linux

package main

import (
	"net"
	"os"
	"strconv"
	"testing"
)

// clientSocket finds the client's side of a loopback connection, IPv4 and
// IPv6 (an IPv4-mapped peer too), by its port and its peer's: the inode
// the client's descriptor links to.
func TestOriginClientSocket(t *testing.T) {
	for _, tc := range []struct{ listen, dial string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"[::]:0", "::ffff:127.0.0.1"}, // a dual-stack listener; the client's socket in tcp6
	} {
		l, err := net.Listen("tcp", tc.listen)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		c, err := net.Dial("tcp", net.JoinHostPort(tc.dial, strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		f, err := c.(*net.TCPConn).File()
		if err != nil {
			t.Fatal(err)
		}
		link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := parseSocketLink(link)
		if want == 0 {
			t.Fatalf("%s is not a socket's link", link)
		}
		local := c.LocalAddr().(*net.TCPAddr).Port
		if got := clientSocket(local, port); got != want {
			t.Errorf("%s: clientSocket(%d, %d) = %d, want %d (%s)", tc.dial, local, port, got, want, link)
		}
		// The server's side has the ports the other way round.
		if got := clientSocket(port, local); got == want {
			t.Errorf("%s: the server's side was taken for the client's", tc.dial)
		}
	}
}

func TestOriginParse(t *testing.T) {
	for in, want := range map[string]uint64{
		"socket:[12345]": 12345, "socket:[]": 0, "pipe:[12]": 0, "/dev/null": 0, "socket:[1": 0, "socket:[-1]": 0,
	} {
		if got := parseSocketLink(in); got != want {
			t.Errorf("parseSocketLink(%q) = %d, want %d", in, got, want)
		}
	}
	line := "   3: 0100007F:A1B2 0100007F:4E20 01 00000000:00000000 00:00000000 00000000  1000        0 778899 1 0000000000000000 20 4 30 10 -1"
	if inode, ok := tcpLine(line, 0xA1B2, 0x4E20); !ok || inode != 778899 {
		t.Errorf("tcpLine = %d, %v", inode, ok)
	}
	for _, bad := range []string{
		line[:40], // cut short
		"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
		"   3: 0100007F:A1B2 0100007F:4E20 06 00000000:00000000 03:00000000 00000000     0        0 0 3", // TIME_WAIT: no inode
		"   3: 0100007F:ZZZZ 0100007F:4E20 01 00000000:00000000 00:00000000 00000000  1000        0 778899 1",
	} {
		if _, ok := tcpLine(bad, 0xA1B2, 0x4E20); ok {
			t.Errorf("tcpLine(%q) matched", bad)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1": true, "127.0.0.2": true, "::1": true, "::ffff:127.0.0.1": true, "10.0.0.1": false, "": false, "bogus": false} {
		if isLoopback(addr) != want {
			t.Errorf("isLoopback(%q) = %v", addr, !want)
		}
	}
}
