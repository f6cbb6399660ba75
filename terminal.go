package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/term"
)

// Errors of a Terminal. Test for them with errors.Is.
var (
	// ErrTerminalClosed is returned by the methods of a Terminal that act
	// on it (Type, Press, Resize, WaitMatch) after its Close.
	ErrTerminalClosed = errors.New("sandbox: terminal closed")

	// ErrTerminalEnded is returned by Type, Press and Resize once the
	// terminal's program has ended (its output too), and by WaitMatch when
	// it ends without the screen matching. The screen still shows what the
	// program left on it; Err says how it ended.
	ErrTerminalEnded = errors.New("sandbox: the terminal's program has ended")

	// ErrUnknownKey is returned by Terminal.Press for a key name it does
	// not know; the error lists the names it knows.
	ErrUnknownKey = term.ErrUnknownKey

	// ErrInputFull is returned by Terminal.Type and Press when the program
	// does not read what was typed: 1 MiB of it waits already. Nothing of
	// the call's text or keys was added.
	ErrInputFull = term.ErrInputFull

	// ErrTerminalSize is returned by Terminal.Resize for a size outside
	// 1–200 rows and 1–500 columns.
	ErrTerminalSize = term.ErrSize
)

// TerminalKeys describes the key names Terminal.Press knows.
const TerminalKeys = term.KeyNames

// Terminal is a program running on a pseudo-terminal in the sandbox, with
// a terminal emulator on the host side: Screen is the text the program
// shows, as a person would see it, Type and Press send text and keys, Wait
// and WaitMatch wait for the screen to settle or to show something. It is
// made for models that work a terminal (a shell, an editor, a REPL, an
// installer that asks questions) and for tests of interactive programs.
//
// The screen starts at 24 × 80; TERM is xterm-256color. Only the emulated
// screen is changed by the program's output: escape sequences it writes
// (titles, clipboard, queries, resizes) never reach the host's terminal,
// and the emulator keeps no scrollback, so a flood of output of any size
// costs the host a bounded amount of memory (a few MiB: see Screen) and
// leaves its last screenful on the screen.
//
// Limits.ExecTimeout does not end a Terminal: Close, the sandbox's
// Lifetime and its Close do. Its methods are safe for concurrent use.
type Terminal struct {
	scr    *term.Screen
	out    *outQueue // the program's output, on its way to scr
	cmd    *Cmd
	args   []string
	resize func(rows, cols int) error // of the program's terminal
	id     func() string
	stop   context.CancelFunc // kills the program and everything it started
	done   chan struct{}      // closed when the program and its output ended
	err    error              // how it ended; set before done is closed

	mu     sync.Mutex
	closed bool
}

