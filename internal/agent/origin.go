//go:build linux

package main

import (
	"bufio"
	"bytes"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The origin of a relayed connection: the process that made it and the
// command that process belongs to, sent with the relay's Started so that
// the library joins the egress proxy's decisions to the command's
// activity record. When the monitor sees a connect to the relay port, it
// reads which socket the process connects (/proc/PID/fd/FD, as the
// process's user, while the process waits) and notes it; when the
// connection is accepted, the agent finds the client's socket among
// /proc/net/tcp's by its port, and the process among those noted. A
// connection the monitor did not see (no record kept, a process that
// made itself non-dumpable) has no origin: the library then keeps the
// connect as the monitor saw it.

// maxNoted bounds the connects to the relay port kept for matching: the
// oldest is forgotten first.
const maxNoted = 256

// noted is a connect to the relay port the monitor saw.
type noted struct {
	inode  uint64 // the socket's
	pid    int
	groups []byte // the process's supplementary groups: its command's tag is among them
}

// activity receives the monitor's events: files them under their
// commands, and notes connects to the relay port.
func (in *instance) activity(ev actEvent) {
	if ev.inode != 0 && in.egress != nil {
		in.egress.note(noted{inode: ev.inode, pid: ev.pid, groups: ev.groups})
	}
	in.acts.add(ev)
}

// note keeps n until its connection is accepted.
func (e *egress) note(n noted) {
	e.mu.Lock()
	if len(e.noted) >= maxNoted {
		e.noted = slices.Delete(e.noted, 0, 1)
	}
	e.noted = append(e.noted, n)
	e.mu.Unlock()
}

// origin returns the process that made c, a connection accepted on the
// relay port, and the ID of its command; 0 and "" if unknown.
func (in *instance) origin(c *net.TCPConn) (int, string) {
	e := in.egress
	peer, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok || e == nil {
		return 0, ""
	}
	inode := clientSocket(peer.Port, e.l.Addr().(*net.TCPAddr).Port)
	if inode == 0 {
		return 0, ""
	}
	e.mu.Lock()
	i := slices.IndexFunc(e.noted, func(n noted) bool { return n.inode == inode })
	var n noted
	if i >= 0 {
		n = e.noted[i]
		e.noted = slices.Delete(e.noted, i, i+1)
	}
	e.mu.Unlock()
	if i < 0 {
		return 0, ""
	}
	return n.pid, in.commandOf(n.groups)
}

// commandOf returns the ID of the command whose tag is among groups; ""
// if none.
func (in *instance) commandOf(groups []byte) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	for g := range bytes.FieldsSeq(groups) {
		tag, err := strconv.ParseUint(string(g), 10, 32)
		if err != nil {
			continue
		}
		for _, p := range in.cmds {
			if p.tag == uint32(tag) {
				return p.id
			}
		}
	}
	return ""
}

// socketInode returns the inode of socket fd of process pid, read as the
// user id; 0 if it is not a socket or cannot be read.
func (m *monitor) socketInode(pid int, id fsID, fd int32) uint64 {
	if fd < 0 {
		return 0
	}
	var inode uint64
	m.as(id, func() error {
		var buf [64]byte
		n, err := unix.Readlink("/proc/"+strconv.Itoa(pid)+"/fd/"+strconv.Itoa(int(fd)), buf[:])
		if err != nil {
			return err
		}
		inode = parseSocketLink(string(buf[:n]))
		return nil
	})
	return inode
}

// parseSocketLink reads a socket's inode from its /proc/PID/fd link,
// "socket:[N]"; 0 if the link is not a socket's.
func parseSocketLink(s string) uint64 {
	v, ok := strings.CutPrefix(s, "socket:[")
	if v, ok2 := strings.CutSuffix(v, "]"); ok && ok2 {
		n, _ := strconv.ParseUint(v, 10, 64)
		return n
	}
	return 0
}

// maxSockets bounds the lines clientSocket reads of each table: a
// sandbox holding more sockets than that gets no origin for some of its
// connections, not a slower relay.
const maxSockets = 1 << 16

// clientSocket returns the inode of the socket, in the agent's network
// namespace (the sandbox's), whose local port is port and whose peer's
// is peer: the client's side of a connection to peer; 0 if none.
func clientSocket(port, peer int) uint64 {
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for n := 0; n < maxSockets && sc.Scan(); n++ {
			if inode, ok := tcpLine(sc.Text(), port, peer); ok {
				f.Close()
				return inode
			}
		}
		f.Close()
	}
	return 0
}

// tcpLine reads a line of /proc/net/tcp or tcp6: the socket's inode if
// its local port is port and its remote port peer.
func tcpLine(line string, port, peer int) (uint64, bool) {
	f := strings.Fields(line)
	if len(f) < 10 || !hasPort(f[1], port) || !hasPort(f[2], peer) {
		return 0, false
	}
	inode, err := strconv.ParseUint(f[9], 10, 64)
	return inode, err == nil && inode != 0
}

// hasPort reports whether a /proc/net/tcp address (hex address, ':', hex
// port) has port p.
func hasPort(addr string, p int) bool {
	_, hex, ok := strings.Cut(addr, ":")
	n, err := strconv.ParseUint(hex, 16, 16)
	return ok && err == nil && int(n) == p
}

// isLoopback reports whether addr, as the monitor read it from a
// connect, is a loopback address (IPv4-mapped too).
func isLoopback(addr string) bool {
	a, err := netip.ParseAddr(addr)
	return err == nil && a.Unmap().IsLoopback()
}
