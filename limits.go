package sandbox

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// Limits bounds what a sandbox may use. A zero field keeps the default (see
// DefaultLimits); a negative field removes that limit, except TmpSize
// (RAM: a negative value is refused).
//
// What each limit promises holds on every backend; how the backend puts it
// in force (cgroups, resource limits, what the working directory is) is
// in its package's doc: docker (Docker and Podman), kubernetes. The
// sandbox's agent checks from inside, as it starts, that CPUs, Memory,
// PIDs, FileSize and OpenFiles are in force, and New fails with an error
// wrapping ErrLimitsUnsupported where one is missing or looser than asked.
//
//   - CPUs: the sandbox gets at most that many cores' worth of time.
//   - Memory: all the sandbox's processes together, without swap; files
//     in /tmp and /dev/shm (and a working directory kept in memory) count
//     towards it. When the sandbox exceeds it the kernel's OOM killer
//     ends a process inside, and Exec reports OOMKilled. Commands start
//     with oom_score_adj 1000 and the library's agent stays below them,
//     so the OOM killer takes a command, not the agent, even when the
//     memory is held by files no process owns; only a command that lowers
//     its own oom_score_adj on purpose (to the agent's floor) competes
//     with the agent by size (and for the moment the agent takes to start
//     a command, the agent holds the command's value). A sandbox that dies of memory all the same
//     is reported as ErrSandboxGone saying so (OOMKilled). System V shared
//     memory is bounded by TmpSize in all and destroyed when no process
//     has it attached; System V message queues hold at most 1 MiB. The
//     kernel buffers of the sandbox's own TCP sockets (pairs on its
//     loopback need no network) count towards Memory, or are bounded
//     apart, as each backend's doc says.
//   - PIDs: a fork bomb stops at this many processes and threads (which
//     ones count, the sandbox's or its user's, is the backend's: see its
//     doc). The library's agent inside counts too: about a dozen threads,
//     started before any command runs, so that it can still kill commands
//     when the limit is reached (the minimum is 16).
//   - Disk: the working directory is a file system of this size; writing
//     past it fails with ENOSPC inside the sandbox. Its files are on a
//     disk of their own, or in memory, as the backend can (driver.Caps
//     says which; the audit record sandbox.create names it: "disk":
//     "ext4" or "tmpfs"). In memory (a tmpfs) they count towards Memory,
//     so the working directory must fit there: beside /tmp and /dev/shm
//     it may take what Memory leaves after a reserve for processes (a
//     quarter, at least 32 MiB), each tmpfs counted at its size and an
//     eighth for its inodes (see Files, below). The default Disk is sized
//     down to fit (213 MiB of the default 512 MiB Memory; a
//     sandbox.limits record says so); where Memory is too small even for
//     the default TmpSize, the default Disk and TmpSize share what the
//     reserve leaves 2:1:1 (43 MiB and 21 MiB each in 128 MiB). An
//     explicit Disk or TmpSize that does not fit is refused by New,
//     naming the Memory it needs and why the backend keeps the files in
//     memory. With Disk < 0 the working directory is an unsized tmpfs:
//     Memory is then the only bound on its files. The root filesystem is
//     read-only; the only writable places are the working directory
//     (which is also HOME), /tmp and /dev/shm (RAM-backed tmpfs of
//     TmpSize each, counted towards Memory) and POSIX message queues (at
//     most 800 KiB in all by RLIMIT_MSGQUEUE, also counted towards
//     Memory). That holds for commands run as root
//     (WithUser("0")) too, which hold no capabilities: the agent takes
//     every other writable mount (/dev among them) from root at start,
//     and root cannot write the working directory, which is the sandbox
//     user's. The conformance suite checks it from inside for both users
//     (sandboxtest.WritablePlaces).
//   - Files: each tmpfs (/tmp, /dev/shm, a working directory in memory)
//     holds at most one file, directory or link per 8 KiB of its size
//     (nr_inodes; 8,192 in the default 64 MiB /tmp, as many in /dev/shm;
//     at least 64), where the backend can set it; creating one more fails
//     with ENOSPC. An inode costs about 1 KiB of Memory that the tmpfs's
//     size does not count, so without this bound empty files could fill
//     Memory (half a million in 512 MiB) and leave commands nothing to run
//     in; where the backend cannot set it (see its doc), Memory is the
//     only bound.
//   - FileSize: RLIMIT_FSIZE; writing past it fails with EFBIG.
//   - OpenFiles: RLIMIT_NOFILE. One above what the backend can grant (its
//     engine's own hard limit) is refused: New fails with an error
//     wrapping ErrLimitsUnsupported that names Limits.OpenFiles and its
//     value, and leaves nothing behind. The same holds for FileSize.
//   - ExecTimeout: each command started by Cmd or Exec is killed, with every
//     process it started, once it has run this long.
//   - OutputBytes: Exec, Output and CombinedOutput keep at most this many
//     bytes of each stream; streamed writers see everything.
//   - Lifetime: the sandbox ends itself after this long (its agent ends
//     it), and its backend removes it, even if the process that made it
//     has died. (It also ends as soon as that process dies or closes the
//     sandbox.)
type Limits struct {
	CPUs        float64       // default 1
	Memory      int64         // bytes, no swap; default 512 MiB
	PIDs        int64         // default 256
	Disk        int64         // bytes the sandbox may write; default 1 GiB
	FileSize    int64         // largest single file; default 256 MiB
	OpenFiles   int64         // default 1024
	ExecTimeout time.Duration // per command; default 60s
	OutputBytes int64         // per stream captured by Exec/Output; default 1 MiB
	Lifetime    time.Duration // default 1h
	TmpSize     int64         // size of the /tmp and /dev/shm tmpfs each (and one file per 8 KiB of it); default 64 MiB
}

