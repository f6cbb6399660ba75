package sandbox

import (
	"fmt"
	"time"
)

// Limits bounds what a sandbox may use. A zero field keeps the default (see
// DefaultLimits); a negative field removes that limit, except TmpSize
// (RAM: a negative value is refused).
//
// How each limit is enforced:
//
//   - CPUs: the container's CPU quota (CFS); the sandbox gets at most that
//     many cores' worth of time.
//   - Memory: the container's memory cgroup, swap disabled. When the sandbox
//     exceeds it the kernel's OOM killer ends a process inside, and Exec
//     reports OOMKilled. Files in /tmp (a tmpfs) count towards it.
//   - PIDs: the container's pids cgroup; a fork bomb stops at this many
//     processes and threads. The library's agent inside counts too: about a
//     dozen threads, started before any command runs, so that it can still
//     kill commands when the limit is reached (the minimum is 16).
//   - Disk: the working directory is a filesystem of this size; writing
//     past it fails with ENOSPC inside the sandbox. Where the library can
//     (it runs as root, with e2fsprogs, on the engine's host) it is an ext4
//     image on a loop device, mounted as a Docker volume: files are on
//     disk. Elsewhere (a docker-group user, a remote engine) it is a tmpfs
//     volume of this size, mounted by the engine: the same bound, but the
//     files live in RAM and count towards Memory. The audit record
//     sandbox.create says which ("disk": "ext4" or "tmpfs"). The root
//     filesystem is read-only; the only writable places are the working
//     directory (which is also HOME), /tmp and /dev/shm (RAM-backed tmpfs
//     of TmpSize each, counted towards Memory) and POSIX message queues
//     (at most 800 KiB in all by RLIMIT_MSGQUEUE, also counted towards
//     Memory).
//     With Disk < 0 the working directory is an unsized tmpfs volume:
//     Memory is then the only bound on its files.
//   - FileSize: RLIMIT_FSIZE; writing past it fails with EFBIG.
//   - OpenFiles: RLIMIT_NOFILE.
//   - ExecTimeout: each command started by Cmd or Exec is killed, with every
//     process it started, once it has run this long.
//   - OutputBytes: Exec, Output and CombinedOutput keep at most this many
//     bytes of each stream; streamed writers see everything.
//   - Lifetime: the container ends itself after this long, and is removed by
//     the engine, even if the process that made it has died. (It also ends
//     as soon as that process dies or closes the sandbox.)
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
	TmpSize     int64         // size of the /tmp and /dev/shm tmpfs each; default 64 MiB
}

// msgQueueBytes bounds the bytes a sandbox's POSIX message queues may
// hold (RLIMIT_MSGQUEUE): the kernel's default.
const msgQueueBytes = 800 << 10

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
