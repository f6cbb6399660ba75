package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// TTY asks for a command to run on a pseudo-terminal (see Cmd.TTY). Zero
// fields take the defaults: 24 rows, 80 columns, TERM xterm-256color.
type TTY struct {
	Rows, Cols int    // the terminal's size: 1 to MaxTTYSize each; 0 for the default
	Term       string // the command's TERM: a plain name (letters, digits, '-', '.', '+'...)
}

// MaxTTYSize is the most rows, and the most columns, a terminal may have.
const MaxTTYSize = wire.MaxTTYSize

// Errors of PTY commands.
var (
	// ErrNoTTY is returned by Cmd.Resize for a command without a TTY.
	ErrNoTTY = errors.New("sandbox: the command has no terminal (Cmd.TTY)")
	// ErrNotStarted is returned by Cmd.Resize before Start.
	ErrNotStarted = errors.New("sandbox: the command has not started")
	// ErrBadTTY is returned by Start and Resize for a terminal size out of
	// range (below 1 or above MaxTTYSize, once the defaults are applied)
	// or a TERM that is not a plain name.
	ErrBadTTY = errors.New("sandbox: invalid terminal settings")
	// ErrTTYStderr is returned by Start for a command with a TTY and a
	// Stderr: a terminal merges its output into Stdout.
	ErrTTYStderr = errors.New("sandbox: Cmd.Stderr set with Cmd.TTY (a terminal's output, stderr included, goes to Stdout)")
	// ErrTTYUnsupported is returned by Start when the sandbox cannot make
	// a pseudo-terminal (its /dev/pts missing or unusable); the error says
	// what failed.
	ErrTTYUnsupported = errors.New("sandbox: the sandbox cannot make a pseudo-terminal")
)

// request checks t and returns it as the agent takes it.
func (t *TTY) request() (*wire.TTY, error) {
	if t.Rows < 0 || t.Cols < 0 || t.Rows > MaxTTYSize || t.Cols > MaxTTYSize {
		return nil, fmt.Errorf("%w: size %d×%d (1 to %d each, 0 for the default)", ErrBadTTY, t.Rows, t.Cols, MaxTTYSize)
	}
	w := &wire.TTY{
		Rows: uint16(cmp.Or(t.Rows, wire.DefaultRows)),
		Cols: uint16(cmp.Or(t.Cols, wire.DefaultCols)),
		Term: cmp.Or(t.Term, wire.DefaultTerm),
	}
	if err := wire.CheckTTY(*w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadTTY, strings.TrimPrefix(err.Error(), "wire: "))
	}
	return w, nil
}

// Resize sets the size of the command's terminal; the kernel sends
// SIGWINCH to the terminal's foreground process group, as a terminal
// window's resize does. It returns once the request is sent (the agent
// applies requests in order: input written after Resize returns sees the
// new size). rows and cols must be 1 to MaxTTYSize (else ErrBadTTY). Before
// Start it returns ErrNotStarted, for a command without TTY ErrNoTTY; once
// the command has exited it does nothing and returns nil (the exit and a
// resize may cross).
func (c *Cmd) Resize(rows, cols int) error {
	if c.TTY == nil {
		return ErrNoTTY
	}
	if rows < 1 || cols < 1 || rows > MaxTTYSize || cols > MaxTTYSize {
		return fmt.Errorf("%w: size %d×%d (1 to %d each)", ErrBadTTY, rows, cols, MaxTTYSize)
	}
	p := c.proc
	if p == nil {
		return ErrNotStarted
	}
	select {
	case <-p.Exited():
		return nil
	default:
	}
	if err := p.Resize(uint16(rows), uint16(cols)); err != nil {
		if c.sb.agent.Err() != nil {
			return c.sb.initErr("resize", err)
		}
		return fmt.Errorf("sandbox: resize: %w", err)
	}
	return nil
}

// ID returns the command's ID once Start has returned: the sandbox's
// name for it, unique among the sandbox's commands (of every process that
// opened it). It is "" before Start.
func (c *Cmd) ID() string {
	if c.proc == nil {
		return ""
	}
	return c.proc.ID
}

// ttyFailure maps the agent's refusal to make a terminal to
// ErrTTYUnsupported.
func ttyFailure(err error) error {
	if err != nil && strings.Contains(err.Error(), wire.NoPTY) {
		return fmt.Errorf("%w: %v", ErrTTYUnsupported, err)
	}
	return err
}
