//go:build unix

package tarsafe

import (
	"time"

	"golang.org/x/sys/unix"
)

// lchtimes sets the access and modification times of the symlink p itself.
func lchtimes(p string, mtime time.Time) error {
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
