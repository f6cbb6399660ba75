// Package seccomp builds the library's seccomp profile: Docker's default
// (the moby project's current one, which is stricter than older engines'
// built-in profiles) resolved for a sandbox's container — whose only
// capabilities are the agent's, none of which unlocks a rule — minus
// system calls that code in a sandbox has no use for and that have been
// the way into kernel exploits. Every container gets it, whatever profile
// its engine would apply by default. It is public so that a backend in
// another module applies the same profile (the Kubernetes backend's
// SeccompProfile renders it for the nodes).
//
// Left out beyond Docker's current default, and why:
//
//   - io_uring_setup, io_uring_enter, io_uring_register: a second path
//     into the kernel that carries file and network operations past the
//     system call filter, and the source of a long run of kernel
//     vulnerabilities; runtimes fall back to ordinary system calls. (Docker
//     20.10's built-in profile allows them.)
//   - userfaultfd: lets code stall the kernel on a page fault, used to widen
//     race windows in exploits. (Allowed by Docker 20.10's built-in
//     profile.)
//   - modify_ldt: 16-bit segment descriptors, for DOS and Wine; a history of
//     kernel bugs.
//   - remap_file_pages: deprecated since Linux 3.16 and emulated.
//
// Refused system calls fail with EPERM (clone3, as in Docker's, with ENOSYS,
// so that C libraries fall back to clone).
//
// Under gVisor (WithRuntime("runsc")) the code's system calls are answered
// by gVisor's own kernel, not the host's, and runsc applies an OCI profile
// only when run with --oci-seccomp, which its Debian 12 release cannot
// honour: it answers clone3 with EPERM instead of the profile's ENOSYS, and
// the C library then cannot start threads. So the profile is given but not
// in force there; the host kernel's io_uring and userfaultfd stay out of
// reach all the same.
package seccomp

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Removed are the system calls the profile refuses beyond Docker's current
// default (see the package documentation).
var Removed = []string{"io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "modify_ldt", "remap_file_pages"}

// Profile returns the profile for containers on an engine of architecture
// arch (Go's name: "amd64", "arm64").
func Profile(arch string) *specs.LinuxSeccomp {
	def := moby.DefaultProfile()
	errno := uint(1) // EPERM
	p := &specs.LinuxSeccomp{DefaultAction: def.DefaultAction, DefaultErrnoRet: &errno}
	native := map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}[arch]
	for _, m := range def.ArchMap {
		if m.Arch == native {
			p.Architectures = append([]specs.Arch{m.Arch}, m.SubArches...)
		}
	}
	for _, s := range def.Syscalls {
		if !applies(s, arch) {
			continue
		}
		names := slices.DeleteFunc(slices.Clone(s.Names), func(n string) bool { return slices.Contains(Removed, n) })
		if len(names) == 0 {
			continue
		}
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: names, Action: s.Action, ErrnoRet: s.ErrnoRet, Args: s.Args})
	}
	return p
}

// applies reports whether a rule of Docker's profile holds for a sandbox's
// container on arch: rules that need a capability do not (the container has
// none of those), rules excluded by one do; rules for other architectures
// do not; a minimum kernel (4.8, for ptrace) is taken as met.
func applies(s *moby.Syscall, arch string) bool {
	if s.Includes != nil {
		if len(s.Includes.Caps) > 0 {
			return false
		}
		if len(s.Includes.Arches) > 0 && !slices.Contains(s.Includes.Arches, arch) {
			return false
		}
	}
	if s.Excludes != nil && len(s.Excludes.Arches) > 0 && slices.Contains(s.Excludes.Arches, arch) {
		return false
	}
	return true
}

// File writes the encoded profile into a directory of this user's own
// (dir/agentsandbox-UID, mode 0700) under a name of its content's hash, if
// no such file is there yet, and returns its path: Podman's
// Docker-compatible API takes a profile as a path on the engine's host,
// where Docker's takes the profile itself. A directory of that name that
// is not this user's own, or that others may write, is refused: whoever
// could write the profile could loosen it.
func File(dir string, encoded []byte) (string, error) {
	own := filepath.Join(dir, fmt.Sprintf("agentsandbox-%d", os.Getuid()))
	if err := os.Mkdir(own, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(own)
	if err != nil {
		return "", err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("%s is not a directory of this user's own that only it may write", own)
	}
	sum := sha256.Sum256(encoded)
	p := filepath.Join(own, "seccomp-"+hex.EncodeToString(sum[:8])+".json")
	if b, err := os.ReadFile(p); err == nil && bytes.Equal(b, encoded) {
		return p, nil
	}
	f, err := os.CreateTemp(own, "seccomp-*.tmp")
	if err != nil {
		return "", err
	}
	_, err = f.Write(encoded)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), p) // atomic: a reader sees all or nothing
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return p, nil
}
