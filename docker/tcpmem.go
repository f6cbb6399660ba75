package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The kernel memory a sandbox's own TCP sockets hold (their send and
// receive buffers) is bounded on a cgroup v1 host by the container's
// memory.kmem.tcp.limit_in_bytes, at tcpMemory(Resources.Memory).
//
// Without it that memory is charged to no limit of the container: on
// cgroup v1 socket buffers are counted only in memory.kmem.tcp.*, and
// only once a limit is set there. A sandbox with no network at all can
// still pair sockets on its own loopback, write and never read: 64 pairs
// held 243 MiB of host kernel memory (/proc/net/sockstat "TCP: mem")
// while the container's memory.usage_in_bytes showed 15 MiB.
//
// The engine is not asked (HostConfig.KernelMemoryTCP): Docker 20.10
// accepts it and passes it to the runtime, but runc since 1.1 drops it
// ("Kernel memory settings are ignored and will be removed"), Podman
// (4.3, runc) likewise, and newer engines deprecate the field. The
// library writes the limit itself, from this host, once the container
// has started and before any command runs (the kernel charges a socket
// to the limit only if it was set when the socket was made, so the
// agent's first sockets are not counted; every command's are). That
// needs what a loop-mounted working directory needs: this process is
// root on the engine's host (a unix socket) and sees the container's
// process in its /proc. Elsewhere, and on cgroup v2 (where socket memory
// is charged to memory.max with the rest, so Memory bounds it already),
// nothing is written.
//
// At the bound the kernel refuses the sandbox's sockets more buffer:
// senders block or get EAGAIN, receivers drop what they cannot queue and
// the peer sends it again; each socket keeps a minimum so connections
// still progress, slowly. The agent's own frames do not use TCP in the
// container (they go over its attached stdin and stdout); its relay and
// Expose connections inside are sockets of the same container and slow
// down likewise while the sandbox holds the bound, without failing.

// tcpMemory is the bound on the kernel memory of a sandbox's TCP sockets
// for a Memory of memory bytes: a quarter of it, at least 16 MiB; 0 (no
// bound) when memory is not positive. A quarter leaves a busy sandbox
// dozens of connections at full speed (a connection's buffers grow to 4
// MiB sending and 6 MiB receiving by default) while keeping the host's
// memory for one sandbox within Memory and a quarter more.
func tcpMemory(memory int64) int64 {
	if memory <= 0 {
		return 0
	}
	return max(memory/4, 16<<20)
}

// cgroupMemoryRoot is where this host mounts the cgroup v1 memory
// hierarchy.
var cgroupMemoryRoot = "/sys/fs/cgroup/memory"

// errTCPMemUnsupported is a host where the library cannot bound a
// container's TCP memory itself (see tcpMemory), or need not.
var errTCPMemUnsupported = errors.New("not bounded here")

// boundTCPMemory sets the container's memory.kmem.tcp.limit_in_bytes to
// tcpMemory(Resources.Memory), as the doc above tcpMemory says. It
// returns an error wrapping errTCPMemUnsupported where the library cannot
// or need not write it.
func (in *instance) boundTCPMemory(ctx context.Context) error {
	limit := tcpMemory(in.spec.Resources.Memory)
	if limit == 0 {
		return fmt.Errorf("%w: Memory is unlimited", errTCPMemUnsupported)
	}
	if _, err := os.Stat(filepath.Join(cgroupMemoryRoot, "memory.kmem.tcp.limit_in_bytes")); err != nil {
		return fmt.Errorf("%w: no cgroup v1 TCP memory controller on this host", errTCPMemUnsupported)
	}
	if !strings.HasPrefix(in.d.Host(), "unix://") || os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root on the engine's host", errTCPMemUnsupported)
	}
	info, err := in.cli.ContainerInspect(ctx, in.id)
	if err != nil {
		return in.err("inspect container", err)
	}
	if info.State == nil || info.State.Pid <= 0 {
		return fmt.Errorf("%w: the container has no process", errTCPMemUnsupported)
	}
	dir, err := memoryCgroup(info.State.Pid)
	if err != nil {
		return fmt.Errorf("%w: %v", errTCPMemUnsupported, err)
	}
	// The process is the container's only if its cgroup is named after
	// it (docker/<id>, docker-<id>.scope, libpod-<id>...): a process ID
	// of another PID namespace would name another process here.
	if !strings.Contains(dir, in.id) {
		return fmt.Errorf("%w: process %d is in %s, not the container's cgroup", errTCPMemUnsupported, info.State.Pid, dir)
	}
	f := filepath.Join(cgroupMemoryRoot, dir, "memory.kmem.tcp.limit_in_bytes")
	if _, err := os.Stat(f); err != nil {
		return fmt.Errorf("%w: %v", errTCPMemUnsupported, err)
	}
	if err := os.WriteFile(f, []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return fmt.Errorf("sandbox: bound the container's TCP memory: %w", err)
	}
	return nil
}

// memoryCgroup returns the cgroup v1 memory cgroup of process pid, as a
// path under the hierarchy's root.
func memoryCgroup(pid int) (string, error) {
	file, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				p := filepath.Clean("/" + parts[2])
				if strings.Contains(parts[2], "..") || p == "/" {
					return "", fmt.Errorf("process %d: memory cgroup %q", pid, parts[2])
				}
				return p, nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("process %d has no cgroup v1 memory cgroup", pid)
}
