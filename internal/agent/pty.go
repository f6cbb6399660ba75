//go:build linux

package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// openPTY makes a pseudo-terminal for a command of user uid:gid, of size
// and TERM t (checked by wire.CheckTTY). Both ends are opened by a file
// worker as that user (see workers), so that devpts makes the terminal the
// user's, as a login does, without CAP_CHOWN (which the agent gave up):
// the command can reopen it by its name. The command's end (the terminal
// proper) goes to fds, to be handed to the command; the agent's (the
// master, non-blocking) is returned, with the terminal's end-of-file
// character.
func (a *agent) openPTY(fds *pipes, uid, gid uint32, t wire.TTY) (*os.File, byte, error) {
	master, peer := -1, -1
	err := a.fs.as(fsID{uid, gid}, func() error {
		var err error
		master, err = unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/ptmx: %w", err)
		}
		if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlocking the terminal: %w", err)
		}
		peer, err = openPeer(master)
		return err
	})
	if err != nil {
		if master >= 0 {
			unix.Close(master)
		}
		if peer >= 0 {
			unix.Close(peer)
		}
		return nil, 0, fmt.Errorf("%s: %w", wire.NoPTY, err)
	}
	veof := byte(4) // C-d
	if tio, err := unix.IoctlGetTermios(peer, unix.TCGETS); err == nil && tio.Cc[unix.VEOF] != 0 {
		veof = tio.Cc[unix.VEOF]
	}
	ws := &unix.Winsize{Row: cmp.Or(t.Rows, wire.DefaultRows), Col: cmp.Or(t.Cols, wire.DefaultCols)}
	if err := unix.IoctlSetWinsize(master, unix.TIOCSWINSZ, ws); err != nil {
		unix.Close(master)
		unix.Close(peer)
		return nil, 0, fmt.Errorf("pseudo-terminal: setting its size: %w", err)
	}
	fds.child = append(fds.child, uintptr(peer))
	return pollable(master, "ptmx"), veof, nil
}

// openPeer opens the terminal of master: through TIOCGPTPEER where the
// kernel has it (no path to race on), else by its name in /dev/pts.
func openPeer(master int) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno == 0 {
		return int(fd), nil
	}
	n, err := unix.IoctlGetUint32(master, unix.TIOCGPTN)
	if err != nil {
		return -1, fmt.Errorf("the terminal's number: %w", err)
	}
	peer, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/pts/%d: %w", n, err)
	}
	return peer, nil
}

// errNotTTY is a Resize for a command without a terminal.
var errNotTTY = errors.New("not a PTY command")

// resize takes a Resize frame: the terminal of the command on its channel
// gets the size, and the kernel signals SIGWINCH to its foreground
// process group. Nothing is answered; a frame that does not decode, a
// size out of range and a channel without a PTY command are ignored.
func (a *agent) resize(f wire.Frame) error {
	var req wire.ResizeRequest
	if err := json.Unmarshal(f.Data, &req); err != nil {
		return err
	}
	if req.Rows == 0 || req.Cols == 0 || req.Rows > wire.MaxTTYSize || req.Cols > wire.MaxTTYSize {
		return fmt.Errorf("terminal size %d×%d out of range", req.Rows, req.Cols)
	}
	p := a.lookup(f.Channel)
	if p == nil || p.tty == nil {
		return errNotTTY
	}
	return setSize(p.tty, req.Rows, req.Cols)
}

// setSize sets the size of terminal t (its master side). The descriptor is
// used under the file's hold: a concurrent Close cannot hand its number to
// another file meanwhile.
func setSize(t *os.File, rows, cols uint16) error {
	rc, err := t.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
	return errors.Join(err, ioErr)
}

// ttyRecheck is how often the output of a PTY command whose process has
// exited is read without waiting for the poller (see recheckTTY).
const ttyRecheck = 100 * time.Millisecond

// recheckTTY reads the terminal t of command tag once without waiting,
// after a read deadline passed. Once a PTY command's process has exited,
// its terminal's output ends when the last process holding the terminal
// closes it (EIO on the master); gVisor's kernel neither tells the poller
// so nor ends the terminal while the session it controlled is remembered.
// So the output also ends once nothing is left to read and no process of
// the command is alive (a process of another command holding the
// terminal, handed over or opened by its name, is not waited for). It
// returns what it read, or (0, nil) with the deadline moved on when there
// is nothing yet.
func recheckTTY(t *os.File, tag uint32, b []byte) (int, error) {
	rc, err := t.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var rerr error
	if err := rc.Control(func(fd uintptr) { n, rerr = unix.Read(int(fd), b) }); err != nil {
		return 0, err
	}
	switch {
	case rerr == unix.EAGAIN || rerr == unix.EINTR:
		if !groupsInUse(os.Getpid())[tag] {
			return 0, io.EOF
		}
		return 0, t.SetReadDeadline(time.Now().Add(ttyRecheck))
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
