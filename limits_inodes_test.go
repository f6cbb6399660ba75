package sandbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// Files no process owns cannot take the memory kept for processes: with
// the default limits and a working directory in memory, /tmp, /dev/shm
// and the working directory each hold at most one inode per 8 KiB of
// their size (creating one more fails with ENOSPC), and once all three
// are full of files and of data a command can still allocate 100 MiB.
// (Before, empty files were bounded only by Memory: 554,037 of them
// filled 512 MiB in a "0 % used" /tmp, and every 100 MiB process was
// OOM-killed after.)
func TestLimitsTmpfsInodes(t *testing.T) {
	testenv.NotOn(t, podmanTmpfsInodes, testenv.Podman...)
	t.Parallel()
	sb := newSandbox(t, tmpfsDriver(t))
	// Empty files until one cannot be made (no fork per file: true is a
	// builtin whose failed redirection does not end the shell), then one
	// file of zeros until the space is gone.
	for _, d := range []string{"/tmp", "/dev/shm", "."} {
		r := mustExec(t, sb, "d="+d+"; i=0; while [ $i -lt 200000 ]; do true 2>/dev/null > \"$d/f$i\" || break; i=$((i+1)); done; "+
			"true > \"$d/more\"; echo $i; df -k \"$d\" | awk 'NR==2 {print $2}'")
		var n, kib int64
		if _, err := fmt.Sscan(r.Stdout, &n, &kib); err != nil {
			t.Fatalf("%s: %q %q", d, r.Stdout, r.Stderr)
		}
		// The root directory is an inode too; "." holds the files of
		// the library's own if any.
		want := driver.TmpfsInodes(kib << 10)
		if n >= want || n < want-8 || !strings.Contains(r.Stderr, "No space left on device") {
			t.Errorf("%s (%d KiB): %d empty files made, then %q; want fewer than %d, then ENOSPC", d, kib, n, r.Stderr, want)
		}
		t.Logf("%s: %d KiB, %d empty files", d, kib, n)
	}
	// Then data: a file in each that fills what the files left
	// (FileSize, 256 MiB, is above each).
	for _, d := range []string{"/tmp", "/dev/shm", "."} {
		r := mustExec(t, sb, "rm "+d+"/f0 && head -c 300m /dev/zero > "+d+"/f0; df -k "+d+" | awk 'NR==2 {print $4}'")
		if r.Stdout != "0\n" {
			t.Errorf("filling %s with data: %+v; want no space left", d, r)
		}
	}
	t.Logf("memory in use: %s", mustExec(t, sb, "cat /sys/fs/cgroup/memory.current /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null").Stdout)
	// 100 MiB held by one process (tail -c of a pipe keeps that many
	// bytes).
	r := mustExec(t, sb, "head -c 104857600 /dev/zero | tail -c 104857600 | wc -c")
	if r.ExitCode != 0 || r.OOMKilled || strings.TrimSpace(r.Stdout) != "104857600" {
		t.Errorf("100 MiB in a process with every tmpfs full of files and data: %+v", r)
	}
}
