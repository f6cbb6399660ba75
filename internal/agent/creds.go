//go:build linux

package main

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsID is the sandbox user a file operation runs as.
type fsID struct{ uid, gid uint32 }

// workers run file operations with the identity of the sandbox user, on
// OS threads of their own. Linux keeps credentials per thread (the C
// library and Go's syscall package change them on every thread; the raw
// system calls change only the caller's), so each worker is a goroutine
// locked to its thread for the agent's life, which takes on the effective
// user, group and supplementary groups a job asks for: every access it
// makes is checked as if a command of that user made it, and files it
// creates belong to that user. Its real and saved user stay root, so that
// it can change back, and so that the sandbox user cannot signal or trace
// it. Other threads of the agent keep root's identity. The threads are
// started with the agent, so that a sandbox that has used up its PIDs
// limit cannot keep file operations from running.
type workers struct {
	jobs chan job
}

type job struct {
	id   fsID
	fn   func() error
	done chan error
}

func startWorkers(n int) *workers {
	w := &workers{jobs: make(chan job)}
	ready := make(chan struct{})
	for range n {
		go w.run(ready)
		<-ready
	}
	return w
}

func (w *workers) run(ready chan<- struct{}) {
	runtime.LockOSThread() // never unlocked: the thread is this worker's
	cur := fsID{0, 0}
	ready <- struct{}{}
	for j := range w.jobs {
		if j.id != cur {
			if err := become(j.id); err != nil {
				j.done <- err
				continue
			}
			cur = j.id
		}
		j.done <- j.fn()
	}
}

// as runs fn on a worker with the file system identity id and returns its
// error. fn must not wait for anything but the file system: input and
// output travel outside it.
func (w *workers) as(id fsID, fn func() error) error {
	j := job{id: id, fn: fn, done: make(chan error, 1)}
	w.jobs <- j
	return <-j.done
}

// become gives the calling thread the effective identity id: back to
// root first (which restores its capabilities to act), then the
// supplementary groups (just id.gid), the group and the user. Real and
// saved IDs stay root.
func become(id fsID) error {
	const keep = ^uintptr(0) // -1: leave unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
		return fmt.Errorf("agent: setresuid(-1, 0, -1): %w", e)
	}
	groups := []uint32{id.gid}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 1, uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
		return fmt.Errorf("agent: setgroups(%d): %w", id.gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(id.gid), keep); e != 0 {
		return fmt.Errorf("agent: setresgid(-1, %d, -1): %w", id.gid, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(id.uid), keep); e != 0 {
		return fmt.Errorf("agent: setresuid(-1, %d, -1): %w", id.uid, e)
	}
	var r, e, s uint32
	unix.RawSyscall(unix.SYS_GETRESUID, uintptr(unsafe.Pointer(&r)), uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&s)))
	var gr, ge, gs uint32
	unix.RawSyscall(unix.SYS_GETRESGID, uintptr(unsafe.Pointer(&gr)), uintptr(unsafe.Pointer(&ge)), uintptr(unsafe.Pointer(&gs)))
	if e != id.uid || ge != id.gid {
		return fmt.Errorf("agent: cannot take on uid %d gid %d for file operations (have %d:%d)", id.uid, id.gid, e, ge)
	}
	return nil
}