// Terminal starts args on a pseudo-terminal in the sandbox, in its working
// directory as its user, and returns once it runs. With no args it starts
// the image's shell: the login shell of the sandbox's user in the image's
// /etc/passwd, or sh. ctx bounds the start only; the program runs until it
// ends, Close ends it, or the sandbox ends. Whichever comes first, every
// process it started ends with it (those that left its session or ignore
// SIGHUP too).
func (s *Sandbox) Terminal(ctx context.Context, args ...string) (*Terminal, error) {
	if ctx == nil {
		return nil, errors.New("sandbox: nil Context")
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if len(args) == 0 {
		args = []string{s.loginShell(ctx)}
	} else if args[0] == "" {
		return nil, errors.New("sandbox: Terminal: empty program name")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	scr := term.New(term.DefaultRows, term.DefaultCols)
	// The program's run is not bounded by ctx, nor by ExecTimeout: by
	// Close (stop) and the sandbox's end. Its values are kept.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c := s.Command(runCtx, args[0], args[1:]...)
	c.noTimeout, c.keep, c.group = true, true, true
	c.TTY = &TTY{Rows: term.DefaultRows, Cols: term.DefaultCols, Term: "xterm-256color"}
	t := newTerminal(scr, args, stop)
	c.Stdin = scr.Input()
	c.Stdout = t.out
	// ctx ending during the start kills what started.
	unhook := context.AfterFunc(ctx, stop)
	err := c.Start()
	unhook()
	if err != nil {
		stop()
		t.ended(err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox: Terminal: %w", ctx.Err())
		}
		return nil, fmt.Errorf("sandbox: Terminal: %w", err)
	}
	t.cmd, t.resize, t.id = c, c.Resize, c.ID
	go func() {
		t.ended(c.Wait())
	}()
	if ctx.Err() != nil {
		t.Close()
		return nil, fmt.Errorf("sandbox: Terminal: %w", ctx.Err())
	}
	return t, nil
}

// AttachTerminal attaches to a terminal of a leased sandbox by its ID (see
// Sessions, Terminal.ID): one started by Sandbox.Terminal (or a Cmd with
// a TTY) in this process or another, which kept running when that process
// detached or died. The new Terminal's screen (24 × 80) is drawn from the
// output the sandbox kept while no process was attached (at most
// SessionBuffer bytes; if older output was dropped, a line on the screen
// says how many bytes), then goes on live. The program's terminal is
// resized to the screen's size, which sends it SIGWINCH, so a full-screen
// program (an editor, top) redraws its screen; what a shell printed while
// a process was attached is not kept, so its earlier lines are not shown. Attaching a terminal another Terminal holds takes it
// over: that one ends (Err is ErrTakenOver). ctx bounds the attach only,
// as Terminal's start: if it ends first, the program is killed. An ID
// that names no session, or a command without a terminal, is ErrNoSession.
func (s *Sandbox) AttachTerminal(ctx context.Context, id string) (*Terminal, error) {
	if ctx == nil {
		return nil, errors.New("sandbox: nil Context")
	}
	sess, err := s.session(ctx, id)
	if err != nil {
		return nil, err
	}
	if !sess.Terminal {
		return nil, fmt.Errorf("%w: %q is a command without a terminal (see AttachCommand)", ErrNoSession, id)
	}
	scr := term.New(term.DefaultRows, term.DefaultCols)
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	t := newTerminal(scr, sess.Args, stop)
	unhook := context.AfterFunc(ctx, stop)
	c, err := s.attach(runCtx, id, scr.Input(), t.out, nil)
	unhook()
	if err != nil {
		stop()
		t.ended(err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("sandbox: AttachTerminal: %w", ctx.Err())
		}
		return nil, fmt.Errorf("sandbox: AttachTerminal: %w", err)
	}
	t.cmd, t.resize, t.id = c, c.Resize, c.ID
	go func() {
		t.ended(c.Wait())
	}()
	if ctx.Err() != nil {
		t.Close()
		return nil, fmt.Errorf("sandbox: AttachTerminal: %w", ctx.Err())
	}
	// The kernel signals a resize only when the size changes: through
	// another size to the screen's, so that the program redraws whatever
	// its size was.
	rows, cols := scr.Size()
	if err := c.Resize(rows, cols+1); err == nil {
		c.Resize(rows, cols)
	}
	return t, nil
}

// newTerminal returns the Terminal of a program whose output is to go to
// t.out and input come from scr.Input(); stop must kill it. Set resize and
// id once it runs, and call ended with how it ended once its output is all
// written to t.out (or when it could not start).
func newTerminal(scr *term.Screen, args []string, stop context.CancelFunc) *Terminal {
	return &Terminal{
		scr:  scr,
		out:  newOutQueue(scr),
		args: append([]string(nil), args...),
		stop: stop,
		done: make(chan struct{}),
	}
}

// ended records how the program ended, once its output is all on the
// screen, closes Done, then closes the screen, which keeps showing its
// last state: the goroutines that fed the program's input end. Done
// first: a wait that the screen's end returns (WaitMatch, Wait) finds
// the program ended and Err set.
func (t *Terminal) ended(err error) {
	t.out.finish()
	t.err = err
	close(t.done)
	t.scr.Close()
}

// loginShell returns the login shell of the sandbox's user in the image's
// /etc/passwd, or "sh" if there is none to be found, it is not an
// absolute path, or it refuses logins (nologin, false).
func (s *Sandbox) loginShell(ctx context.Context) string {
	const fallback = "sh"
	rctx, cancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer cancel()
	data, err := s.readFile(rctx, "/etc/passwd")
	if err != nil {
		return fallback
	}
	uid := strconv.Itoa(s.uid)
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := bytes.Split(bytes.TrimRight(line, "\r"), []byte(":"))
		if len(f) != 7 || string(f[2]) != uid {
			continue
		}
		sh := string(f[6])
		switch base := path.Base(sh); {
		case !path.IsAbs(sh) || sh != path.Clean(sh), base == "nologin", base == "false":
			return fallback
		}
		return sh
	}
	return fallback
}

// check returns ErrTerminalClosed after Close, ErrTerminalEnded once the
// program has ended.
func (t *Terminal) check() error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return ErrTerminalClosed
	}
	select {
	case <-t.done:
		return t.endedErr()
	default:
	}
	return nil
}

func (t *Terminal) endedErr() error {
	if t.err == nil {
		return fmt.Errorf("%w (exit status 0)", ErrTerminalEnded)
	}
	return fmt.Errorf("%w (%v)", ErrTerminalEnded, t.err)
}

// closedErr turns the screen's ErrClosed into ErrTerminalClosed.
func (t *Terminal) closedErr(err error) error {
	if errors.Is(err, term.ErrClosed) {
		return ErrTerminalClosed
	}
	return err
}

// Type sends text to the program as typed, byte for byte: "\r" is the
// Enter key, "\n" a line feed (C-j), "\x03" C-c. Nothing is added to or
// translated in it. It returns once the text is queued for the program,
// not once the program has read it: Wait or WaitMatch for its answer.
func (t *Terminal) Type(text string) error {
	if err := t.check(); err != nil {
		return err
	}
	return t.closedErr(t.scr.Type(text))
}

