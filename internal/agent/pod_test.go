//go:build linux

package main

import (
	"slices"
	"testing"
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
