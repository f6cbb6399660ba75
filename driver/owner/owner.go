// Package owner is how every backend marks what it makes on its engine,
// and tells a dead process's leftovers from a live one's: the label keys,
// the identity of this process (ID), and whether the process named by an
// identity has ended (Dead). A backend in any module stores ID in
// LabelOwner (or, where a label value cannot hold it, an annotation of
// that key, as the Kubernetes backend does) and its Prune removes only
// what Dead says is a dead process's.
package owner

import (
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Label keys set on every object the library makes (containers, volumes,
// networks, images, pods).
const (
	LabelManaged = "dev.agentsandbox.managed" // always "true"
	LabelOwner   = "dev.agentsandbox.owner"   // ID of the process that made it
	LabelKind    = "dev.agentsandbox.kind"    // what for: "sandbox", "disk", "snapshot", ...
)

// Label keys of leased sandboxes (driver.Spec.Agent.Lease), which no
// process owns: Prune leaves such an instance, and every object made for
// it, while the instance runs, whatever Dead says of LabelOwner, and
// removes them once it has ended.
const (
	// LabelLease is on a leased instance and on what was made for it:
	// the lease's duration (time.Duration's String).
	LabelLease = "dev.agentsandbox.lease"
	// LabelInstance is on what was made for a leased instance (a volume,
	// a network): the instance's name, to ask whether it still runs.
	LabelInstance = "dev.agentsandbox.instance"
	// LabelRecord holds driver.Spec.Record, where labels hold it.
	LabelRecord = "dev.agentsandbox.record"
	// LabelImage is the image the instance was asked to run
	// (driver.Spec.Image), as given.
	LabelImage = "dev.agentsandbox.image"
)

var id = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	pid := os.Getpid()
	return fmt.Sprintf("%s/%s/%d/%d", host, strings.TrimSpace(string(boot)), pid, startTime(pid))
})

// ID identifies this process: "hostname/boot-id/pid/start-time". It is
// stored in LabelOwner so that Dead can later tell whether the process
// that made an object still runs.
func ID() string { return id() }

// Labels returns the labels for a new object of the given kind, with extra
// merged in (the library's own keys win).
func Labels(kind string, extra map[string]string) map[string]string {
	l := make(map[string]string, len(extra)+3)
	maps.Copy(l, extra)
	l[LabelManaged] = "true"
	l[LabelOwner] = ID()
	l[LabelKind] = kind
	return l
}

// Dead reports whether the process named by an owner label (an ID) is
// known to have ended: it ran on this host and either the host has
// rebooted since or no process with that pid and start time exists.
// Objects of other hosts, and labels it cannot parse, are never reported
// dead.
func Dead(label string) bool {
	parts := strings.Split(label, "/")
	mine := strings.Split(ID(), "/")
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
