//go:build !unix

package tarsafe

import (
	"io/fs"
	"os"
	"time"
)

// setMtime sets the modification time of name in root; a symbolic link's
// is left as it is.
func setMtime(root *os.Root, name string, mtime time.Time) error {
	if fi, err := root.Lstat(name); err != nil || fi.Mode()&fs.ModeSymlink != 0 {
		return err
	}
	return root.Chtimes(name, time.Time{}, mtime)
}
