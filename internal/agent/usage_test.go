//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// A cgroup is read only where it holds the agent: one mounted from the
// host's root (or another's) falls back to the processes' sums.
func TestUsageCgroup(t *testing.T) {
	self := os.Getpid()
	write := func(dir, name, v string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	procs := "1\n" + strconv.Itoa(self) + "\n"

	v1 := t.TempDir()
	write(v1+"/cpuacct", "cgroup.procs", procs)
	write(v1+"/cpuacct", "cpuacct.usage", "35738532\n")
	write(v1+"/memory", "cgroup.procs", procs)
	write(v1+"/memory", "memory.usage_in_bytes", "3805184\n")
	write(v1+"/memory", "memory.max_usage_in_bytes", "9999872\n")
	own := filepath.Join(t.TempDir(), "cgroup")
	write(filepath.Dir(own), "cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
	m := &usageMeter{root: v1, self: own}
	u := m.read(self, nil, []string{t.TempDir()})
	if u.Source != "cgroup v1" || u.CPU != 35738532 || u.Memory != 3805184 || u.MemoryPeak != 9999872 || u.PeakSampled {
		t.Errorf("cgroup v1: %+v", u)
	}
	if u.DiskUsed <= 0 {
		t.Errorf("DiskUsed %d of a temporary directory", u.DiskUsed)
	}
	// Rootless Podman on v1: the agent in the root cgroup, which holds
	// it but is not the sandbox's.
	inRoot := filepath.Join(t.TempDir(), "cgroup")
	write(filepath.Dir(inRoot), "cgroup", "4:memory:/process_api/x\n2:cpuacct:/\n1:cpu:/\n")
	if u := (&usageMeter{root: v1, self: inRoot}).read(self, nil, nil); u.Source != "processes" {
		t.Errorf("v1 from the root cgroup: %+v; want the processes' sums", u)
	}

	v2 := t.TempDir()
	write(v2, "cgroup.procs", procs)
	write(v2, "cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n")
	write(v2, "memory.current", "4096\n")
	m = &usageMeter{root: v2}
	if u := m.read(self, nil, nil); u.Source != "cgroup v2" || u.CPU != 1500_000 || u.Memory != 4096 || u.MemoryPeak != 4096 || !u.PeakSampled {
		t.Errorf("cgroup v2 without memory.peak: %+v", u)
	}
	write(v2, "memory.peak", "8192\n")
	if u := m.read(self, nil, nil); u.MemoryPeak != 8192 || u.PeakSampled {
		t.Errorf("cgroup v2 with memory.peak: %+v", u)
	}

	// Not the agent's cgroup: the processes' sums.
	write(v2, "cgroup.procs", "1\n2\n")
	write(v1+"/memory", "cgroup.procs", "1\n")
	for _, root := range []string{v1, v2, t.TempDir()} {
		m := &usageMeter{root: root}
		u := m.read(self, nil, nil)
		if u.Source != "processes" || !u.PeakSampled || u.CPU <= 0 || u.Memory <= 0 || u.MemoryPeak < u.Memory {
			t.Errorf("a cgroup not the agent's (%s): %+v", root, u)
		}
	}
}

// procStat reads its own process: a command name with spaces and
// parentheses does not shift the fields.
func TestProcStat(t *testing.T) {
	cpu, rss, ok := procStat(os.Getpid(), make([]byte, 1024))
	if !ok || cpu < 0 || rss < 1<<20 {
		t.Errorf("procStat of the test: cpu %d, rss %d, %v", cpu, rss, ok)
	}
	if _, _, ok := procStat(1<<30, make([]byte, 1024)); ok {
		t.Error("procStat of no process succeeded")
	}
}
