package sandbox_test

// Snapshots against the real engine: what is captured (this file, with the
// helpers the snapshot tests share), hostile working directories
// (snapshot_capture_test.go), the freeze of the source's processes
// (snapshot_freeze_test.go), what a restored sandbox is
// (snapshot_restore_test.go), forks (snapshot_fork_test.go), and the life
// of snapshots: Remove, long chains, Prune, the audit log
// (snapshot_lifecycle_test.go).

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// takeSnapshot snapshots sb; the snapshot is removed when the test ends.
func takeSnapshot(t testing.TB, sb *sandbox.Sandbox) *sandbox.Snapshot {
	t.Helper()
	sn, err := sb.Snapshot(testCtx(t))
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	t.Cleanup(func() {
		if err := sn.Remove(context.Background()); err != nil {
			t.Errorf("Remove snapshot: %v", err)
		}
	})
	return sn
}

// restore starts a sandbox from sn, closed when the test ends (before the
// snapshot is removed).
func restore(t testing.TB, sn *sandbox.Snapshot, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	sb, err := sn.New(testCtx(t), opts...)
	if err != nil {
		t.Fatalf("Snapshot.New: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("Close restored sandbox: %v", err)
		}
	})
	return sb
}

// snapRun runs script and checks its exit code.
func snapRun(t testing.TB, sb *sandbox.Sandbox, script string, code int) string {
	t.Helper()
	r := mustExec(t, sb, script)
	if r.ExitCode != code {
		t.Fatalf("Exec(%q) in %.12s: exit %d, want %d\nstdout: %s\nstderr: %s",
			script, sb.ID(), r.ExitCode, code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// manifestScript lists every entry under the working directory with its
// type, mode, owner, size, link count and (but for directories, whose
// mtime changes as they are filled) mtime; the targets of symbolic links;
// and checksums of regular files.
const manifestScript = `cd "$HOME" && me="$(id -u):$(id -g)" &&
find . ! -type d -exec stat -c '%n|%F|%a|%u:%g|%s|%h|%Y' {} \; | sed "s/|$me|/|me|/" | sort &&
find . -type d -exec stat -c '%n|%F|%a|%u:%g' {} \; | sed "s/|$me\$/|me/" | sort &&
find . -type l -exec sh -c 'printf "%s -> %s\n" "$1" "$(readlink "$1")"' _ {} \; | sort &&
find . -type f -exec md5sum {} \; | sort`

func manifest(t testing.TB, sb *sandbox.Sandbox) string {
	t.Helper()
	return snapRun(t, sb, manifestScript, 0)
}

// odd is a file name with a space and a newline in it.
const odd = "odd name\nwith newline"

// treeScript fills the working directory with what a snapshot must keep.
const treeScript = `set -e
mkdir -p a/b/c empty private sticky .hidden
echo deep > a/b/c/deep.txt
printf secret > private/key && chmod 600 private/key && chmod 700 private
printf '#!/bin/sh\necho tool ran\n' > tool.sh && chmod 755 tool.sh
echo ro > readonly && chmod 444 readonly
chmod 1777 sticky
echo dot > .hidden/.rc
ln -s a/b/c/deep.txt rel-link
ln -s /etc/passwd abs-link
ln -s does/not/exist dangling
ln -s a dirlink
ln -s ../tmp cache
ln -s ../../etc/passwd a/up-and-out
mkdir locked && echo in > locked/f && chmod 555 locked
printf none > unreadable && chmod 000 unreadable
ln a/b/c/deep.txt hard
printf spaces > 'name with spaces'
printf newline > "$(printf 'odd name\nwith newline')"
touch -d '2001-02-03 04:05:06' old
head -c 1048576 /dev/urandom > random.bin
`

// TestSnapshotContent: the whole working directory survives a snapshot and
// a restore (types, modes, owners, links, odd names, contents, mtimes),
// while the source keeps running, unchanged; /tmp and processes are not
// captured.
func TestSnapshotContent(t *testing.T) {
	testenv.NotOn(t, podmanSnapshotImage, testenv.Podman...)
	t.Parallel()
	ctx := testCtx(t)
	cli := engineClient(t)
	src := newSandbox(t)
	snapRun(t, src, treeScript, 0)
	before := manifest(t, src)
	for _, want := range []string{
		"./private|directory|700|me",
		"./private/key|regular file|600|me|6|1|",
		"./sticky|directory|1777|me",
		"./tool.sh|regular file|755|me|",
		"./readonly|regular file|444|me|",
		"./a/b/c/deep.txt|regular file|644|me|5|2|",
		"./old|regular empty file|644|me|0|1|981173106",
		"./rel-link -> a/b/c/deep.txt",
		"./abs-link -> /etc/passwd",
		"./dangling -> does/not/exist",
		"./cache -> ../tmp",
		"./a/up-and-out -> ../../etc/passwd",
		"./locked|directory|555|me",
		"./unreadable|regular file|0|me|4|1|",
		"./odd name\n", // sort splits the line with the newline
		"\nwith newline|regular file|644|me|7|1|",
	} {
		if !strings.Contains(before, want) {
			t.Fatalf("the source's manifest lacks %q:\n%s", want, before)
		}
	}

	// A process keeps running in the source across the snapshot, writing
	// to /tmp (not captured) so that the working directory stays still.
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	ticker := src.Command(bctx, "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.05; done")
	if err := ticker.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, "test -s /tmp/ticks")

	sn := takeSnapshot(t, src)
	if sn.ID() == "" {
		t.Fatal("snapshot has no ID")
	}

	// The source is running, not paused, and its files are as they were.
	info, err := cli.ContainerInspect(ctx, src.ID())
	if err != nil {
		t.Fatal(err)
	}
	if !info.State.Running || info.State.Paused {
		t.Fatalf("source after Snapshot: running=%v paused=%v", info.State.Running, info.State.Paused)
	}
	if after := manifest(t, src); after != before {
		t.Fatalf("Snapshot changed the source's files:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	n := snapRun(t, src, "wc -l < /tmp/ticks", 0)
	waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %s", strings.TrimSpace(n)))

	// Its image, made on demand, is the base image plus one layer, and
	// carries the library's labels for this process.
	imgID, err := sn.Image(ctx)
	if err != nil {
		t.Fatalf("Image: %v", err)
	}
	if again, err := sn.Image(ctx); err != nil || again != imgID {
		t.Errorf("Image again: %s, %v; want the same image %s", again, err, imgID)
	}
	img, err := cli.ImageInspect(ctx, imgID)
	if err != nil {
		t.Fatalf("inspect snapshot image: %v", err)
	}
	base, err := cli.ImageInspect(ctx, busyboxImage)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(img.RootFS.Layers), len(base.RootFS.Layers)+1; got != want {
		t.Errorf("snapshot image has %d layers, want %d (base + 1)", got, want)
	}
	l := img.Config.Labels
	if l[owner.LabelManaged] != "true" || l[owner.LabelOwner] != owner.ID() || l[owner.LabelKind] != "snapshot" {
		t.Errorf("snapshot image labels: %v", l)
	}
	// The image holds the same files, under /.agentsandbox/workdir.
	fromImage, err := sandbox.New(ctx, sandbox.WithImage(imgID))
	if err != nil {
		t.Fatal(err)
	}
	defer fromImage.Close()
	const sums = "cd %s && md5sum random.bin hard && readlink cache"
	if got, want := snapRun(t, fromImage, fmt.Sprintf(sums, "/.agentsandbox/workdir"), 0), snapRun(t, src, fmt.Sprintf(sums, "."), 0); got != want {
		t.Errorf("the image's files:\n%s\nthe source's:\n%s", got, want)
	}

	r := restore(t, sn)
	if got := manifest(t, r); got != before {
		t.Fatalf("restored files differ:\nsource:\n%s\nrestored:\n%s", before, got)
	}
	for name, want := range map[string]string{odd: "newline", "name with spaces": "spaces", "rel-link": "deep\n", "hard": "deep\n"} {
		got, err := r.ReadFile(ctx, name)
		if err != nil || string(got) != want {
			t.Errorf("ReadFile(%q) in the restored sandbox = %q, %v; want %q", name, got, err, want)
		}
	}
	// Hard links are still one file.
	snapRun(t, r, `test "$(stat -c %i hard)" = "$(stat -c %i a/b/c/deep.txt)"`, 0)
	if out := snapRun(t, r, "./tool.sh", 0); out != "tool ran\n" {
		t.Errorf("tool.sh in the restored sandbox: %q", out)
	}
	// The restored working directory is writable by the user, like the
	// source's.
	// Each is its own user's (the restored sandbox has a user of its own).
	snapRun(t, r, `touch new && stat -c '%a %u:%g' . && test -w "$HOME"`, 0)
	const own = `stat -c '%a %u:%g' . | grep -cx "755 $(id -u):$(id -g)"`
	if got, want := snapRun(t, r, own, 0), snapRun(t, src, own, 0); got != "1\n" || got != want {
		t.Errorf("restored workdir is its user's: %q, the source's: %q", got, want)
	}
	if a, b := snapRun(t, r, "id -u", 0), snapRun(t, src, "id -u", 0); a == b {
		t.Errorf("the restored sandbox shares its source's user %s", a)
	}
	// Neither /tmp nor processes are captured.
	snapRun(t, r, "test ! -e /tmp/ticks", 0)
	if ps := snapRun(t, r, "ps -o args", 0); strings.Contains(ps, "ticks") {
		t.Errorf("the source's process runs in the restored sandbox:\n%s", ps)
	}

	stop()
	if err := ticker.Wait(); err == nil {
		t.Error("the ticker ended on its own")
	}
}

// waitExec polls until script exits 0 in sb.
func waitExec(t testing.TB, sb *sandbox.Sandbox, script string) {
	t.Helper()
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		r := mustExec(t, sb, script)
		return r.ExitCode == 0, fmt.Sprintf("%q still fails: %+v", script, r)
	})
}
