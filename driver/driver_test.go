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