// Press sends the named keys to the program, in order (TerminalKeys lists
// the names: Enter, Tab, Escape, Backspace, Up, Down, Left, Right, Home,
// End, PageUp, PageDown, F1–F12, C-a … C-z, M-x and a few more). Cursor
// keys follow the mode the program set (normal or application). An unknown
// name is an error wrapping ErrUnknownKey, and no key is sent.
func (t *Terminal) Press(keys ...string) error {
	if err := t.check(); err != nil {
		return err
	}
	return t.closedErr(t.scr.Press(keys...))
}

// Screen returns the text on the screen: its visible rows joined by "\n",
// trailing spaces of each row and trailing empty rows trimmed, no final
// newline. A wide character is one character of the text. After the
// program's end and after Close it keeps showing the last screen.
func (t *Terminal) Screen() string { return t.scr.Text() }

// Cursor returns the cursor's row and column, 0-based.
func (t *Terminal) Cursor() (row, col int) { return t.scr.Cursor() }

// Size returns the screen's rows and columns.
func (t *Terminal) Size() (rows, cols int) { return t.scr.Size() }

// Wait returns nil once the screen has not changed for quiet, counted from
// its last change (so at once if it has been still that long), or
// ctx.Err() if ctx ends first. A change is anything that shows: a cell's
// character, a scroll, an erase, a move of the cursor, a switch to or from
// the alternate screen, a resize. It is how to wait for a program's answer
// of unknown form; WaitMatch waits for a known one.
func (t *Terminal) Wait(ctx context.Context, quiet time.Duration) error {
	return t.scr.Wait(ctx, quiet)
}

// WaitMatch returns nil once the screen's text (see Screen) matches re, at
// once if it does already; ctx.Err() if ctx ends first; an error wrapping
// ErrTerminalEnded if the program ends (Done is closed and Err says how
// by then), or ErrTerminalClosed if the terminal is closed, without the
// screen matching.
func (t *Terminal) WaitMatch(ctx context.Context, re *regexp.Regexp) error {
	if re == nil {
		return errors.New("sandbox: Terminal.WaitMatch: nil regexp")
	}
	// The screen is closed when the program ends (see ended).
	err := t.scr.WaitMatch(ctx, re)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	// The program ended, its output all on the screen, or Close came.
	if re.MatchString(t.scr.Text()) {
		return nil
	}
	if t.isClosed() {
		return fmt.Errorf("%w before the screen matched %q", ErrTerminalClosed, re)
	}
	return fmt.Errorf("%w before the screen matched %q", t.endedErr(), re)
}

func (t *Terminal) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Tee has the program's raw output, from now on, also written to w (nil:
// no longer), escape sequences and all, as it comes: to record a session
// or show it on a real terminal. A slow w never holds the program up: 1
// MiB of output waits for it, and what finds that full is dropped. w gets
// the output until the next Tee or Close.
func (t *Terminal) Tee(w io.Writer) { t.scr.Tee(w) }

// Resize sets the screen's size and the program's terminal's, which sends
// it SIGWINCH; rows in 1–200, columns in 1–500 (else an error wrapping
// ErrTerminalSize). A resize to the current size does nothing.
func (t *Terminal) Resize(rows, cols int) error {
	if err := term.CheckSize(rows, cols); err != nil {
		return err
	}
	if err := t.check(); err != nil {
		return err
	}
	if r, c := t.scr.Size(); r == rows && c == cols {
		return nil
	}
	// The screen first: what the program draws for its new size lands on
	// a screen of that size.
	if err := t.scr.Resize(rows, cols); err != nil {
		return t.closedErr(err)
	}
	if err := t.resize(rows, cols); err != nil {
		if cerr := t.check(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("sandbox: Terminal.Resize: %w", err)
	}
	return nil
}

// ID returns the terminal's session ID in the sandbox (see Sessions and
// AttachTerminal).
func (t *Terminal) ID() string {
	if t.id == nil {
		return ""
	}
	return t.id()
}

// Args returns the program and its arguments.
func (t *Terminal) Args() []string { return append([]string(nil), t.args...) }

// Done returns a channel closed once the program has ended and all its
// output is on the screen (a program that leaves a process holding the
// terminal ends with that process).
func (t *Terminal) Done() <-chan struct{} { return t.done }

// Err returns how the program ended, once Done is closed: nil for exit
// status 0, an *ExitError for another (after Close: killed, 137), or the
// sandbox's failure. It returns nil while the program runs.
func (t *Terminal) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Close ends the terminal: the program and every process it started are
// killed (as when its Cmd's context ends), and Close returns once they are
// gone. The screen keeps showing what was last on it; the methods that act
// return ErrTerminalClosed. Close can be called more than once; it returns
// nil unless the sandbox failed while it waited.
func (t *Terminal) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		<-t.done
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.stop()
	<-t.done
	t.scr.Close() // (ended closes it right after Done)
	var ee *ExitError
	if t.err == nil || errors.As(t.err, &ee) || errors.Is(t.err, ErrTakenOver) {
		return nil
	}
	return fmt.Errorf("sandbox: Terminal.Close: %w", t.err)
}
