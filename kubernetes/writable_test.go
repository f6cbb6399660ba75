package kubernetes_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// writeProbe writes, as the command's user, to every mount point of the
// container's and to the places the kubelet and the
// runtime mount, and prints each it could write, one a line: a file
// appended to, a directory a file made in; where it could not, it tries to
// make it writable first (chmod, as its owner would) and writes again.
const writeProbe = `
try() {
	if [ -d "$1" ]; then
		( : > "$1/.probe" ) 2>/dev/null && rm -f "$1/.probe"
	else
		( : >> "$1" ) 2>/dev/null
	fi
}
{
	while read -r _ _ _ _ mp _; do
		printf '%b\n' "$(echo "$mp" | sed 's/\\\([0-7][0-7][0-7]\)/\\0\1/g')"
	done < /proc/self/mountinfo
	echo /dev/termination-log; echo /etc/hosts; echo /etc/hostname; echo /etc/resolv.conf
	echo /.agentsandbox; echo /.agentsandbox/agent; echo /dev; echo /etc; echo /
} | sort -u | while read -r p; do
	[ -e "$p" ] || continue
	[ -d "$p" ] || [ -f "$p" ] || continue
	if try "$p"; then echo "$p"; continue; fi
	if [ -d "$p" ]; then chmod 0777 "$p"; else chmod 0666 "$p"; fi 2>/dev/null && try "$p" && echo "$p (after chmod)"
done
`

// The only places a sandbox writes, as its own user and as root, are the
// documented ones: the working directory, /tmp, /dev/shm and POSIX
// message queues (/dev/mqueue). Not the termination log the kubelet keeps
// on the node's disk (24 MiB went there), the agent's emptyDir, /etc/hosts
// (the node's disk too) or /dev (a tmpfs of 64 MiB of memory); not by
// changing their mode either.
func TestWritablePlaces(t *testing.T) {
	t.Parallel()
	for _, user := range []string{"", "0"} {
		name := "default user"
		var opts []sandbox.Option
		if user != "" {
			name = "root"
			opts = append(opts, sandbox.WithUser(user))
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sb := newSandbox(t, opts...)
			ctx := ctxFor(t)
			r, err := sb.Exec(ctx, "head -c 25165824 /dev/zero > /dev/termination-log; stat -c %s /dev/termination-log")
			if err != nil {
				t.Fatal(err)
			}
			if r.Stdout != "0\n" {
				t.Errorf("24 MiB to /dev/termination-log: %q %q, want it refused and the file empty", r.Stdout, r.Stderr)
			}
			r, err = sb.Exec(ctx, writeProbe)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Split(strings.TrimSpace(r.Stdout), "\n")
			want := []string{"/dev/mqueue", "/dev/shm", "/tmp", "/workspace"}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("writable places %q, want %q (stderr %q)", got, want, r.Stderr)
			}
			// Still usable: the working directory, /tmp and /dev/shm.
			r, err = sb.Exec(ctx, "echo a > f && echo b > /tmp/f && echo c > /dev/shm/f && cat f /tmp/f /dev/shm/f")
			if err != nil || r.Stdout != "a\nb\nc\n" {
				t.Errorf("writing the working directory, /tmp and /dev/shm: %+v, %v", r, err)
			}
		})
	}
}
