//go:build !linux

package disk

import (
	"context"
	"errors"
)

var errUnsupported = errors.New("disk: not supported: disk limit needs loop devices, which only Linux has; run on the engine's Linux host or set Limits.Disk = -1")

// Supported reports whether this process can create devices with [Create].
// Loop devices only exist on Linux: on other systems it always returns an
// error.
func Supported() error { return errUnsupported }

// Create makes a size-limited ext4 filesystem on a loop device. Loop devices
// only exist on Linux: on other systems it always returns an error.
func Create(ctx context.Context, size int64, uid, gid int) (*Device, error) {
	return nil, errUnsupported
}
