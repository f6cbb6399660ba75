// Package engine holds the Docker plumbing shared by the sandbox package: the
// connection to the engine, the labels every object carries, and the owner
// identity that lets Prune tell a dead process's leftovers from a live one's.
package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"
)

// Label keys set on every container, volume, network and image the library
// makes.
const (
	LabelManaged = "dev.agentsandbox.managed" // always "true"
	LabelOwner   = "dev.agentsandbox.owner"   // see Owner
	LabelKind    = "dev.agentsandbox.kind"    // "sandbox", "disk", "snapshot", ...
)

// Host returns the engine address a client for host would use: host itself,
// or DOCKER_HOST, or the default socket.
func Host(host string) string {
	if host != "" {
		return host
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return client.DefaultDockerHost
}

var versions sync.Map // engine address -> negotiated API version

// Connect returns a client for the engine at host ("" means DOCKER_HOST or
// the default socket; TLS settings come from DOCKER_CERT_PATH and
// DOCKER_TLS_VERIFY as with the docker CLI). The API version is negotiated
// once per address and reused, so later connections cost no round trip.
// The error is the engine's own; callers decide how to present it.
func Connect(ctx context.Context, host string) (*client.Client, error) {
	addr := Host(host)
	opts := []client.Opt{client.FromEnv}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	if v, ok := versions.Load(addr); ok {
		opts = append(opts, client.WithVersion(v.(string)))
	} else {
		opts = append(opts, client.WithAPIVersionNegotiation())
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, err
	}
	if _, ok := versions.Load(addr); !ok {
		ping, err := cli.Ping(ctx)
		if err != nil {
			cli.Close()
			return nil, err
		}
		cli.NegotiateAPIVersionPing(ping)
		versions.Store(addr, cli.ClientVersion())
	}
	return cli, nil
}

// IsNotFound reports whether err is the engine's "no such object".
func IsNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

// IsConflict reports whether err is the engine's "conflict" (for example a
// container that is not running, or whose removal is already in progress).
func IsConflict(err error) bool { return cerrdefs.IsConflict(err) }

// IsUnreachable reports whether err means the engine could not be reached
// at all (as opposed to an error the engine returned).
func IsUnreachable(err error) bool {
	return client.IsErrConnectionFailed(err) || errors.Is(err, os.ErrNotExist) ||
		strings.Contains(err.Error(), "Cannot connect to the Docker daemon")
}

var owner = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	pid := os.Getpid()
	return fmt.Sprintf("%s/%s/%d/%d", host, strings.TrimSpace(string(boot)), pid, startTime(pid))
})

// Owner identifies this process: "hostname/boot-id/pid/start-time". It is
// stored in LabelOwner so that OwnerDead can later tell whether the process
// that made an object still runs.
func Owner() string { return owner() }

// Labels returns the labels for a new object of the given kind, with extra
// merged in (the library's own keys win).
func Labels(kind string, extra map[string]string) map[string]string {
	l := make(map[string]string, len(extra)+3)
	for k, v := range extra {
		l[k] = v
	}
	l[LabelManaged] = "true"
	l[LabelOwner] = Owner()
	l[LabelKind] = kind
	return l
}

// OwnerDead reports whether the process named by an owner label is known to
// have ended: it ran on this host and either the host has rebooted since or
// no process with that pid and start time exists. Objects of other hosts,
// and labels it cannot parse, are never reported dead.
func OwnerDead(label string) bool {
	parts := strings.Split(label, "/")
	mine := strings.Split(Owner(), "/")
	if len(parts) != 4 || parts[0] != mine[0] || parts[0] == "" {
		return false
	}
	if parts[1] != mine[1] {
		return mine[1] != "" // same host, new boot: the owner is gone
	}
	pid, err1 := strconv.Atoi(parts[2])
	start, err2 := strconv.ParseUint(parts[3], 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	return startTime(pid) != start
}

// startTime returns the start time of process pid in clock ticks since boot,
// or 0 if there is no such process.
func startTime(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64) // field 22 of stat
	return v
}
