//go:build linux

package main

// The agent's modes for engines whose main-process stream is logged or
// cannot carry the library's frames (Kubernetes: a container's stdout is
// always written to the pod log). There the pod runs:
//
//   - an init container: `agent -install=PATH [-isolate]` copies this
//     program into a volume the sandbox's container shares, and with
//     -isolate takes the pod's network interfaces down (the init
//     container alone holds CAP_NET_ADMIN for it);
//   - the sandbox's container: `agent -listen=PATH -writable=DIRS ...`
//     serves the library on the first connection to a unix socket at PATH
//     (from a relay that proves itself: relayProof),
//     its stdin (the engine's attach stream) only holding the sandbox
//     alive; with -writable it first locks every writable mount but the
//     working directory and DIRS (lockMounts): the engine's own, such as
//     the kubelet's termination log and /etc/hosts, or /dev. With -lease
//     (any engine) it serves every connection as a session instead, and
//     its stdin holds nothing (session.go);
//   - an exec'd relay: `agent -connect=PATH` proves itself to the agent
//     (proveRelay), then copies its stdin and stdout to and from that
//     socket; the exec stream is not logged.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// install copies the running program to dst (mode 0500, its directory
// 0700: the agent's, out of a sandbox user's reach) and, with isolate,
// takes every network interface but loopback down.
func install(dst string, isolate bool) error {
	if isolate {
		if err := isolateNetwork(); err != nil {
			return err
		}
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	dir := filepath.Dir(dst)
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o500)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// isolateNetwork sets every interface but loopback down, which removes
// their routes: nothing leaves the network namespace. A process without
// CAP_NET_ADMIN in the namespace cannot set one up again. (Not removed:
// tearing a pod's veth down under its CNI plugin costs the kernel more,
// and a down interface carries nothing.)
func isolateNetwork() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("isolate: %w", err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		if err := setDown(ifc.Name); err != nil {
			return fmt.Errorf("isolate %q: setting it down: %w (does the init container have CAP_NET_ADMIN?)", ifc.Name, err)
		}
	}
	return nil
}

// setDown clears an interface's IFF_UP flag.
func setDown(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	req, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, req); err != nil {
		return err
	}
	req.SetUint16(req.Uint16() &^ unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, req)
}

// relayID is the user and group the exec'd relay runs as once connected
// (where the user namespace maps it: see relayUID): no command's (not even
// a root one's, which has no CAP_KILL) can signal it.
const relayID = 1<<31 - 3

// socketWait bounds how long a relay tries to connect to the agent's
// socket, which the agent makes as it starts; socketPoll is the pause
// between tries.
const (
	socketWait = 10 * time.Second
	socketPoll = 20 * time.Millisecond
)

// relayUID returns the user and group ID of the library's relays in a user
// namespace that maps IDs 0 to mapped-1: relayID, or, in a namespace too
// small for it (a rootless engine's), the top ID it maps, which no tag
// (tagsFor) and no drawn user (intoMapped) is. No command runs as it
// (start refuses it).
func relayUID(mapped uint64) uint32 {
	if mapped > relayID {
		return relayID
	}
	return uint32(mapped - 1)
}

// connect relays stdin to the socket at path and the socket to stdout,
// until either ends. It runs, exec'd by the engine, beside sandbox code:
// it makes itself non-dumpable, connects (as root: the socket is root's),
// proves to the agent that it is the library's relay (proveRelay), then
// becomes relayUID, which leaves it no capability.
func connect(path string) error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return err
	}
	mapped, err := mappedIDs()
	if err != nil {
		return err
	}
	id := relayUID(mapped)
	var c *net.UnixConn
	// The agent makes its socket as it starts: a relay started at once
	// may be a moment early.
	for deadline := time.Now().Add(socketWait); ; time.Sleep(socketPoll) {
		c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		return err
	}
	if err := proveRelay(c, id); err != nil {
		return fmt.Errorf("proving itself to the agent: %w (does the container have CAP_SETUID and CAP_SETGID?)", err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setresgid(int(id), int(id), int(id)); err != nil {
		return err
	}
	if err := syscall.Setresuid(int(id), int(id), int(id)); err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&none[0])), 0); errno != 0 {
		return fmt.Errorf("dropping capabilities: %w", errno)
	}
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) // a change of IDs resets it
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(c, pollable(0, "stdin"))
		c.CloseWrite() // the library closed the stream: the agent exits
		done <- struct{}{}
	}()
	go func() {
		io.Copy(pollable(1, "stdout"), c)
		done <- struct{}{}
	}()
	<-done
	return nil
}

