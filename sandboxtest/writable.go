package sandboxtest

import (
	"slices"
	"strings"
	"testing"
)

// WritablePlaces are the only places a sandbox can write, on every
// backend, whether its commands run as the sandbox's own user or as root
// (WithUser("0")): each is bounded by a limit, and nothing written
// anywhere else can outlast a command's process or escape the limits.
//
//   - the working directory (also HOME): Limits.Disk;
//   - /tmp and /dev/shm: tmpfs of Limits.TmpSize each, bytes and inodes
//     (see sandbox.Limits), counted towards Limits.Memory.
//
// Root in the sandbox holds no capabilities, so it writes where root owns
// a directory or file on a writable file system: the working directory
// belongs to the sandbox user, and root may not write there (nor may the
// sandbox user write what root made in /tmp). Everything else — the
// image's root file system, /dev (its device nodes are not places to keep
// data), /etc/hosts, /etc/hostname and /etc/resolv.conf, the agent's own
// files, on Kubernetes /dev/termination-log and the agent's volume — must
// be read-only to both: a file a command could create or write there
// would live on the engine's disk or in memory no limit names. POSIX
// message queues are not files, though their file system (/dev/mqueue,
// where the engine mounts it) lets a new one be made with open: they are
// bounded by RLIMIT_MSGQUEUE, and the subtest allows it but does not
// require it.
//
// The writable subtest of Conformance finds, from inside and for both
// users, every directory outside /proc and /sys in which a new file can
// be created and every existing regular file that can be opened for
// writing (without changing it), and requires each to lie within these
// places; and each of them writable by the sandbox user.
var WritablePlaces = []string{"$WORKDIR", "/tmp", "/dev/shm"}

// writableScript prints "dir PATH" for each directory outside /proc and
// /sys where a new file can be created, and "file PATH" for each existing
// regular file that can be opened for writing (opened to append, nothing
// written: the file is not changed). It starts with "workdir PATH", the
// directory commands start in.
const writableScript = `exec 2>/dev/null
echo "workdir $(pwd -P)"
p=.sandbox-writable-probe-$$
find / \( -path /proc -o -path /sys \) -prune -o -type d -print | while IFS= read -r d; do
	if true > "$d/$p"; then rm -f "$d/$p"; echo "dir $d"; fi
done
find / \( -path /proc -o -path /sys \) -prune -o -type f -print | while IFS= read -r f; do
	if true >> "$f"; then echo "file $f"; fi
done
echo end`

// writable checks WritablePlaces from inside, as the sandbox user and as
// root.
func (c conformance) writable(t *testing.T) {
	sb := c.new(t)
	for _, user := range []string{"", "0"} {
		who := "the sandbox user"
		if user != "" {
			who = "root (WithUser(\"0\"))"
		}
		cmd := sb.Command(ctxFor(t), "sh", "-c", writableScript)
		cmd.User = user
		out, err := cmd.Output()
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if err != nil || len(lines) < 2 || lines[len(lines)-1] != "end" {
			t.Fatalf("as %s, listing the writable places: %v (%q)", who, err, out)
		}
		workdir, ok := strings.CutPrefix(lines[0], "workdir ")
		if !ok || !strings.HasPrefix(workdir, "/") {
			t.Fatalf("as %s: no working directory in %q", who, lines[0])
		}
		places := []string{workdir, "/tmp", "/dev/shm"}
		within := func(p string) bool {
			for _, w := range append(places, "/dev/mqueue") {
				if p == w || strings.HasPrefix(p, w+"/") {
					return true
				}
			}
			return false
		}
		var dirs, outside []string
		for _, l := range lines[1 : len(lines)-1] {
			kind, p, _ := strings.Cut(l, " ")
			if kind == "dir" {
				dirs = append(dirs, p)
			}
			if !within(p) {
				outside = append(outside, l)
			}
		}
		if len(outside) > 0 {
			t.Errorf("as %s, writable outside the documented places (%s):\n%s", who, strings.Join(places, ", "), strings.Join(outside, "\n"))
		}
		for _, w := range places {
			if user == "" || w != workdir {
				if !slices.Contains(dirs, w) {
					t.Errorf("as %s, %s is not writable", who, w)
				}
			}
		}
	}
}
