//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// seenLimits reads the limits in force on the agent: what its container's
// cgroup (v1 or v2, as the engine mounts it at /sys/fs/cgroup) and its own
// resource limits say, so that the library can tell a limit it asked for
// from one the engine did not apply (a rootless engine on cgroup v1
// applies none).
// A process limit the agent put on its commands' user itself (nproc, as
// RLIMIT_NPROC) counts as a PIDs limit where the cgroup has none or a
// looser one.
func seenLimits(nproc int64) wire.Seen {
	s := wire.Seen{
		CPUs:      cpuQuota(),
		Memory:    cgroupValue("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"),
		PIDs:      cgroupValue("/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/pids.max"),
		FileSize:  rlimit(unix.RLIMIT_FSIZE),
		OpenFiles: rlimit(unix.RLIMIT_NOFILE),
	}
	if nproc > 0 && (s.PIDs <= 0 || s.PIDs > nproc) {
		s.PIDs = nproc
	}
	return s
}

// noLimit is at or above what cgroup v1 reports for an unlimited memory
// cgroup (the largest page-aligned int64).
const noLimit = 1 << 62

// cgroupValue reads the first of the files that exists: "max" or a huge
// number is 0 (none), no file -1.
func cgroupValue(files ...string) int64 {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil:
			return -1
		case n >= noLimit:
			return 0
		}
		return n
	}
	return -1
}

// cpuQuota reads the cgroup's CPU bandwidth limit: quota ÷ period.
func cpuQuota() float64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil { // v2: "max 100000" or "50000 100000"
		f := strings.Fields(string(b))
		if len(f) == 2 {
			if f[0] == "max" {
				return 0
			}
			q, err1 := strconv.ParseFloat(f[0], 64)
			p, err2 := strconv.ParseFloat(f[1], 64)
			if err1 == nil && err2 == nil && p > 0 {
				return q / p
			}
		}
		return -1
	}
	q := cgroupValue("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") // v1: -1 for none
	p := cgroupValue("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
	switch {
	case p <= 0:
		return -1
	case q < 0:
		return 0
	}
	return float64(q) / float64(p)
}

// rlimit returns the hard resource limit, 0 for none.
func rlimit(which int) int64 {
	var rl unix.Rlimit
	if unix.Getrlimit(which, &rl) != nil {
		return -1
	}
	if rl.Max == unix.RLIM_INFINITY || rl.Max >= noLimit {
		return 0
	}
	return int64(rl.Max)
}