// The agent must tell the library's relay from any other process that
// connects to its socket: a command running as root may (the socket is
// root's), and SO_PEERCRED cannot tell them apart everywhere (gVisor
// reports the listener's own credentials). What a command can never do is
// use a capability: so the relay's first byte carries SCM_CREDENTIALS
// naming relayUID as its user and group, which the kernel (gVisor too)
// lets a process send only with CAP_SETUID and CAP_SETGID, or running as
// that user, which no command does.

// proveRelay sends the relay's proof on c: one byte with credentials of
// user and group id.
func proveRelay(c *net.UnixConn, id uint32) error {
	cred := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: id, Gid: id})
	_, _, err := c.WriteMsgUnix([]byte{0}, cred, nil)
	return err
}

// proofTimeout bounds the wait for a connection's proof.
const proofTimeout = 10 * time.Second

// errNotRelay is a connection whose first byte was not a relay's proof.
var errNotRelay = errors.New("not the library's relay")

// relayProof reads the proof of a relay of user and group id from c (see
// proveRelay) and returns the relay's process ID as the kernel gives it: 0
// where it does not (gVisor).
func relayProof(c *net.UnixConn, id uint32) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var serr error
	raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) })
	if serr != nil {
		return 0, serr
	}
	c.SetReadDeadline(time.Now().Add(proofTimeout))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
	if err != nil {
		return 0, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if n != 1 || err != nil || len(msgs) != 1 {
		return 0, errNotRelay
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil || cred.Uid != id || cred.Gid != id {
		return 0, errNotRelay
	}
	return int(max(cred.Pid, 0)), nil
}

// listenAt makes the unix socket at path the library's relay connects to
// (mode 0600: only root may connect). The agent makes it before it locks
// the mounts (lockMounts), as the socket's directory may be one of them.
func listenAt(path string) (*net.UnixListener, error) {
	os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// accept waits for the library's relay (relay user and group id, see
// relayProof) on l and returns its connection and the relay's process ID
// (a snapshot's freeze must never stop the relay, which carries the
// archive: see freezer); no other is ever accepted (l is closed, and its
// socket removed where its directory still lets the agent). Only root may
// connect, and commands do not run until the library, on this
// connection, starts them. (A leased agent keeps l open: see
// serveSessions.)
func accept(l *net.UnixListener, id uint32) (*net.UnixConn, int, error) {
	defer l.Close()
	l.SetUnlinkOnClose(true)
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, 0, err
		}
		if pid, err := relayProof(c, id); err == nil {
			return c, pid, nil
		}
		c.Close()
	}
}

// tether holds the sandbox alive while r (the engine's attach stream)
// stays open: its bytes are keepalives, its end ends the agent.
func tether(r io.Reader) {
	io.Copy(io.Discard, r)
	os.Exit(0)
}

// onlyEnv removes every environment variable but names: the kubelet adds
// the API server's service variables (KUBERNETES_SERVICE_HOST, ...) to
// every container, even with enableServiceLinks off.
func onlyEnv(names []string) {
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !keep[k] {
			os.Unsetenv(k)
		}
	}
}

// setRlimits puts the limits a backend without per-container resource
// limits asks for on the agent, whose commands inherit them. NPROC counts
// the processes of a user ID on the whole kernel; the sandbox user is
// drawn per sandbox, and the agent, as root, is not held to it.
func setRlimits(fsize, nofile, nproc int64) error {
	for _, l := range []struct {
		which int
		n     int64
		name  string
	}{{unix.RLIMIT_FSIZE, fsize, "fsize"}, {unix.RLIMIT_NOFILE, nofile, "nofile"}, {unix.RLIMIT_NPROC, nproc, "nproc"}} {
		if l.n <= 0 {
			continue
		}
		rl := unix.Rlimit{Cur: uint64(l.n), Max: uint64(l.n)}
		if err := unix.Setrlimit(l.which, &rl); err != nil {
			return fmt.Errorf("setrlimit %s %d: %w", l.name, l.n, err)
		}
	}
	return nil
}

