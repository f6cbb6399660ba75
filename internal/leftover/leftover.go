// Package leftover remembers engine objects that could not be removed
// because the engine did not answer (it was stopped, frozen or overloaded
// past the library's bounds), so that a later removal on the same engine,
// or Prune, removes them once it answers again.
//
// A request the engine did not answer may still be carried out later: a
// container whose create timed out can appear after the library gave up on
// it, and a removal that timed out may never happen. Such objects carry the
// library's labels, and Prune removes them after the process has exited;
// a Set covers the time while it still runs.
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
	Kind string // Container, Network or Volume
	Name string
}

// Set is the objects left on one engine. The zero Set is empty and ready;
// it is safe for concurrent use.
type Set struct {
	mu   sync.Mutex
	objs []Object
}

// Add remembers o, once.
func (s *Set) Add(o Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.objs, o) {
		s.objs = append(s.objs, o)
	}
}

// Take forgets and returns the objects remembered, in removal order:
// containers, then networks, then volumes. The caller Adds back those it
// could not remove.
func (s *Set) Take() []Object {
	s.mu.Lock()
	took := s.objs
	s.objs = nil
	s.mu.Unlock()
	order := map[string]int{Container: 0, Network: 1, Volume: 2}
	slices.SortStableFunc(took, func(a, b Object) int { return order[a.Kind] - order[b.Kind] })
	return took
}
