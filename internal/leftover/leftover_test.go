package leftover

import (
	"slices"
	"testing"
)

func TestTakeOrderAndHosts(t *testing.T) {
	Add(Object{"unix:///a", Volume, "v1"})
	Add(Object{"unix:///a", Container, "c1"})
	Add(Object{"unix:///b", Container, "c2"})
	Add(Object{"unix:///a", Network, "n1"})
	Add(Object{"unix:///a", Container, "c1"}) // once
	if h := Hosts(); !slices.Equal(h, []string{"unix:///a", "unix:///b"}) {
		t.Errorf("Hosts() = %q", h)
	}
	got := Take("unix:///a")
	want := []Object{{"unix:///a", Container, "c1"}, {"unix:///a", Network, "n1"}, {"unix:///a", Volume, "v1"}}
	if !slices.Equal(got, want) {
		t.Errorf("Take(a) = %v, want %v", got, want)
	}
	if got := Take("unix:///a"); len(got) != 0 {
		t.Errorf("second Take(a) = %v, want nothing", got)
	}
	if got := Take("unix:///b"); len(got) != 1 || got[0].Name != "c2" {
		t.Errorf("Take(b) = %v", got)
	}
	if h := Hosts(); len(h) != 0 {
		t.Errorf("Hosts() after taking all = %q", h)
	}
}
