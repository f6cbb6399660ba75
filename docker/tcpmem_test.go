package docker

import (
	"os"
	"strings"
	"testing"
)

func TestUnitTCPMemoryBound(t *testing.T) {
	for _, c := range []struct{ memory, want int64 }{
		{512 << 20, 128 << 20},
		{2 << 30, 512 << 20},
		{32 << 20, 16 << 20}, // at least 16 MiB
		{0, 0},
		{-1, 0}, // Memory unlimited: no bound
	} {
		if got := tcpMemory(c.memory); got != c.want {
			t.Errorf("tcpMemory(%d) = %d, want %d", c.memory, got, c.want)
		}
	}
}

func TestUnitTCPMemoryCgroupOfSelf(t *testing.T) {
	if _, err := os.Stat(cgroupMemoryRoot); err != nil {
		t.Skip("no cgroup v1 memory hierarchy")
	}
	p, err := memoryCgroup(os.Getpid())
	if err != nil {
		// The root cgroup is refused: the library writes no limit there.
		if !strings.Contains(err.Error(), `memory cgroup "/"`) {
			t.Fatal(err)
		}
		return
	}
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "..") {
		t.Errorf("memoryCgroup(self) = %q", p)
	}
}
