//go:build linux

package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// requireSupported skips the test when this process is not root, which
// loop devices need (a decision: CI runs the tests as a docker-group user
// too), or when this machine cannot create devices, except in CI
// (CI=true), where that is a failure.
func requireSupported(tb testing.TB) {
	tb.Helper()
	testenv.Requires(tb, testenv.Root)
	if err := Supported(); err != nil {
		testenv.SkipOrFail(tb, "Supported: %v", err)
	}
}

// create calls Create and releases the device when the test ends.
func create(tb testing.TB, size int64, uid, gid int) *Device {
	tb.Helper()
	d, err := Create(context.Background(), size, uid, gid)
	if err != nil {
		tb.Fatalf("Create(%d, %d, %d): %v", size, uid, gid, err)
	}
	tb.Cleanup(func() { d.Release() })
	return d
}

// loopAttr reads /sys/block/loopN/loop/<attr> for d's device.
func loopAttr(d *Device, attr string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.Path()), "loop", attr))
	return strings.TrimSpace(string(b)), err
}

// backingFile returns the name of d's backing file and checks that it has
// been deleted, along with its directory.
func backingFile(t *testing.T, d *Device) string {
	t.Helper()
	bf, err := loopAttr(d, "backing_file")
	if err != nil {
		t.Fatalf("device %s not attached: %v", d.Path(), err)
	}
	name, deleted := strings.CutSuffix(bf, " (deleted)")
	if !deleted {
		t.Errorf("backing file %q not deleted", bf)
	}
	dir := filepath.Dir(name)
	if !strings.HasPrefix(filepath.Base(dir), "agentsandbox-disk-") || filepath.Dir(dir) != filepath.Clean(os.TempDir()) {
		t.Errorf("backing file %q not in %s/agentsandbox-disk-*", name, os.TempDir())
	}
	for _, p := range []string{name, dir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (Lstat: %v)", p, err)
		}
	}
	return bf
}

// waitDetached waits until d's loop device no longer has backing file bf.
func waitDetached(t *testing.T, d *Device, bf string) {
	t.Helper()
	// A hang guard: the kernel detaches asynchronously, sooner or later
	// depending on the machine's load, but a device that is still attached
	// this long after its release is leaked.
	poll.Eventually(t, testenv.HangGuard, func() (bool, string) {
		cur, err := loopAttr(d, "backing_file")
		return errors.Is(err, os.ErrNotExist) || (err == nil && cur != bf),
			fmt.Sprintf("%s still attached to %q (err %v) after release", d.Path(), cur, err)
	})
}

// assertAttached checks that d's loop device still has backing file bf.
func assertAttached(t *testing.T, d *Device, bf string) {
	t.Helper()
	if cur, err := loopAttr(d, "backing_file"); err != nil || cur != bf {
		t.Fatalf("%s: backing file %q (err %v), want %q", d.Path(), cur, err, bf)
	}
}

