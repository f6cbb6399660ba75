// Package pseudofs knows where a sandbox's kernel file systems are mounted:
// /proc, /sys and /dev, whose files describe the kernel and devices rather
// than hold data (a size of 0 with endless contents, writes that change
// the system).
package pseudofs

import "strings"

// Mounts are the mount points of the kernel's pseudo file systems.
var Mounts = []string{"/proc", "/sys", "/dev"}

// Under returns the mount point of Mounts that the clean absolute path p
// is, or is under, and whether there is one.
func Under(p string) (mount string, ok bool) {
	for _, m := range Mounts {
		if p == m || strings.HasPrefix(p, m+"/") {
			return m, true
		}
	}
	return "", false
}