// lockID is the user and group lockMounts gives what it locks to: none a
// command runs as (the library draws sandbox users from 1e9 to 1.9e9 and
// tags from 1.9e9 up; the relay is relayID).
const lockID = 1<<31 - 4

// lockMounts takes every writable mount of the container's but the
// working directory's and keep's away from every user a command may run as,
// root included: an engine mounts places of its own that root owns and
// can write, such as the kubelet's termination log (a file on the node's
// disk), /etc/hosts (the same) and /dev (a tmpfs). Each mount's root, a
// directory or a file, loses its write bits and is given to lockID: a
// command, even root (which has no CAP_DAC_OVERRIDE nor CAP_FOWNER), can
// then neither write it nor change its mode back. It needs CAP_CHOWN,
// which harden drops next. Read-only mounts, the kernel's file systems
// (kernelFS) and devices (such as the /dev/null the runtime masks /proc
// files with) are left as they are; a tmpfs such as runc's /sys/fs/cgroup
// is not.
func lockMounts(keep []string) error {
	type key struct{ dev, ino uint64 }
	kept := map[key]bool{}
	var st unix.Stat_t
	if err := unix.Stat(".", &st); err != nil {
		return fmt.Errorf("lock: working directory: %w", err)
	}
	kept[key{st.Dev, st.Ino}] = true
	for _, k := range keep {
		if k != "" && unix.Stat(k, &st) == nil {
			kept[key{st.Dev, st.Ino}] = true
		}
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	for _, m := range parseMountinfo(string(b)) {
		if m.ro || kernelFS[m.fstype] {
			continue
		}
		if err := unix.Stat(m.point, &st); err != nil || kept[key{st.Dev, st.Ino}] {
			continue // hidden by another mount, or kept
		}
		if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR && t != unix.S_IFREG {
			continue // a device (/dev/null over a masked /proc file): stores nothing
		}
		if st.Uid != 0 {
			if st.Uid != lockID && st.Mode&0o022 != 0 {
				return fmt.Errorf("lock: %s (a %s mount) is writable by others and not root's: it cannot be locked", m.point, m.fstype)
			}
			continue
		}
		err := unix.Chmod(m.point, st.Mode&0o7777&^0o222)
		if err == nil {
			err = unix.Chown(m.point, lockID, lockID)
		}
		if err == unix.EROFS {
			continue
		}
		if err != nil {
			return fmt.Errorf("lock: %s (a %s mount): %w (does the container have CAP_CHOWN?)", m.point, m.fstype, err)
		}
	}
	return nil
}

// mount is a line of /proc/self/mountinfo.
type mount struct {
	point, fstype string
	ro            bool // the mount or its file system is read-only
}

// parseMountinfo parses /proc/self/mountinfo (see proc(5)): "ID PARENT
// MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS".
func parseMountinfo(s string) []mount {
	var ms []mount
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 6 || sep < 6 || len(f) < sep+4 {
			continue
		}
		ms = append(ms, mount{
			point:  unescapeOctal(f[4]),
			fstype: f[sep+1],
			ro:     slices.Contains(strings.Split(f[5], ","), "ro") || slices.Contains(strings.Split(f[sep+3], ","), "ro"),
		})
	}
	return ms
}

// unescapeOctal undoes the kernel's escaping of a path in mountinfo (a
// space is \040, a backslash \134).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kernelFS are the file systems lockMounts leaves alone: they store no
// data, and the kernel guards them (what of /proc and /sys a container may
// write, the runtime mounts read-only).
var kernelFS = map[string]bool{"proc": true, "sysfs": true, "cgroup": true, "cgroup2": true, "devpts": true}
