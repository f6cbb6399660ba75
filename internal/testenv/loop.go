package testenv

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Loop is an attached loop device.
type Loop struct {
	Name        string // "loop3"
	BackingFile string // as the kernel reports it, e.g. "/tmp/x/disk.img (deleted)"
}

// LoopDevices lists the loop devices attached on this host (every process's,
// not only this one's), from /sys/block/loop*/loop/backing_file, which
// exists only while a device is bound to a file. On a system without loop
// devices (or without /sys) it returns an empty list.
func LoopDevices() ([]Loop, error) {
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var loops []Loop
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // detached since the glob
			}
			return nil, err
		}
		name := filepath.Base(filepath.Dir(filepath.Dir(f)))
		loops = append(loops, Loop{Name: name, BackingFile: strings.TrimSpace(string(b))})
	}
	sort.Slice(loops, func(i, j int) bool { return loops[i].Name < loops[j].Name })
	return loops, nil
}
