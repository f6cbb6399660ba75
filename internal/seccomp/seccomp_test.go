package seccomp

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The profile allows what programs and the agent need, refuses the removed
// calls and what needs capabilities the container lacks, and keeps
// Docker's argument filters.
func TestProfile(t *testing.T) {
	p := Profile("amd64")
	if p.DefaultAction != specs.ActErrno || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 1 {
		t.Errorf("default action %v, errno %v", p.DefaultAction, p.DefaultErrnoRet)
	}
	if !slices.Contains(p.Architectures, specs.ArchX86_64) || !slices.Contains(p.Architectures, specs.ArchX86) {
		t.Errorf("architectures %v", p.Architectures)
	}
	allowed := map[string]bool{}
	filtered := map[string]bool{}
	for _, s := range p.Syscalls {
		for _, n := range s.Names {
			if s.Action == specs.ActAllow && len(s.Args) == 0 {
				allowed[n] = true
			} else {
				filtered[n] = true
			}
		}
	}
	for _, n := range []string{"read", "openat2", "execve", "wait4", "capset", "setresuid", "setgroups", "pidfd_open", "arch_prctl", "ptrace", "shmget", "inotify_init1"} {
		if !allowed[n] {
			t.Errorf("%s not allowed", n)
		}
	}
	for _, n := range append(Removed, "mount", "unshare", "setns", "bpf", "perf_event_open", "keyctl", "reboot", "kexec_load", "open_by_handle_at", "chroot") {
		if allowed[n] {
			t.Errorf("%s allowed", n)
		}
	}
	for _, n := range []string{"clone", "socket", "personality", "clone3"} {
		if !filtered[n] {
			t.Errorf("%s has no rule of its own (argument filter or errno)", n)
		}
	}
	if a := Profile("arm64"); slices.Contains(a.Architectures, specs.ArchX86_64) || len(a.Architectures) == 0 {
		t.Errorf("arm64 architectures %v", a.Architectures)
	}
}
