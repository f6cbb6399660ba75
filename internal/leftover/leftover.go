// Package leftover remembers engine objects that could not be removed
// because the engine did not answer (it was stopped, frozen or overloaded
// past the library's bounds), so that a later teardown on the same engine,
// or Prune, removes them once it answers again.
//
// A request the engine did not answer may still be carried out later: a
// container whose create timed out can appear after the library gave up on
// it, and a removal that timed out may never happen. Such objects carry the
// library's labels, and Prune removes them after the process has exited;
// this package covers the time while it still runs.
package leftover

import (
	"slices"
	"sync"
)

// Kinds of object, in the order they must be removed (a container holds
// its network and volume).
const (
	Container = "container"
	Network   = "network"
	Volume    = "volume"
)

// Object is one engine object to remove, by name (or ID).
type Object struct {
	Host string // engine address, as engine.Host returns it
	Kind string // Container, Network or Volume
	Name string
}

var reg struct {
	mu   sync.Mutex
	objs []Object
}

// Add remembers o, once.
func Add(o Object) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if !slices.Contains(reg.objs, o) {
		reg.objs = append(reg.objs, o)
	}
}

// Take forgets and returns the objects remembered on host, in removal
// order: containers, then networks, then volumes. The caller Adds back
// those it could not remove.
func Take(host string) []Object {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	var took, kept []Object
	for _, o := range reg.objs {
		if o.Host == host {
			took = append(took, o)
		} else {
			kept = append(kept, o)
		}
	}
	reg.objs = kept
	order := map[string]int{Container: 0, Network: 1, Volume: 2}
	slices.SortStableFunc(took, func(a, b Object) int { return order[a.Kind] - order[b.Kind] })
	return took
}

// Hosts returns the engines on which objects are remembered.
func Hosts() []string {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	var hosts []string
	for _, o := range reg.objs {
		if !slices.Contains(hosts, o.Host) {
			hosts = append(hosts, o.Host)
		}
	}
	return hosts
}
