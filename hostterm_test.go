package sandbox

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/term"
)

// OpenHostPTY opens a pseudo-terminal on the host of rows × cols: its
// master and its slave.
func OpenHostPTY(rows, cols int) (master, slave *os.File, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		m.Close()
		s.Close()
		return nil, nil, err
	}
	return m, s, nil
}

// StartHostPTY starts args on a new host pseudo-terminal of rows × cols,
// as the session leader with it as controlling terminal, and returns the
// command and the master.
func StartHostPTY(rows, cols int, env []string, args ...string) (*exec.Cmd, *os.File, error) {
	m, s, err := OpenHostPTY(rows, cols)
	if err != nil {
		return nil, nil, err
	}
	c := exec.Command(args[0], args[1:]...)
	c.Env = append([]string{"TERM=xterm-256color", "PATH=" + os.Getenv("PATH"), "HOME=/tmp"}, env...)
	c.Stdin, c.Stdout, c.Stderr = s, s, s
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = c.Start()
	s.Close()
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return c, m, nil
}

// NewHostTerminal runs args on a pseudo-terminal of the host behind a
// Terminal, as Sandbox.Terminal runs them in a sandbox: to test what the
// Terminal does on its own, and as the floor of its benchmarks.
func NewHostTerminal(args ...string) (*Terminal, error) {
	c, m, err := StartHostPTY(term.DefaultRows, term.DefaultCols, nil, args...)
	if err != nil {
		return nil, err
	}
	scr := term.New(term.DefaultRows, term.DefaultCols)
	stop := func() { killSession(c.Process.Pid) }
	resize := func(rows, cols int) error {
		return unix.IoctlSetWinsize(int(m.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)})
	}
	t := newTerminal(scr, args, context.CancelFunc(stop))
	t.resize, t.id = resize, func() string { return "host-" + strconv.Itoa(c.Process.Pid) }
	go io.Copy(m, scr.Input())
	go func() {
		io.Copy(t.out, m) // EIO once no process holds the terminal
		err := c.Wait()
		m.Close()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code := ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			err = &ExitError{Code: code}
		}
		t.ended(err)
	}()
	return t, nil
}

// killSession kills every process of the session sid (a job control shell
// puts its jobs in process groups of their own).
func killSession(sid int) {
	for range 100 {
		n := 0
		stats, _ := filepath.Glob("/proc/[0-9]*/stat")
		for _, st := range stats {
			pid, state, session, ok := procStat(st)
			if ok && session == sid && state != "Z" {
				syscall.Kill(pid, syscall.SIGKILL)
				n++
			}
		}
		if n == 0 {
			return
		}
	}
}

// procStat reads a process's pid, state and session from its stat file.
func procStat(name string) (pid int, state string, session int, ok bool) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, "", 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", 0, false
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp session ...
	if len(f) < 4 {
		return 0, "", 0, false
	}
	pid, _ = strconv.Atoi(strings.Fields(s)[0])
	session, _ = strconv.Atoi(f[3])
	return pid, f[0], session, true
}

// Zombie reports whether the host process pid is a zombie (or gone).
func Zombie(pid int) bool {
	_, state, _, ok := procStat("/proc/" + strconv.Itoa(pid) + "/stat")
	return !ok || state == "Z"
}

// HostSessionRuns reports whether a process of the host terminal term's
// session has the command line args.
func HostSessionRuns(term *Terminal, args ...string) bool {
	sid, err := strconv.Atoi(strings.TrimPrefix(term.ID(), "host-"))
	if err != nil {
		return false
	}
	want := strings.Join(args, "\x00") + "\x00"
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		_, state, session, ok := procStat(st)
		if !ok || session != sid || state == "Z" {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(st), "cmdline")); err == nil && string(b) == want {
			return true
		}
	}
	return false
}
