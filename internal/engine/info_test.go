package engine

import (
	"testing"

	"github.com/docker/docker/api/types"
)

// What Docker 20.10, rootful Podman 4.3 and rootless Podman say of
// themselves (their version's components and info's security options and
// cgroup version, and Podman's Rootless, as this machine's engines answer).
func TestInfoOf(t *testing.T) {
	podman := types.Version{Arch: "amd64", Components: []types.ComponentVersion{
		{Name: "Podman Engine", Version: "4.3.1"}, {Name: "Conmon"}, {Name: "OCI Runtime (runc)"}}}
	docker := types.Version{Arch: "amd64", Components: []types.ComponentVersion{
		{Name: "Engine", Version: "20.10.24"}, {Name: "containerd"}, {Name: "runc"}, {Name: "docker-init"}}}
	for _, c := range []struct {
		name string
		v    types.Version
		si   SystemInfo
		want Info
	}{
		{"docker", docker, SystemInfo{CgroupVersion: "2", SecurityOptions: []string{"name=seccomp,profile=default", "name=cgroupns"}},
			Info{Arch: "amd64"}},
		{"docker rootless", docker, SystemInfo{CgroupVersion: "2", SecurityOptions: []string{"name=seccomp,profile=default", "name=rootless", "name=cgroupns"}},
			Info{Arch: "amd64", Rootless: true}},
		{"podman", podman, SystemInfo{CgroupVersion: "1", SecurityOptions: []string{"name=seccomp,profile=default"}},
			Info{Arch: "amd64", Podman: true, CgroupV1: true}},
		{"podman rootless", podman, SystemInfo{CgroupVersion: "1", SecurityOptions: []string{"name=seccomp,profile=default"}, Rootless: true},
			Info{Arch: "amd64", Podman: true, Rootless: true, CgroupV1: true}},
	} {
		if got := InfoOf(c.v, c.si); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
