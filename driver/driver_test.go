package driver

import "testing"

// The audit record names the working directory's file system by
// DiskKind's String; the zero value is memory.
func TestUnitDiskKind(t *testing.T) {
	var zero DiskKind
	if !zero.InMemory() || zero.String() != "tmpfs" || DiskExt4.InMemory() || DiskExt4.String() != "ext4" {
		t.Errorf("zero %v (in memory %v), ext4 %v (in memory %v)", zero, zero.InMemory(), DiskExt4, DiskExt4.InMemory())
	}
	if s := DiskKind(7).String(); s != "DiskKind(7)" {
		t.Errorf("unknown kind: %q", s)
	}
}

// The test suite names backends (AGENTSANDBOX_BACKEND) by EngineKind's
// String; the zero value is an engine the backend does not name.
func TestUnitEngineKind(t *testing.T) {
	want := map[EngineKind]string{
		EngineOther: "other", EngineDocker: "docker", EnginePodman: "podman",
		EnginePodmanRootless: "podman-rootless", EngineKubernetes: "kubernetes", EngineKind(9): "EngineKind(9)",
	}
	for k, s := range want {
		if k.String() != s {
			t.Errorf("%d: %q, want %q", int(k), k.String(), s)
		}
		if k.Podman() != (k == EnginePodman || k == EnginePodmanRootless) {
			t.Errorf("%v.Podman() = %v", k, k.Podman())
		}
	}
	var zero Caps
	if zero.Engine != EngineOther || zero.NoResourceLimits {
		t.Errorf("zero Caps: %+v", zero)
	}
}