// tmpfsReserve is the part of Limits.Memory that a tmpfs working directory
// leaves to processes: a quarter, and at least 32 MiB.
func tmpfsReserve(memory int64) int64 { return max(memory/4, 32<<20) }

// tmpfsDisk fits a working directory that must be a tmpfs (its files are
// RAM, counted towards Memory) in Memory beside /tmp and /dev/shm and the
// reserve for processes, and returns l with its Disk and TmpSize as they
// will be. Sizes the user gave (diskSet, tmpSet) are kept or refused with
// an error saying what to change; defaults are made to fit: first Disk,
// then, when even the default TmpSize leaves it too little room, Disk half
// of what is left after the reserve and /tmp and /dev/shm a quarter each.
// A sandbox whose files could fill its memory would leave its commands
// nothing to run in.
func tmpfsDisk(l Limits, diskSet, tmpSet bool) (Limits, error) {
	if l.Memory <= 0 {
		return l, nil
	}
	const minDisk = 8 << 20
	files := l.Memory - tmpfsReserve(l.Memory) // for Disk, /tmp and /dev/shm
	// Each tmpfs takes up to its size and an eighth (its inodes: see
	// driver.TmpfsBytesPerInode): their sizes add up to 8/9 of files.
	data := files / (driver.TmpfsBytesPerInode + driver.TmpfsInodeBytes) * driver.TmpfsBytesPerInode
	room := data - 2*l.TmpSize
	switch {
	case l.Disk <= room:
		return l, nil
	case !diskSet && room >= 2*minDisk:
		l.Disk = room &^ (1<<20 - 1)
		return l, nil
	case !diskSet && !tmpSet && data >= 2*minDisk:
		l.TmpSize = (data / 4) &^ (1<<20 - 1)
		l.Disk = (data - 2*l.TmpSize) &^ (1<<20 - 1)
		return l, nil
	}
	need := l.Disk + 2*l.TmpSize
	need += need / 8            // their inodes
	need += max(need/3, 32<<20) // so that the reserve (a quarter of Memory) is left
	return l, fmt.Errorf("sandbox: Limits.Disk of %s does not fit in Limits.Memory of %s: the working directory is a tmpfs on this backend, "+
		"whose files are RAM counted towards Memory, "+
		"beside /tmp and /dev/shm (Limits.TmpSize, %s each) and %s kept for processes; "+
		"lower Disk to at most %s (or TmpSize), or raise Memory to at least %s",
		mib(l.Disk), mib(l.Memory), mib(l.TmpSize), mib(tmpfsReserve(l.Memory)), mib(max(room, 0)), mib(need))
}

