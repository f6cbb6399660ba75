package wire

// UsageRequest asks the agent what the sandbox uses now (a Usage frame,
// answered with UsageState).
type UsageRequest struct {
	Dirs []string // the writable places whose file systems' used space is summed
}

// Usage is what the sandbox uses, as the agent sees it from inside.
type Usage struct {
	CPU         int64  // nanoseconds of CPU time since the sandbox started
	Memory      int64  // bytes in use now
	MemoryPeak  int64  // the most bytes in use at once
	PeakSampled bool   // MemoryPeak is the largest the agent saw, not the kernel's
	DiskUsed    int64  // bytes used on the file systems of UsageRequest.Dirs
	Processes   int    // the sandbox's processes, the agent's own aside
	Source      string // where the figures come from: "cgroup v1", "cgroup v2" or "processes"
}
