//go:build linux

package main

import (
	"os"
	"syscall"
	"time"
)

// freezeWait bounds how long freeze waits for processes it signalled to
// stop (one in an uninterruptible sleep stops only when it wakes).
const freezeWait = 2 * time.Second

// freeze stops every process but self with SIGSTOP, scanning /proc until
// a scan finds none still running, and returns the processes it stopped
// (not those stopped before it came), for thaw. A process that forks
// while it is being stopped has its child stopped in a later scan; a
// stopped process forks no more, so even a fork bomb is stopped in a few
// scans. No command starts meanwhile: the caller holds a.freezing.
func freeze(self int) []int {
	stopped := map[int]bool{}
	var order []int
	buf := make([]byte, 8<<10)
	deadline := time.Now().Add(freezeWait)
	for range maxRounds {
		running, fresh := 0, 0
		for _, pid := range pids(self) {
			st, ok := readStatus(pid, buf)
			if !ok {
				continue
			}
			f := statusFields(st)
			if f.gone() || f.state == 'T' || f.state == 't' {
				continue
			}
			running++
			if stopped[pid] {
				continue // signalled, not stopped yet
			}
			if syscall.Kill(pid, syscall.SIGSTOP) == nil {
				stopped[pid] = true
				order = append(order, pid)
				fresh++
			}
		}
		if running == 0 || (fresh == 0 && time.Now().After(deadline)) {
			break
		}
		if fresh == 0 {
			time.Sleep(time.Millisecond) // the signals take effect
		}
	}
	return order
}

// thaw resumes the processes freeze stopped.
func thaw(pids []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// capture stops every other process of the sandbox, writes a tar archive
// of directory p's contents to out (see writeTar), and resumes them, also
// when the archive fails or the library aborts it.
func (a *agent) capture(id fsID, p string, limit int64, out *opOutput) (*skipped, error) {
	a.freezing.Lock()
	defer a.freezing.Unlock()
	frozen := freeze(os.Getpid())
	defer thaw(frozen)
	var sk *skipped
	err := a.fs.as(id, func() error {
		var err error
		sk, err = writeTarContents(out, p, limit, id.uid)
		return err
	})
	return sk, err
}
