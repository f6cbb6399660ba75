package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TCPSocket is one line of /proc/net/tcp or /proc/net/tcp6: a TCP socket
// of this network namespace (every process's, orphans included).
type TCPSocket struct {
	LocalPort, RemotePort int
	State                 int   // as the kernel numbers it: 1 established, 4 FIN_WAIT1, 10 listen...
	TxQueue, RxQueue      int64 // bytes in the send queue (unacknowledged or unsent) and the receive queue
}

// TCPSockets lists the TCP sockets of this network namespace.
func TCPSockets() ([]TCPSocket, error) {
	var out []TCPSocket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		sc := bufio.NewScanner(file)
		sc.Scan() // the header
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 5 {
				continue
			}
			port := func(addr string) int {
				_, p, _ := strings.Cut(addr, ":")
				n, _ := strconv.ParseInt(p, 16, 32)
				return int(n)
			}
			st, _ := strconv.ParseInt(fs[3], 16, 32)
			tx, rx, _ := strings.Cut(fs[4], ":")
			txn, _ := strconv.ParseInt(tx, 16, 64)
			rxn, _ := strconv.ParseInt(rx, 16, 64)
			out = append(out, TCPSocket{LocalPort: port(fs[1]), RemotePort: port(fs[2]), State: int(st), TxQueue: txn, RxQueue: rxn})
		}
		err = sc.Err()
		file.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// SocketsTo returns the sockets connected to remotePort from another port:
// the clients' ends of connections to a server on remotePort.
func SocketsTo(remotePort int) ([]TCPSocket, error) {
	all, err := TCPSockets()
	if err != nil {
		return nil, err
	}
	var out []TCPSocket
	for _, s := range all {
		if s.RemotePort == remotePort && s.LocalPort != remotePort {
			out = append(out, s)
		}
	}
	return out, nil
}

// TCPMemPages returns the pages the kernel holds for TCP socket buffers,
// the "mem" of /proc/net/sockstat's TCP line (for the whole host, not one
// namespace).
func TCPMemPages() (int64, error) {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) == 0 || fs[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(fs); i++ {
			if fs[i] == "mem" {
				return strconv.ParseInt(fs[i+1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no TCP mem in /proc/net/sockstat")
}

// HoldingListener listens on the loopback interface, accepts every
// connection and never reads from one (an upstream that stopped reading).
// It returns its address and a count of the connections it accepted, and
// closes them all when the test ends.
func HoldingListener(t testing.TB) (addr *net.TCPAddr, accepted func() int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return l.Addr().(*net.TCPAddr), func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
}