// mount mounts d on a temporary directory and returns it. The test's
// cleanup unmounts it if the test has not.
func mount(t *testing.T, d *Device) string {
	t.Helper()
	mnt := t.TempDir()
	if err := unix.Mount(d.Path(), mnt, "ext4", 0, ""); err != nil {
		t.Fatalf("mount %s: %v", d.Path(), err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

func unmount(t *testing.T, mnt string) {
	t.Helper()
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount %s: %v", mnt, err)
	}
}

// fill writes to a new file in dir until the filesystem is full and returns
// the number of bytes written.
func fill(t *testing.T, dir string) int64 {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	var total int64
	for {
		n, err := f.Write(buf)
		total += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write after %d bytes: %v, want ENOSPC", total, err)
			}
			break
		}
		if total > 1<<30 {
			t.Fatalf("wrote %d bytes without ENOSPC", total)
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("sync: %v", err)
	}
	return total
}

func TestCreateMountFillRelease(t *testing.T) {
	requireSupported(t)
	const size = 32 << 20
	const uid, gid = 1234, 2345
	d := create(t, size, uid, gid)

	if !strings.HasPrefix(d.Path(), "/dev/loop") {
		t.Errorf("Path() = %q, want /dev/loopN", d.Path())
	}
	if d.Size() != size {
		t.Errorf("Size() = %d, want %d", d.Size(), size)
	}
	bf := backingFile(t, d)
	if ac, err := loopAttr(d, "autoclear"); err != nil || ac != "1" {
		t.Errorf("autoclear = %q (err %v), want 1", ac, err)
	}
	if fsck, err := lookTool("e2fsck"); err == nil {
		if out, err := exec.Command(fsck, "-f", "-n", d.Path()).CombinedOutput(); err != nil {
			t.Errorf("e2fsck -fn %s: %v\n%s", d.Path(), err, out)
		}
	}

	mnt := mount(t, d)
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != uid || st.Gid != gid {
		t.Errorf("root owned by %d:%d, want %d:%d", st.Uid, st.Gid, uid, gid)
	}
	if ents, err := os.ReadDir(mnt); err != nil || len(ents) != 0 {
		t.Errorf("root entries %v (err %v), want none", ents, err)
	}

	total := fill(t, mnt)
	t.Logf("wrote %d bytes (%.1f MiB) before ENOSPC on a %d MiB device", total, float64(total)/(1<<20), size>>20)
	if total >= size || total <= 20<<20 {
		t.Errorf("wrote %d bytes before ENOSPC, want between 20 MiB and 32 MiB", total)
	}

	// Once the device is mounted, releasing it must not detach it: the
	// mount holds it until it is unmounted.
	if err := d.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	assertAttached(t, d, bf)
	if err := os.Remove(filepath.Join(mnt, "fill")); err != nil {
		t.Fatalf("filesystem unusable after Release: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "after-release"), []byte("ok"), 0o644); err != nil {
		t.Fatalf("filesystem unusable after Release: %v", err)
	}
	assertAttached(t, d, bf)

	unmount(t, mnt)
	waitDetached(t, d, bf)
	if err := d.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

func TestUnmountThenRelease(t *testing.T) {
	requireSupported(t)
	d := create(t, 32<<20, 1000, 1000)
	bf := backingFile(t, d)
	mnt := mount(t, d)
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	unmount(t, mnt)
	// The Device's descriptor still holds the device.
	assertAttached(t, d, bf)
	if err := d.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitDetached(t, d, bf)
}

func TestReleaseWithoutMount(t *testing.T) {
	requireSupported(t)
	d := create(t, 32<<20, 1000, 1000)
	bf := backingFile(t, d)
	if err := d.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	waitDetached(t, d, bf)
	if err := d.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

func TestTinySizeRoundedUp(t *testing.T) {
	requireSupported(t)
	for _, size := range []int64{1, 4096, MinSize - 1} {
		d := create(t, size, 0, 0)
		if d.Size() != MinSize {
			t.Errorf("Create(%d).Size() = %d, want %d", size, d.Size(), MinSize)
		}
		mnt := mount(t, d)
		if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o644); err != nil {
			t.Errorf("write to %d-byte device: %v", d.Size(), err)
		}
		unmount(t, mnt)
		d.Release()
	}
}

func TestRoundSize(t *testing.T) {
	for _, c := range []struct{ in, want int64 }{
		{1, MinSize},
		{MinSize, MinSize},
		{MinSize + 1, MinSize + 4096},
		{32 << 20, 32 << 20},
		{(32 << 20) - 100, 32 << 20},
	} {
		if got := roundSize(c.in); got != c.want {
			t.Errorf("roundSize(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestCreateInvalid(t *testing.T) {
	for _, c := range []struct {
		size     int64
		uid, gid int
	}{{0, 0, 0}, {-1, 0, 0}, {1 << 20, -1, 0}, {1 << 20, 0, -1}} {
		if d, err := Create(context.Background(), c.size, c.uid, c.gid); err == nil {
			d.Release()
			t.Errorf("Create(%d, %d, %d) succeeded", c.size, c.uid, c.gid)
		}
	}
}

func tempDirs(t *testing.T) map[string]bool {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "agentsandbox-disk-*"))
	if err != nil {
		t.Fatal(err)
	}
	s := map[string]bool{}
	for _, p := range m {
		s[p] = true
	}
	return s
}

func TestCreateCanceled(t *testing.T) {
	requireSupported(t)
	before := tempDirs(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := Create(ctx, 32<<20, 1000, 1000)
	if err == nil {
		d.Release()
		t.Fatal("Create with canceled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Create with canceled context: %v, want context.Canceled", err)
	}
	for p := range tempDirs(t) {
		if !before[p] {
			t.Errorf("%s left behind", p)
		}
	}
}

func TestCreateConcurrent(t *testing.T) {
	requireSupported(t)
	const n = 12
	retries := attachRetries.Load()
	defer func() { t.Logf("%d attach retries on EBUSY", attachRetries.Load()-retries) }()
	devs := make([]*Device, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { devs[i], errs[i] = Create(context.Background(), 16<<20, 1000, 1000) })
	}
	wg.Wait()
	seen := map[string]bool{}
	bfs := map[*Device]string{}
	for i, d := range devs {
		if errs[i] != nil {
			t.Errorf("Create #%d: %v", i, errs[i])
			continue
		}
		t.Cleanup(func() { d.Release() })
		if seen[d.Path()] {
			t.Errorf("%s returned twice", d.Path())
		}
		seen[d.Path()] = true
		bfs[d] = backingFile(t, d)
	}
	for d, bf := range bfs {
		if err := d.Release(); err != nil {
			t.Errorf("Release %s: %v", d.Path(), err)
		}
		waitDetached(t, d, bf)
	}
}

// Create's cost does not grow with the size (see its doc): a 16 GiB
// device takes the size it was asked for, as the kernel sees it, yet takes
// almost none of the host's disk where its image lives. How long Create
// takes is BenchmarkCreate's to measure.
func TestCreateSparse(t *testing.T) {
	requireSupported(t)
	// A full-size image would take the whole size; mkfs's metadata for
	// 16 GiB (bitmaps, group descriptors, inode tables lazily initialised)
	// is a few MiB. The bound leaves room for others writing beside us.
	const bound = 1 << 30
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(os.TempDir(), &st); err != nil {
			t.Fatalf("statfs %s: %v", os.TempDir(), err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	for _, size := range []int64{1 << 30, 16 << 30} {
		before := free()
		d := create(t, size, 1000, 1000)
		used := before - free()
		if d.Size() != size {
			t.Errorf("Size() = %d, want %d", d.Size(), size)
		}
		sectors, err := loopAttr(d, "../size")
		if err != nil {
			t.Fatalf("size of %s: %v", d.Path(), err)
		}
		if n, err := strconv.ParseInt(sectors, 10, 64); err != nil || n*512 != size {
			t.Errorf("%s has %q 512-byte sectors (%v), want %d", d.Path(), sectors, err, size/512)
		}
		if used > bound {
			t.Errorf("Create(%d MiB) took %d MiB of %s's filesystem, want at most %d MiB", size>>20, used>>20, os.TempDir(), bound>>20)
		}
		if err := d.Release(); err != nil {
			t.Errorf("Release: %v", err)
		}
	}
}

// BenchmarkCreate measures Create, which should take about as long
// whatever the size.
func BenchmarkCreate(b *testing.B) {
	requireSupported(b)
	for _, c := range []struct {
		name string
		size int64
	}{{"32MiB", 32 << 20}, {"1GiB", 1 << 30}, {"16GiB", 16 << 30}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				d, err := Create(context.Background(), c.size, 1000, 1000)
				if err != nil {
					b.Fatal(err)
				}
				d.Release()
			}
		})
	}
}

// TestLegacyAttach exercises the LOOP_SET_FD + LOOP_SET_STATUS64 path used
// on kernels without LOOP_CONFIGURE.
func TestLegacyAttach(t *testing.T) {
	requireSupported(t)
	old := noLoopConfigure.Load()
	noLoopConfigure.Store(true)
	defer noLoopConfigure.Store(old)

	d := create(t, 32<<20, 1000, 1000)
	bf := backingFile(t, d)
	if ac, err := loopAttr(d, "autoclear"); err != nil || ac != "1" {
		t.Errorf("autoclear = %q (err %v), want 1", ac, err)
	}
	mnt := mount(t, d)
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(); err != nil {
		t.Fatal(err)
	}
	assertAttached(t, d, bf)
	unmount(t, mnt)
	waitDetached(t, d, bf)
}

func TestLookToolMissing(t *testing.T) {
	_, err := lookTool("agentsandbox-no-such-tool")
	if err == nil || !strings.Contains(err.Error(), "apt-get install e2fsprogs") {
		t.Errorf("lookTool(missing) = %v, want an error telling how to install it", err)
	}
	if p, err := lookTool("mkfs.ext4"); err == nil && !filepath.IsAbs(p) {
		t.Errorf("lookTool(mkfs.ext4) = %q, want an absolute path", p)
	}
}

func TestCommandErrorsIncludeOutput(t *testing.T) {
	err := run(context.Background(), "sh", "-c", "echo boom >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("run(failing command) = %v, want its stderr in the error", err)
	}
	debugfs, lerr := lookTool("debugfs")
	if lerr != nil {
		testenv.SkipOrFail(t, "%v", lerr)
	}
	// debugfs exits with status 0 even when it fails.
	err = runDebugfs(context.Background(), debugfs, "rmdir lost+found", filepath.Join(t.TempDir(), "missing.img"))
	if err == nil || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("runDebugfs(missing image) = %v, want its stderr in the error", err)
	}
}
