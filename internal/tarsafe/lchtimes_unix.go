//go:build unix

package tarsafe

import (
	"os"
	"path"
	"time"

	"golang.org/x/sys/unix"
)

// setMtime sets the access and modification times of name (a cleaned
// slash-separated path in root, a symbolic link itself if it is one) to
// mtime. The call is relative to name's directory, opened through root,
// so a path longer than PATH_MAX is fine, and the time goes to the kernel
// as seconds and nanoseconds: os.Chtimes passes it as int64 nanoseconds,
// which overflow after 2262 (a time in 2286 became 1901).
func setMtime(root *os.Root, name string, mtime time.Time) error {
	dir, base := path.Split(name)
	if dir == "" {
		dir = "."
	}
	d, err := root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	ts := unix.Timespec{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())}
	if err := unix.UtimesNanoAt(int(d.Fd()), base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: name, Err: err}
	}
	return nil
}
