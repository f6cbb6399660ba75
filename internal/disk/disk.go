// Package disk creates size-limited ext4 filesystems on loop devices, used to
// give each sandbox a working directory with a hard disk quota.
//
// The Docker engine this library targets (20.10 with the fuse-overlayfs
// storage driver) cannot limit a container's disk usage with
// --storage-opt size. Instead, each sandbox gets a volume of the "local"
// driver with the options type=ext4 and device=/dev/loopN, where /dev/loopN is
// a [Device] created by [Create]. Writes beyond the device's size fail with
// ENOSPC inside the container.
//
// A Device is backed by a sparse image file that is unlinked as soon as the
// loop device holds it, so nothing is ever left on the host's filesystem. The
// loop device is attached with LO_FLAGS_AUTOCLEAR: the kernel detaches it,
// and frees the space of the image, once its last user is gone. Until the
// engine mounts the volume, that user is the file descriptor held by the
// Device; once the engine has mounted it, the mount also keeps the device
// alive. The engine's "local" driver unmounts the volume when the last
// container using it stops: if the Device has been released by then, the
// device disappears along with its data, the volume becomes unusable (a
// restarted container fails to mount it with EIO), and the number of the
// loop device may be reused by another Device, which a later mount of the
// stale volume would then mount. The safe lifecycle is therefore: Create,
// create the volume, run the container, and call [Device.Release] only after
// the volume has been removed.
//
// All of this needs Linux and root (CAP_SYS_ADMIN) on the host that runs the
// engine; [Supported] reports whether this process can do it.
package disk

import (
	"fmt"
	"os"
	"sync"
)

const (
	// MinSize is the smallest device [Create] makes. Smaller requested sizes
	// are rounded up to it: ext4 with 4 KiB blocks needs about 256 KiB for
	// its own metadata, and a device much smaller than 1 MiB would be
	// useless anyway.
	MinSize = 1 << 20

	// blockSize is the ext4 block size. Device sizes are rounded up to a
	// multiple of it.
	blockSize = 4096
)

// Device is an ext4 filesystem on an attached loop device, created by
// [Create]. Its methods are safe for concurrent use.
type Device struct {
	path string
	size int64

	mu sync.Mutex
	f  *os.File // the loop device; nil once released
}

// Path returns the path of the loop device, such as "/dev/loop3", to pass as
// the device option of a "local" Docker volume.
func (d *Device) Path() string { return d.path }

// Size returns the size of the filesystem in bytes: the size passed to
// [Create], rounded up to a multiple of 4 KiB and to at least [MinSize].
func (d *Device) Size() int64 { return d.size }

// Release closes the file descriptor that keeps the loop device attached. If
// the device is mounted, the mount keeps it attached until it is unmounted;
// otherwise the kernel detaches it, and frees its space, right away (the
// detach is asynchronous and may finish shortly after Release returns).
//
// Release should be called once the volume using the device has been removed
// (see the package documentation). It must not be called before the engine
// has mounted the volume (in practice: before the container using it has
// started), or the device is gone by then. Calling Release more than once is
// harmless.
func (d *Device) Release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	if err != nil {
		return fmt.Errorf("disk: release %s: %w", d.path, err)
	}
	return nil
}

// roundSize rounds size up to a multiple of blockSize and to at least MinSize.
func roundSize(size int64) int64 {
	if size < MinSize {
		return MinSize
	}
	if r := size % blockSize; r != 0 {
		size += blockSize - r
	}
	return size
}
