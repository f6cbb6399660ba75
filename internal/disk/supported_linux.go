package disk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// toolPaths holds the resolved paths of the e2fsprogs commands Create runs,
// and what is wrong if some are missing.
type toolPaths struct {
	mkfs, debugfs string
	missing       []string
}

// tools finds mkfs.ext4 and debugfs once.
var tools = sync.OnceValue(func() toolPaths {
	var t toolPaths
	var err error
	if t.mkfs, err = lookTool("mkfs.ext4"); err != nil {
		t.missing = append(t.missing, err.Error())
	}
	if t.debugfs, err = lookTool("debugfs"); err != nil {
		t.missing = append(t.missing, err.Error())
	}
	return t
})

// lookTool finds an e2fsprogs command in PATH or, as they live in sbin
// directories that are not always in PATH, in /usr/sbin and /sbin.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH, /usr/sbin or /sbin: install e2fsprogs (apt-get install e2fsprogs)", name)
}

// Supported reports whether this process can create devices with [Create]:
// it returns nil if so, and otherwise an error that says everything that is
// missing and how to fix it. It checks for CAP_SYS_ADMIN (needed to attach
// loop devices), for access to /dev/loop-control, and for the mkfs.ext4 and
// debugfs commands of e2fsprogs. The result is computed once and cached.
//
// Supported cannot tell whether the Docker engine runs on this host: the
// devices are only usable by an engine that shares this host's kernel and
// /dev.
func Supported() error { return supported() }

var supported = sync.OnceValue(func() error {
	var errs []string
	admin, err := hasSysAdmin()
	if err != nil {
		errs = append(errs, fmt.Sprintf("cannot read this process's capabilities: %v", err))
	} else if !admin {
		errs = append(errs, "disk limit needs root (CAP_SYS_ADMIN) on the engine's host to attach loop devices; run as root or set Limits.Disk = -1")
	}
	if f, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0); err != nil {
		switch {
		case errors.Is(err, os.ErrNotExist):
			errs = append(errs, "/dev/loop-control not found: load the loop module (modprobe loop), or if running in a container, give it the host's /dev (--privileged -v /dev:/dev)")
		case admin:
			errs = append(errs, fmt.Sprintf("%v: if running in a container, give it the host's loop devices (--privileged -v /dev:/dev), or set Limits.Disk = -1", err))
		default:
			errs = append(errs, err.Error())
		}
	} else {
		f.Close()
	}
	errs = append(errs, tools().missing...)
	if len(errs) == 0 {
		return nil
	}
	return errors.New("disk: not supported: " + strings.Join(errs, "; "))
})

// hasSysAdmin reports whether CAP_SYS_ADMIN is in this thread's effective
// capability set. All threads of a Go program share their capabilities
// unless changed with raw system calls.
func hasSysAdmin() (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, err
	}
	const c = unix.CAP_SYS_ADMIN
	return data[c/32].Effective&(1<<(c%32)) != 0, nil
}
