package seccomp

import (
	"os"
	"path/filepath"
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

// File writes the profile once, into a directory of this user's own, and
// refuses a directory of that name others may write.
func TestFile(t *testing.T) {
	dir := t.TempDir()
	p, err := File(dir, []byte(`{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != `{"a":1}` {
		t.Fatalf("%s: %q %v", p, b, err)
	}
	own := filepath.Dir(p)
	if fi, err := os.Stat(own); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory %s: %v %v", own, fi.Mode(), err)
	}
	if again, err := File(dir, []byte(`{"a":1}`)); err != nil || again != p {
		t.Errorf("the same profile again: %s %v, want %s", again, err, p)
	}
	if other, err := File(dir, []byte(`{"a":2}`)); err != nil || other == p {
		t.Errorf("another profile: %s %v", other, err)
	}
	os.Chmod(own, 0o777)
	if _, err := File(dir, []byte(`{"a":3}`)); err == nil {
		t.Error("a directory others may write was used")
	}
}
