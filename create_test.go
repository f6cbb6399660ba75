package sandbox

// Unit tests of the assembly of a sandbox's configuration and of its
// network policy: no engine.

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/driver"
)

// New and Snapshot.New assemble a configuration the same way: options on
// top of a base (the defaults, or the snapshot's settings), whose limits
// fill what the options leave zero and whose slices and maps are not
// touched.
func TestUnitAssembly(t *testing.T) {
	base, err := newConfig([]Option{WithEnv("A=1"), WithLabels(map[string]string{"k": "v"}), WithLimits(Limits{Memory: 256 << 20})})
	if err != nil {
		t.Fatal(err)
	}
	base.env = append(make([]string, 0, 8), base.env...) // room to append in place
	got, err := base.with([]Option{WithEnv("B=2"), WithLabels(map[string]string{"x": "y"}), WithLimits(Limits{Disk: 64 << 20})})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.env, []string{"A=1", "B=2"}) || !maps.Equal(got.labels, map[string]string{"k": "v", "x": "y"}) {
		t.Errorf("restored env %q labels %v, want the base's and the options'", got.env, got.labels)
	}
	other, err := base.with([]Option{WithEnv("C=3"), WithLabels(map[string]string{"x": "z"})})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.env, []string{"A=1", "B=2"}) || got.labels["x"] != "y" || !slices.Equal(other.env, []string{"A=1", "C=3"}) {
		t.Errorf("two restores from one base share their env or labels: %q %v, %q", got.env, got.labels, other.env)
	}
	if !slices.Equal(base.env, []string{"A=1"}) || len(base.labels) != 1 {
		t.Errorf("the base changed: env %q labels %v", base.env, base.labels)
	}
	want := base.limits
	want.Disk = 64 << 20
	if got.limits != want {
		t.Errorf("limits %+v, want the base's with Disk from the option: %+v", got.limits, want)
	}
	if !got.diskSet || got.tmpSet {
		t.Errorf("diskSet %v tmpSet %v: an explicit Disk on restore is the caller's, TmpSize is not", got.diskSet, got.tmpSet)
	}
	if same, err := base.with(nil); err != nil || same.limits != base.limits || same.diskSet != base.diskSet {
		t.Errorf("no options: limits %+v (%v), want the base's %+v", same.limits, err, base.limits)
	}
	if _, err := base.with([]Option{WithLimits(Limits{PIDs: 8})}); err == nil || !strings.Contains(err.Error(), "minimum 16") {
		t.Errorf("limits the engine cannot apply: %v", err)
	}
	if _, err := base.with([]Option{WithImage("")}); err == nil {
		t.Error("a failing option did not fail the assembly")
	}
}

// The policy is checked and its rules parsed once, in WithNetwork; the
// caller's slices are copied.
func TestUnitNetworkParse(t *testing.T) {
	cred := []Credential{{Host: "a.com", Header: "X", Value: "v"}}
	for _, tc := range []struct {
		name string
		p    NetworkPolicy
		say  string
	}{
		{"credentials without an allow-list", NetworkPolicy{Credentials: cred}, "need an allow-list"},
		{"credentials with Open", NetworkPolicy{Open: true, Credentials: cred}, "not Open"},
		{"bad rule", NetworkPolicy{Allow: []string{""}}, "allow pattern"},
	} {
		if _, err := newConfig([]Option{WithNetwork(tc.p)}); err == nil || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.say)
		}
	}

	allow := []string{"a.com"}
	c, err := newConfig([]Option{WithNetwork(NetworkPolicy{Allow: allow, Credentials: cred})})
	if err != nil {
		t.Fatal(err)
	}
	allow[0], cred[0].Value = "b.com", "w"
	if c.network.Allow[0] != "a.com" || c.network.Credentials[0].Value != "v" || len(c.rules) != 1 {
		t.Errorf("policy %+v, rules %v: want the policy as given, parsed once", c.network, c.rules)
	}

	c, err = newConfig([]Option{WithNetwork(NetworkPolicy{Credentials: []Credential{}})})
	if err != nil || !c.network.none() || c.network.Credentials != nil {
		t.Errorf("an empty Credentials list alone: %v, policy %#v, want the zero policy", err, c.network)
	}
}

// Where the backend keeps the working directory in memory, an explicit
// Disk that does not fit is refused with the numbers to change and the
// backend's own reason, asked of it (driver.Caps.DiskWhy), not a guess
// about Docker.
func TestUnitDiskWhy(t *testing.T) {
	fd := &fakeDriver{caps: driver.Caps{Disk: driver.DiskMemory, DiskWhy: "the fake backend has no disks"}}
	_, err := New(context.Background(), WithDriver(fd), WithLimits(Limits{Memory: 128 << 20, Disk: 1 << 30}))
	if err == nil || !strings.Contains(err.Error(), "does not fit") || !strings.Contains(err.Error(), "the fake backend has no disks") ||
		strings.Contains(err.Error(), "root on") || len(fd.specs) != 0 {
		t.Errorf("New with a Disk that cannot fit in memory: %v (%d creates), want the backend's reason", err, len(fd.specs))
	}
}

// The root's texts speak of sandboxes: a gone or paused sandbox's error
// names no engine command as the only cause, and the shared sentinels
// keep their identity.
func TestUnitNeutralTexts(t *testing.T) {
	if !errors.Is(ErrSandboxGone, driver.ErrGone) || strings.Contains(ErrSandboxGone.Error(), "container") {
		t.Errorf("ErrSandboxGone = %q", ErrSandboxGone)
	}
	s := &Sandbox{id: "0123456789abcdef"}
	err := s.pausedErr("exec")
	if !errors.Is(err, ErrUnresponsive) || !strings.Contains(err.Error(), "paused from outside the library (docker pause / podman pause)") ||
		!strings.Contains(err.Error(), "0123456789ab") {
		t.Errorf("pausedErr: %v", err)
	}
}