// mib formats a byte count in MiB.
func mib(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// DefaultLimits returns the limits a sandbox gets when none are given.
func DefaultLimits() Limits {
	return Limits{
		CPUs:        1,
		Memory:      512 << 20,
		PIDs:        256,
		Disk:        1 << 30,
		FileSize:    256 << 20,
		OpenFiles:   1024,
		ExecTimeout: 60 * time.Second,
		OutputBytes: 1 << 20,
		Lifetime:    time.Hour,
		TmpSize:     64 << 20,
	}
}

// merge returns l with each zero field replaced by the one from def.
func (l Limits) merge(def Limits) Limits {
	pick := func(v, d int64) int64 {
		if v == 0 {
			return d
		}
		return v
	}
	if l.CPUs == 0 {
		l.CPUs = def.CPUs
	}
	l.Memory = pick(l.Memory, def.Memory)
	l.PIDs = pick(l.PIDs, def.PIDs)
	l.Disk = pick(l.Disk, def.Disk)
	l.FileSize = pick(l.FileSize, def.FileSize)
	l.OpenFiles = pick(l.OpenFiles, def.OpenFiles)
	l.ExecTimeout = time.Duration(pick(int64(l.ExecTimeout), int64(def.ExecTimeout)))
	l.OutputBytes = pick(l.OutputBytes, def.OutputBytes)
	l.Lifetime = time.Duration(pick(int64(l.Lifetime), int64(def.Lifetime)))
	l.TmpSize = pick(l.TmpSize, def.TmpSize)
	return l
}

// validate reports limits the engine cannot apply.
func (l Limits) validate() error {
	switch {
	case l.Memory > 0 && l.Memory < 6<<20:
		return fmt.Errorf("sandbox: Limits.Memory %d is below the engine's minimum of 6 MiB", l.Memory)
	case l.PIDs > 0 && l.PIDs < 16:
		return fmt.Errorf("sandbox: Limits.PIDs %d leaves no room for the sandbox's agent and commands (minimum 16)", l.PIDs)
	case l.Lifetime > 0 && l.Lifetime < time.Second:
		return fmt.Errorf("sandbox: Limits.Lifetime %v is shorter than one second", l.Lifetime)
	case l.TmpSize < 0:
		return fmt.Errorf("sandbox: Limits.TmpSize cannot be unlimited (it is RAM)")
	}
	return nil
}

// checkSeen compares the limits asked for with those the agent found in
// force (see wire.Seen). A limit it cannot tell about (-1) passes: the
// engine is trusted there. One not in force, or looser than asked, is an
// error wrapping ErrLimitsUnsupported.
func checkSeen(l Limits, seen wire.Seen) error {
	var missing []string
	loose := func(name string, asked, got int64, unit func(int64) string) {
		if asked > 0 && got >= 0 && (got == 0 || got > asked) {
			in := "none"
			if got > 0 {
				in = unit(got)
			}
			missing = append(missing, fmt.Sprintf("%s %s (in force: %s)", name, unit(asked), in))
		}
	}
	count := func(n int64) string { return strconv.FormatInt(n, 10) }
	loose("Memory", l.Memory, seen.Memory, mib)
	loose("PIDs", l.PIDs, seen.PIDs, count)
	loose("FileSize", l.FileSize, seen.FileSize, mib)
	loose("OpenFiles", l.OpenFiles, seen.OpenFiles, count)
	if l.CPUs > 0 && seen.CPUs >= 0 && (seen.CPUs == 0 || seen.CPUs > l.CPUs*1.01) {
		in := "none"
		if seen.CPUs > 0 {
			in = strconv.FormatFloat(seen.CPUs, 'g', 3, 64)
		}
		missing = append(missing, fmt.Sprintf("CPUs %g (in force: %s)", l.CPUs, in))
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the sandbox asked for %s, and its backend did not put them in force (rootless Podman on cgroup v1, for one, applies none); remove them (a negative value) to run without",
		ErrLimitsUnsupported, strings.Join(missing, ", "))
}
