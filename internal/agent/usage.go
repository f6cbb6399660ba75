//go:build linux

package main

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// What the sandbox uses, read from inside (see wire.Usage). The kernel
// keeps the figures of the sandbox's cgroup where the container sees its
// own: cgroup v1's cpuacct and memory controllers, v2's cpu.stat,
// memory.current and memory.peak. Where it sees none (rootless Podman on
// cgroup v1, gVisor's emulated cgroups with no figures, a cgroup mounted
// from the host's root), they are summed over the sandbox's processes
// (their CPU time and resident memory) and the peak is the largest sum the
// agent saw: a sample, said in Source.

// cgroupRoot is where the container's cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// maxUsageDirs bounds the places a usage request names.
const maxUsageDirs = 16

// sendUsage answers a usage request on channel ch.
func (a *agent) sendUsage(ch uint32, dirs []string) {
	a.mu.Lock()
	keep := slices.Clone(a.keep)
	a.mu.Unlock()
	a.sendJSON(wire.UsageState, ch, a.usage.read(os.Getpid(), keep, dirs))
}

// usageMeter reads usage; it remembers the largest memory sum it saw for
// the sampled peak.
type usageMeter struct {
	root string // cgroupRoot, or a test's directory
	self string // "/proc/self/cgroup", or a test's file

	mu   sync.Mutex
	peak int64
}

// read returns the usage now. self is the agent's pid and keep the
// relays' (neither is counted as a process of the sandbox's); dirs are
// the writable places whose file systems' used space is summed.
func (m *usageMeter) read(self int, keep []int, dirs []string) wire.Usage {
	var u wire.Usage
	procs := pids(self)
	procs = slices.DeleteFunc(procs, func(p int) bool { return slices.Contains(keep, p) })
	u.Processes = len(procs)
	u.DiskUsed = diskUsed(dirs)
	if m.fromCgroupV2(&u, self) || m.fromCgroupV1(&u, self) {
		return u
	}
	u.Source = "processes"
	u.PeakSampled = true
	// CPU: the live processes' (with the children each waited for), the
	// agent's own, and that of every process that ended: the agent, PID 1,
	// waits for them all, orphans included.
	var cpu, mem int64
	buf := make([]byte, 1024)
	for _, p := range procs {
		if c, rss, ok := procStat(p, buf); ok {
			cpu += c
			mem += rss
		}
	}
	if _, rss, ok := procStat(self, buf); ok {
		mem += rss
	}
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			cpu += ru.Utime.Nano() + ru.Stime.Nano()
		}
	}
	u.CPU, u.Memory = cpu, mem
	m.mu.Lock()
	m.peak = max(m.peak, mem)
	u.MemoryPeak = m.peak
	m.mu.Unlock()
	return u
}

// fromCgroupV2 fills u from a cgroup v2 hierarchy that is the sandbox's
// own (self is among its processes).
func (m *usageMeter) fromCgroupV2(u *wire.Usage, self int) bool {
	if !ownCgroup(m.root, self) {
		return false
	}
	stat, err := os.ReadFile(m.root + "/cpu.stat")
	if err != nil {
		return false
	}
	usec, ok := field(stat, "usage_usec")
	mem, ok2 := readInt(m.root + "/memory.current")
	if !ok || !ok2 {
		return false
	}
	u.Source = "cgroup v2"
	u.CPU, u.Memory = usec*1000, mem
	if peak, ok := readInt(m.root + "/memory.peak"); ok {
		u.MemoryPeak = peak
	} else { // kernels before 5.19 keep none
		m.mu.Lock()
		m.peak = max(m.peak, mem)
		u.MemoryPeak, u.PeakSampled = m.peak, true
		m.mu.Unlock()
	}
	return true
}

// fromCgroupV1 fills u from cgroup v1's cpuacct and memory controllers,
// where they are the sandbox's own.
func (m *usageMeter) fromCgroupV1(u *wire.Usage, self int) bool {
	cpuDir, memDir := m.root+"/cpuacct", m.root+"/memory"
	if !ownCgroup(cpuDir, self) || !ownCgroup(memDir, self) || inRootV1(m.self, "cpuacct") || inRootV1(m.self, "memory") {
		return false
	}
	cpu, ok1 := readInt(cpuDir + "/cpuacct.usage")
	mem, ok2 := readInt(memDir + "/memory.usage_in_bytes")
	peak, ok3 := readInt(memDir + "/memory.max_usage_in_bytes")
	if !ok1 || !ok2 || !ok3 {
		return false
	}
	u.Source = "cgroup v1"
	u.CPU, u.Memory, u.MemoryPeak = cpu, mem, peak
	return true
}

// ownCgroup reports whether the cgroup at dir holds process self: then it
// is the sandbox's, not an ancestor's mounted from the host.
func ownCgroup(dir string, self int) bool {
	b, err := os.ReadFile(dir + "/cgroup.procs")
	if err != nil {
		return false
	}
	want := []byte(strconv.Itoa(self))
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if bytes.Equal(line, want) {
			return true
		}
	}
	return false
}

// inRootV1 reports whether the process whose cgroup file (/proc/PID/cgroup)
// is file sits in the root cgroup of the v1 hierarchy of controller: never
// a sandbox's own (rootless Podman on cgroup v1 leaves its containers in
// the cgroups of the user that runs it, which may be the root), though it
// holds the agent. A container's own cgroup has a path of its own
// ("/docker/ID", "/kubepods/..."), as cgroup namespaces are not used on
// v1; one that is ("/" in a namespace of its own) is taken as not the
// sandbox's, and the processes' sums are used: right, if sampled.
func inRootV1(file, controller string) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return true
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		f := bytes.SplitN(line, []byte(":"), 3)
		if len(f) == 3 && slices.Contains(strings.Split(string(f[1]), ","), controller) {
			return string(f[2]) == "/"
		}
	}
	return true
}

// readInt reads a file holding one decimal number.
func readInt(name string) (int64, bool) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return n, err == nil
}

// field returns the number after name in a "name value" per line file.
func field(b []byte, name string) (int64, bool) {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(name+" ")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// procStat returns process pid's CPU time (user + system, its own and that
// of the children it waited for, nanoseconds) and resident memory (bytes)
// from /proc/PID/stat.
func procStat(pid int, buf []byte) (cpu, rss int64, ok bool) {
	b, ok := readFile("/proc/"+strconv.Itoa(pid)+"/stat", buf)
	if !ok {
		return 0, 0, false
	}
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): utime is field 14, stime 15, cutime 16,
	// cstime 17, rss 24.
	if len(f) < 22 {
		return 0, 0, false
	}
	var ticks int64
	for _, i := range []int{11, 12, 13, 14} {
		n, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		ticks += n
	}
	pages, err := strconv.ParseInt(string(f[21]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return ticks * (1e9 / clockTicks), pages * int64(os.Getpagesize()), true
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// architecture Linux runs this agent on.
const clockTicks = 100

// diskUsed sums the used space of the file systems holding dirs, each
// file system once.
func diskUsed(dirs []string) int64 {
	var used int64
	var seen [][2]int32
	for _, d := range dirs {
		var st syscall.Statfs_t
		if syscall.Statfs(d, &st) != nil {
			continue
		}
		id := [2]int32(st.Fsid.X__val)
		if slices.Contains(seen, id) {
			continue
		}
		seen = append(seen, id)
		used += int64(st.Blocks-st.Bfree) * st.Bsize
	}
	return used
}
