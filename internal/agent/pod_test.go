//go:build linux

package main

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// mountinfo lines as a kubelet's container has them: escaped paths, the
// optional fields, read-only mounts by either option set.
func TestParseMountinfo(t *testing.T) {
	in := `1470 1385 0:310 / / ro,relatime master:511 - overlay overlay rw,lowerdir=/l,upperdir=/u
1471 1470 0:312 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
1479 1471 8:1 /var/lib/kubelet/pods/x/containers/sandbox/y /dev/termination-log rw,relatime - ext4 /dev/sda1 rw
1480 1470 0:300 / /work\040dir rw,relatime shared:1 master:2 - tmpfs tmpfs rw,size=8192k
1481 1470 8:1 /etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 ro,errors=remount-ro
bad line
`
	got := parseMountinfo(in)
	want := []mount{
		{point: "/", fstype: "overlay", ro: true},
		{point: "/dev", fstype: "tmpfs"},
		{point: "/dev/termination-log", fstype: "ext4"},
		{point: "/work dir", fstype: "tmpfs"},
		{point: "/etc/hosts", fstype: "ext4", ro: true},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseMountinfo:\n got %+v\nwant %+v", got, want)
	}
	for in, want := range map[string]string{`a\134b`: `a\b`, `a\04`: `a\04`, `\101\`: `A\`, `x`: `x`} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", in, got, want)
		}
	}
}

// A tethered agent in a pod serves the first connection that proves
// itself the library's relay; one that does not (a plain byte, as any
// program's) is closed.
func TestPodAcceptsOnlyTheRelay(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the proof claims another user")
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := listenAt(sock)
	if err != nil {
		t.Fatal(err)
	}
	mapped, _ := mappedIDs()
	id := relayUID(mapped)
	other, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.Write([]byte{0})
	relay, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	if err := proveRelay(relay, id); err != nil {
		t.Fatal(err)
	}
	c, pid, err := accept(l, id)
	if err != nil || pid != os.Getpid() {
		t.Fatalf("accept: pid %d, %v; want this process's", pid, err)
	}
	defer c.Close()
	other.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := other.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the connection without the proof: %v; want it closed", err)
	}
	c.Write([]byte("hi"))
	b := make([]byte, 2)
	if _, err := io.ReadFull(relay, b); err != nil || string(b) != "hi" {
		t.Errorf("the relay's connection: %q, %v", b, err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket after the relay's connection: %v; want it removed", err)
	}
}
