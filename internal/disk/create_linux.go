package disk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// maxAttachAttempts bounds how often Create retries when another process
// grabs the free loop device it was given.
const maxAttachAttempts = 64

// Create makes a sparse ext4 filesystem of size bytes whose root directory is
// empty and owned by uid:gid, and attaches it to a free loop device.
//
// size is rounded up to a multiple of 4 KiB and to at least [MinSize]. No
// blocks are reserved for root, so all of it but the filesystem's metadata (a
// few percent) is usable by any user. The filesystem has no journal (its
// content does not outlive the device anyway) and its inode tables are
// initialised lazily, so creating it is fast whatever its size, and host disk
// space is only consumed as the filesystem fills.
//
// The image file is created in a directory under [os.TempDir] (TMPDIR), which
// is removed before Create returns, successful or not; if that directory is
// on tmpfs, the filesystem's content occupies memory.
//
// The caller must call [Device.Release] once the volume using the device has
// been removed (see the package documentation), or if the device goes unused.
func Create(ctx context.Context, size int64, uid, gid int) (*Device, error) {
	if size <= 0 {
		return nil, fmt.Errorf("disk: invalid size %d", size)
	}
	if uid < 0 || gid < 0 {
		return nil, fmt.Errorf("disk: invalid owner %d:%d", uid, gid)
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	t := tools()
	size = roundSize(size)

	dir, err := os.MkdirTemp(os.TempDir(), "agentsandbox-disk-*")
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	defer os.RemoveAll(dir)

	img := filepath.Join(dir, "disk.img")
	backing, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	defer backing.Close()
	if err := backing.Truncate(size); err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}

	// mkfs.ext4 options, chosen to make formatting fast and cheap whatever
	// the size (see the package's tests for timings):
	//   -b 4096           4 KiB blocks even below 512 MiB, where mke2fs would
	//                     otherwise pick 1 KiB blocks;
	//   -m 0              no blocks reserved for root: the quota is the size;
	//   ^has_journal      no journal to write (and no space spent on it);
	//   ^resize_inode     no blocks reserved for growing the filesystem;
	//   lazy_itable_init  inode tables are not zeroed by mkfs;
	//   nodiscard         do not discard (punch) the already sparse image.
	// The file system's own features otherwise come from mke2fs.conf, which
	// matches the host's kernel.
	if err := run(ctx, t.mkfs, "-q", "-F", "-t", "ext4", "-b", strconv.Itoa(blockSize), "-m", "0",
		"-O", "^has_journal,^resize_inode",
		"-E", fmt.Sprintf("root_owner=%d:%d,lazy_itable_init=1,nodiscard", uid, gid),
		img); err != nil {
		return nil, err
	}
	// Remove lost+found so that the volume's root directory is empty.
	if err := runDebugfs(ctx, t.debugfs, "rmdir lost+found", img); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}

	loop, path, err := attach(backing, img)
	if err != nil {
		return nil, err
	}
	// From now on the loop device holds the image's inode: drop every name
	// of it so that nothing is left on the host whatever happens later.
	if err := os.RemoveAll(dir); err != nil {
		loop.Close()
		return nil, fmt.Errorf("disk: remove image: %w", err)
	}
	return &Device{path: path, size: size, f: loop}, nil
}

// run runs a command and returns an error including its output if it fails.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("disk: %s: %w", filepath.Base(name), ctx.Err())
		}
		return fmt.Errorf("disk: %s: %w: %s", filepath.Base(name), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}

// debugfsBanner matches the version line debugfs always prints on stderr.
var debugfsBanner = regexp.MustCompile(`^debugfs [0-9][^ ]* \(`)

// runDebugfs runs one debugfs request on img, opened read-write. debugfs
// exits with status 0 even when the request or opening the image fails, so
// any output on stderr other than its version banner is an error.
func runDebugfs(ctx context.Context, debugfs, request, img string) error {
	cmd := exec.CommandContext(ctx, debugfs, "-w", "-R", request, img)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("disk: debugfs: %w", ctx.Err())
	}
	var msgs []string
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !debugfsBanner.MatchString(line) {
			msgs = append(msgs, line)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("disk: debugfs %q: %w: %s", request, err, strings.Join(msgs, "; "))
	case len(msgs) > 0:
		return fmt.Errorf("disk: debugfs %q: %s", request, strings.Join(msgs, "; "))
	}
	return nil
}

// loopConfigureUnsupported is set once LOOP_CONFIGURE has been found missing
// (kernels before 5.8), so that later attachments go straight to the
// LOOP_SET_FD + LOOP_SET_STATUS64 fallback.
var noLoopConfigure atomic.Bool

// attachRetries counts the loop devices that other attachments grabbed
// between LOOP_CTL_GET_FREE and LOOP_CONFIGURE, for tests.
var attachRetries atomic.Int64

// attach binds backing to a free loop device with LO_FLAGS_AUTOCLEAR and
// returns the open loop device and its path. name is recorded as the backing
// file's name, for losetup.
func attach(backing *os.File, name string) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, "", fmt.Errorf("disk: %w", err)
	}
	defer ctl.Close()

	var lastErr error
	for range maxAttachAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("disk: get free loop device: %w", err)
		}
		path := "/dev/loop" + strconv.Itoa(n)
		loop, err := openLoop(path, n)
		if err != nil {
			return nil, "", err
		}
		err = configure(loop, backing, name)
		if err == nil {
			return loop, path, nil
		}
		loop.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, "", fmt.Errorf("disk: attach %s: %w", path, err)
		}
		// Another process bound this device between LOOP_CTL_GET_FREE
		// and now: ask for another one.
		lastErr = err
		attachRetries.Add(1)
	}
	return nil, "", fmt.Errorf("disk: no free loop device after %d attempts: %w", maxAttachAttempts, lastErr)
}

// openLoop opens loop device number n at path. When the device node is
// missing, as happens in a container whose /dev is not the host's devtmpfs,
// it creates the node from the device number the kernel publishes in sysfs.
func openLoop(path string, n int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		if err != nil {
			return nil, fmt.Errorf("disk: %w", err)
		}
		return f, nil
	}
	b, rerr := os.ReadFile(fmt.Sprintf("/sys/block/loop%d/dev", n))
	if rerr != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	var major, minor uint32
	if _, serr := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); serr != nil {
		return nil, fmt.Errorf("disk: %w (and cannot parse device number %q)", err, b)
	}
	if merr := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor))); merr != nil && !errors.Is(merr, os.ErrExist) {
		return nil, fmt.Errorf("disk: %w (and mknod: %v)", err, merr)
	}
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	return f, nil
}

// configure binds backing to the loop device loop with LO_FLAGS_AUTOCLEAR,
// using LOOP_CONFIGURE when the kernel has it (5.8 and later), and
// LOOP_SET_FD followed by LOOP_SET_STATUS64 otherwise.
func configure(loop, backing *os.File, name string) error {
	var info unix.LoopInfo64
	info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(info.File_name[:len(info.File_name)-1], name)
	lfd := int(loop.Fd())

	if !noLoopConfigure.Load() {
		err := unix.IoctlLoopConfigure(lfd, &unix.LoopConfig{Fd: uint32(backing.Fd()), Info: info})
		if err == nil || (!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY)) {
			return err
		}
		// EINVAL or ENOTTY: the kernel predates LOOP_CONFIGURE (or, on
		// a newer kernel, the legacy calls will fail the same way).
		noLoopConfigure.Store(true)
	}

	if err := unix.IoctlSetInt(lfd, unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(lfd, &info); err != nil {
		unix.IoctlSetInt(lfd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}
