package kubernetes_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// A memory-backed emptyDir's sizeLimit bounds bytes, not inodes (the
// kubelet mounts the tmpfs with size= only, and nothing in a pod spec sets
// nr_inodes): what bounds empty files in /tmp is that their inodes and
// dentries are charged to the container's memory cgroup, so the worst case
// is the pod's own memory limit, not the node's memory.
func TestTmpfsInodesCountAsMemory(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20}))
	ctx := ctxFor(t)
	const n = 40000
	r, err := sb.Exec(ctx, `u=/sys/fs/cgroup/memory/memory.usage_in_bytes
[ -r $u ] || u=/sys/fs/cgroup/memory.current
cat $u; mkdir /tmp/d; i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do : > /tmp/d/$i; i=$((i+1)); done; cat $u; df -k /tmp | tail -1`)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("%+v, %v", r, err)
	}
	f := strings.Fields(r.Stdout)
	if len(f) < 2 {
		t.Fatalf("output %q", r.Stdout)
	}
	before, err1 := strconv.ParseInt(f[0], 10, 64)
	after, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("output %q", r.Stdout)
	}
	// An inode and a dentry of tmpfs are about 1 KiB of slab: ask for a
	// quarter of it.
	if grew := after - before; grew < n*256 {
		t.Errorf("%d empty files in /tmp grew the container's memory by %d bytes, want at least %d: are they charged to the pod?", n, grew, n*256)
	} else {
		t.Logf("%d empty files: memory %d -> %d (+%d bytes, %d a file); df: %s", n, before, after, grew, grew/n, strings.Join(f[2:], " "))
	}
}
