package sandbox_test

// Snapshots of hostile working directories: a directory of very many
// names, many hard links, paths longer than PATH_MAX and far-away times.
// Each must be captured (or refused for a true reason) without harming
// the source sandbox.

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// manyLinksScript makes, in directory many, n hard links (names of 250
// characters) to empty files f0, f1... (50,000 links each: ext4 allows
// 65,000): a directory of n long names that costs the disk few inodes.
const manyLinksScript = `import os, sys
n = int(sys.argv[1])
os.mkdir("many")
pad = "x" * 240
for i in range(n):
    f = "many/f%d" % (i // 50000)
    if i % 50000 == 0:
        open(f, "w").close()
    os.link(f, "many/%s%09d" % (pad, i))
print(sum(1 for _ in os.scandir("many")))
`

// linksCheck prints the number of names in directory many, and how many
// distinct files they are.
const linksCheck = `import os
inos = set()
n = 0
for e in os.scandir("many"):
    n += 1
    inos.add(e.inode())
print(n, len(inos))
`

// TestSnapshotManyNames: a directory of 200,000 long names, under a memory
// limit the agent's old whole-directory listing did not fit in, is
// captured: the source survives (it answers Exec), and the restore has
// every name, linked to one file (stored and counted once).
func TestSnapshotManyNames(t *testing.T) {
	testenv.Requires(t, testenv.DiskExt4) // the agent squeezed under a small Memory while the names live on disk
	t.Parallel()
	const n = 200000
	src := newPython(t, sandbox.WithLimits(sandbox.Limits{Memory: 48 << 20}))
	if err := src.WriteFile(testCtx(t), "mk.py", []byte(manyLinksScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := snapRun(t, src, "python3 mk.py 200000 && rm mk.py", 0); got != "200004\n" {
		t.Fatalf("links made: %q", got)
	}
	sn, err := src.Snapshot(testCtx(t))
	// Whatever the outcome, the source is alive.
	if got := snapRun(t, src, "echo alive", 0); got != "alive\n" {
		t.Fatalf("source after the snapshot: %q", got)
	}
	if err != nil {
		t.Fatalf("Snapshot of %d names: %v", n, err)
	}
	t.Cleanup(func() { sn.Remove(testCtx(t)) })
	r := restore(t, sn)
	if err := r.WriteFile(testCtx(t), "/tmp/check.py", []byte(linksCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	const check = `python3 /tmp/check.py; stat -c '%h %s' many/f3`
	if got, want := snapRun(t, r, check, 0), "200004 4\n50001 0\n"; got != want {
		t.Errorf("restored links: %q, want %q", got, want)
	}
}

// TestSnapshotHardLinks: 60,000 hard links of one small file in a small
// disk are stored once and counted once: the snapshot succeeds (it did
// not: the headers of the links' entries were blamed on file contents)
// and the restore has them linked.
func TestSnapshotHardLinks(t *testing.T) {
	t.Parallel()
	src := newPython(t, sandbox.WithLimits(sandbox.Limits{Disk: 64 << 20}))
	if snapRun(t, src, "stat -f -c %T .", 0) == "tmpfs\n" {
		// A tmpfs working directory (no loop devices: not root) counts
		// each link against its inodes, one per 8 KiB: room for 60,000.
		src.Close()
		src = newPython(t, sandbox.WithLimits(sandbox.Limits{Disk: 512 << 20, Memory: 1536 << 20}))
	}
	if err := src.WriteFile(testCtx(t), "mk.py", []byte(manyLinksScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// Deep in long names: each link's header holds two long paths.
	long := strings.Repeat("d", 250)
	deep := long + "/" + long + "/" + long
	snapRun(t, src, "mkdir -p "+deep+" && cd "+deep+" && python3 ~/mk.py 60000 && rm ~/mk.py && echo small > many/f1", 0)
	sn, err := src.Snapshot(testCtx(t))
	if err != nil {
		t.Fatalf("Snapshot of 60,000 hard links: %v", err)
	}
	t.Cleanup(func() { sn.Remove(testCtx(t)) })
	r := restore(t, sn)
	if err := r.WriteFile(testCtx(t), "/tmp/check.py", []byte(linksCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	check := "cd " + deep + " && " + `python3 /tmp/check.py; stat -c '%h %s' many/f1; cat many/x*000059999`
	if got, want := snapRun(t, r, check, 0), "60002 2\n10001 6\nsmall\n"; got != want {
		t.Errorf("restored links: %q, want %q", got, want)
	}
}

// TestSnapshotErrTooLargeReason: a snapshot over its bound says what was
// too large: file contents, naming the bound.
func TestSnapshotErrTooLargeReason(t *testing.T) {
	t.Parallel()
	const disk = 16 << 20
	src := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: disk}))
	// Sparse: a 64 MiB file in a 16 MiB disk.
	snapRun(t, src, "dd if=/dev/zero of=sparse bs=1 count=1 seek=67108863 2>/dev/null", 0)
	_, err := src.Snapshot(testCtx(t))
	if !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("Snapshot of a 64 MiB sparse file in a 16 MiB disk: %v, want ErrTooLarge", err)
	}
	if !strings.Contains(err.Error(), "file contents") || !strings.Contains(err.Error(), "16777216") {
		t.Errorf("ErrTooLarge reason: %v; want it to name file contents and the bound", err)
	}
}

// deepScript makes a path of 20 directories of 250-character names (more
// than 5,000 bytes: beyond PATH_MAX) with relative mkdir and chdir, and a
// file at its end; with an argument, it goes down and prints the file.
const deepScript = `import os, sys
n = "0" * 250
for i in range(20):
    if len(sys.argv) == 1:
        os.mkdir(n)
    os.chdir(n)
if len(sys.argv) == 1:
    with open("f", "w") as f:
        f.write("deep\n")
else:
    print(open("f").read(), end="")
`

// TestSnapshotPathMax: a path longer than PATH_MAX neither vetoes a
// snapshot or a CopyOut of the working directory: both carry it.
func TestSnapshotPathMax(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newPython(t)
	if err := src.WriteFile(ctx, "/tmp/deep.py", []byte(deepScript), 0o644); err != nil {
		t.Fatal(err)
	}
	snapRun(t, src, "python3 /tmp/deep.py", 0)
	sn := takeSnapshot(t, src)
	r := restore(t, sn)
	if err := r.WriteFile(ctx, "/tmp/deep.py", []byte(deepScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := snapRun(t, r, "python3 /tmp/deep.py cat", 0); got != "deep\n" {
		t.Errorf("deep file after restore: %q", got)
	}

	host := t.TempDir()
	if err := src.CopyOut(ctx, ".", host); err != nil {
		t.Fatalf("CopyOut of a tree with a path beyond PATH_MAX: %v", err)
	}
	// Walk down with a root per level: the path is too long for one call.
	root, err := os.OpenRoot(filepath.Join(host, "workspace"))
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("0", 250)
	for i := range 20 {
		next, err := root.OpenRoot(name)
		root.Close()
		if err != nil {
			t.Fatalf("CopyOut: level %d: %v", i+1, err)
		}
		root = next
	}
	defer root.Close()
	f, err := root.ReadFile("f")
	if err != nil || string(f) != "deep\n" {
		t.Errorf("CopyOut: deep file: %q, %v", f, err)
	}
}

// timesScript sets far-away modification times (2286, with nanoseconds;
// 1901; 1969) on files, a directory's file and a symbolic link.
const timesScript = `import os
open("far", "w").close()
open("old", "w").close()
open("before", "w").close()
os.symlink("far", "farlink")
os.utime("far", ns=(9999999999123456789, 9999999999123456789))
os.utime("old", ns=(-2147483000000000000, -2147483000000000000))
os.utime("before", ns=(-1000000001, -1000000001))
os.utime("farlink", ns=(9999999999000000001, 9999999999000000001), follow_symlinks=False)
`

const timesCheck = `import os
for n in ("far", "old", "before", "farlink"):
    print(n, os.lstat(n).st_mtime_ns)
`

// TestSnapshotTimes: modification times round-trip, far in the future
// (2286, beyond the nanoseconds an int64 holds) and before 1970 too.
func TestSnapshotTimes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newPython(t)
	if err := src.WriteFile(ctx, "/tmp/t.py", []byte(timesScript), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := src.WriteFile(ctx, "/tmp/c.py", []byte(timesCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	snapRun(t, src, "python3 /tmp/t.py", 0)
	want := snapRun(t, src, "python3 /tmp/c.py", 0)
	if !strings.Contains(want, "far 9999999999123456789\n") {
		t.Fatalf("the source's own times: %q", want)
	}
	sn := takeSnapshot(t, src)
	r := restore(t, sn)
	if err := r.WriteFile(ctx, "/tmp/c.py", []byte(timesCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := snapRun(t, r, "python3 /tmp/c.py", 0); got != want {
		t.Errorf("times after restore:\n%s\nwant:\n%s", got, want)
	}
}

// TestSnapshotMillionProbe is the measurement of issue 31's finding: a
// directory of 1,000,000 names of 250 characters under Memory 256 MiB.
// It runs only with SANDBOX_PROBE=1 (minutes), and logs the agent's peak
// memory, the snapshot's time and size and the restore's time.
func TestSnapshotMillionProbe(t *testing.T) {
	if os.Getenv("SANDBOX_PROBE") != "1" {
		t.Skip("SANDBOX_PROBE=1 runs it")
	}
	ctx := testCtx(t)
	src := newPython(t, sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20}))
	if err := src.WriteFile(ctx, "/tmp/mk.py", []byte(manyLinksScript), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	t.Logf("made: %s in %v", snapRun(t, src, "python3 /tmp/mk.py 1000000", 0), time.Since(start))
	t.Logf("agent before: %s", snapRun(t, src, "grep -E 'VmRSS|VmHWM' /proc/1/status || true", 0))
	start = time.Now()
	sn, err := src.Snapshot(ctx)
	d := time.Since(start)
	r, xerr := src.Exec(ctx, "echo alive; grep -E 'VmRSS|VmHWM' /proc/1/status || true")
	if xerr != nil {
		t.Fatalf("source after the snapshot (%v, snapshot error %v): %v", d, err, xerr)
	}
	t.Logf("source after: %q", r.Stdout)
	if err != nil {
		t.Fatalf("Snapshot after %v: %v", d, err)
	}
	defer sn.Remove(ctx)
	t.Logf("snapshot: %v, %d bytes (%.0f MiB) of host temp", d, sn.Size(), float64(sn.Size())/(1<<20))
	start = time.Now()
	rs, err := sn.New(ctx)
	if err != nil {
		t.Fatalf("restore after %v: %v", time.Since(start), err)
	}
	defer rs.Close()
	t.Logf("restore: %v", time.Since(start))
	if err := rs.WriteFile(ctx, "/tmp/check.py", []byte(linksCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("restored: %s", snapRun(t, rs, "python3 /tmp/check.py; grep -E 'VmRSS|VmHWM' /proc/1/status || true", 0))
}
