package leftover

import (
	"slices"
	"testing"
)

func TestTakeOrderOnce(t *testing.T) {
	var s Set
	s.Add(Object{Volume, "v1"})
	s.Add(Object{Container, "c1"})
	s.Add(Object{Network, "n1"})
	s.Add(Object{Container, "c1"}) // once
	got := s.Take()
	want := []Object{{Container, "c1"}, {Network, "n1"}, {Volume, "v1"}}
	if !slices.Equal(got, want) {
		t.Errorf("Take() = %v, want %v", got, want)
	}
	if got := s.Take(); len(got) != 0 {
		t.Errorf("second Take() = %v, want nothing", got)
	}
}
