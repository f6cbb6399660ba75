// Package term keeps the host side of a terminal: an emulated screen fed
// with a program's raw output, the text a model reads from it, and the
// bytes (keys typed, replies to the program's queries) that go back to the
// program's input.
//
// The emulator is github.com/charmbracelet/x/vt; this package bounds what
// it keeps and does (see harden) so that a program's output, however large
// or hostile, changes only the emulated screen and costs the host a bounded
// amount of memory and time: no scrollback, 64 KiB of sequence data, at
// most 256 bytes of characters in a cell, counts of repeated operations
// clamped to the screen. A screen costs about 240 bytes a cell (0.45 MiB at
// 24 × 80, 2.9 MiB at 60 × 200, 23 MiB at the largest, 200 × 500) and up to
// about 0.75 KiB a cell when every cell holds a long cluster of combining
// marks, plus 1 MiB for pending input and 1 MiB for each Tee writer.
package term

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"time"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// Screen sizes. New and Resize take rows and columns in
// [1, MaxRows] × [1, MaxCols].
const (
	DefaultRows = 24
	DefaultCols = 80
	MaxRows     = 200
	MaxCols     = 500
)

var (
	// ErrClosed is returned by the methods of a Screen after Close.
	ErrClosed = errors.New("term: screen closed")
	// ErrSize is returned for a screen size outside the bounds.
	ErrSize = errors.New("term: screen size out of bounds")
)

// Screen is an emulated terminal screen. Its methods are safe for
// concurrent use: one goroutine feeds the program's output with Write while
// others read the screen, wait on it, type keys and read Input.
type Screen struct {
	mu        sync.Mutex
	em        *vt.Emulator
	vt        *vtPrivate // the emulator's unexported fields; nil where vt's layout is not the one known
	rows      int
	cols      int
	appCursor bool // DECCKM: cursor keys send SS3 (ESC O) rather than CSI
	lnm       bool // LNM: a line feed is also a carriage return
	noWrap    bool // DECAWM reset: no wrap at the right margin
	origin    bool // DECOM: cursor addressing relative to the margins
	switched  bool // the program switched between main and alternate screen since the last check
	last      time.Time
	changed   chan struct{} // closed at the next change; nil while nobody waits
	closed    bool
	panics    int // times vt panicked on output (see feedSafely)

	in  input
	tee tee
}

// New returns a screen of rows × cols, cursor at the top left. A size of 0
// takes the default (24 × 80); sizes are clamped to [1, MaxRows] and
// [1, MaxCols]. Close it to end the goroutine that collects the emulator's
// replies.
func New(rows, cols int) *Screen {
	if rows == 0 {
		rows = DefaultRows
	}
	if cols == 0 {
		cols = DefaultCols
	}
	rows = min(max(rows, 1), MaxRows)
	cols = min(max(cols, 1), MaxCols)
	s := &Screen{
		rows: rows,
		cols: cols,
		last: time.Now(),
	}
	s.in.init()
	s.newEmulator()
	return s
}

// newEmulator gives s a new emulator of its size, hardened, its replies
// collected into Input.
func (s *Screen) newEmulator() {
	s.em = vt.NewEmulator(s.cols, s.rows)
	s.vt = nil
	s.appCursor, s.lnm, s.noWrap, s.origin, s.switched = false, false, false, false, false
	s.em.SetCallbacks(vt.Callbacks{
		EnableMode:  func(m ansi.Mode) { s.setMode(m, true) },
		DisableMode: func(m ansi.Mode) { s.setMode(m, false) },
		AltScreen:   func(bool) { s.switched = true },
	})
	harden(s)
	go s.collectReplies(s.em)
}

// closeEmulator ends the collection of the emulator's replies. Not
// Emulator.Close: it sets a field that Emulator.Read reads without a lock.
func (s *Screen) closeEmulator() {
	if pw, ok := s.em.InputPipe().(io.Closer); ok {
		pw.Close()
	}
}

// setMode follows the modes that change what keys send or what a line
// feed does.
func (s *Screen) setMode(m ansi.Mode, on bool) {
	switch m {
	case ansi.ModeCursorKeys:
		s.appCursor = on
	case ansi.ModeLineFeedNewLine:
		s.lnm = on
	case ansi.ModeAutoWrap:
		s.noWrap = !on
	case ansi.ModeOrigin:
		s.origin = on
	}
}

// CheckSize returns an error wrapping ErrSize unless rows and cols are in
// [1, MaxRows] × [1, MaxCols].
func CheckSize(rows, cols int) error {
	if rows < 1 || rows > MaxRows || cols < 1 || cols > MaxCols {
		return fmt.Errorf("%w: %d rows × %d columns; give 1–%d rows and 1–%d columns",
			ErrSize, rows, cols, MaxRows, MaxCols)
	}
	return nil
}

// Write feeds p, the program's output, to the emulator. It never fails
// before Close and does not wait for the readers of Input or Tee.
func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	s.tee.write(p)
	pos := s.em.CursorPosition()
	if !s.feedSafely(p) {
		s.changedLocked()
		return len(p), nil
	}
	// A write of nothing to the pipe of replies returns once
	// collectReplies reads again, so when it has queued all replies to p:
	// they are in Input before Write returns, ahead of any key typed after.
	s.em.InputPipe().Write(nil)
	changed := s.em.CursorPosition() != pos
	if s.switched {
		s.switched = false
		changed = true
	}
	// vt marks the lines it wrote a different cell to, erased or scrolled:
	// a change of what the screen shows. Unmark them for the next Write.
	touched := s.em.Touched()
	for i, t := range touched {
		if t != nil {
			changed = true
			touched[i] = nil
		}
	}
	if changed {
		s.changedLocked()
	}
	return len(p), nil
}

// WriteReplayed is Write for output the program wrote earlier, replayed to
// draw the screen it had (a terminal reattached): the emulator's replies
// to the queries in it are dropped, as the program is not asking now.
func (s *Screen) WriteReplayed(p []byte) (int, error) {
	s.in.mu.Lock()
	s.in.mute = true
	s.in.mu.Unlock()
	defer func() {
		s.in.mu.Lock()
		s.in.mute = false
		s.in.mu.Unlock()
	}()
	return s.Write(p) // its replies are all read before it returns
}

// feedSafely feeds p to the emulator. Should vt panic on it (a bug of vt's
// that harden does not stop yet), the emulator is replaced by a new, empty
// one of the same size, so that a program's output cannot crash the host,
// and feedSafely returns false.
func (s *Screen) feedSafely(p []byte) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			s.panics++
			s.closeEmulator()
			s.newEmulator()
			ok = false
		}
	}()
	s.feed(p)
	return true
}

// changedLocked records a change of the screen now and wakes the waiters.
func (s *Screen) changedLocked() {
	s.last = time.Now()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// Text returns the visible rows joined by "\n": trailing spaces of each row
// and trailing empty rows trimmed, no final newline. A wide character is
// one character in the text though it fills two cells.
func (s *Screen) Text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.textLocked()
}

func (s *Screen) textLocked() string {
	out := make([]byte, 0, s.rows*(s.cols+1))
	end := 0 // the end of the last row that is not empty
	for y := range s.rows {
		if y > 0 {
			out = append(out, '\n')
		}
		start := len(out)
		for x := range s.cols {
			c := s.em.CellAt(x, y)
			switch {
			case c == nil || c.IsZero():
				// The second cell of a wide character.
			case c.Content == "":
				out = append(out, ' ')
			default:
				out = append(out, c.Content...)
			}
		}
		for len(out) > start && out[len(out)-1] == ' ' {
			out = out[:len(out)-1]
		}
		if len(out) > start {
			end = len(out)
		}
	}
	return string(out[:end])
}

// Cursor returns the cursor's row and column, 0-based.
func (s *Screen) Cursor() (row, col int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.em.CursorPosition()
	return p.Y, p.X
}

// Size returns the screen's rows and columns.
func (s *Screen) Size() (rows, cols int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows, s.cols
}

// Resize sets the screen's size; it is an error wrapping ErrSize outside
// the bounds (see CheckSize). Columns are kept or cut at the right; rows
// at the bottom, but fewer rows than the cursor's keep the cursor's row
// and those above it, as xterm does (so a shell's prompt stays); the
// scroll margins are reset; a resize to the current size does nothing, as a
// terminal does not signal one. Only the host resizes: the program's
// requests (CSI 8 t, DECCOLM) are ignored.
func (s *Screen) Resize(rows, cols int) error {
	if err := CheckSize(rows, cols); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if rows == s.rows && cols == s.cols {
		return nil
	}
	s.keepCursorRow(rows)
	s.em.Resize(cols, rows)
	s.rows, s.cols = rows, cols
	s.changedLocked()
	return nil
}

// keepCursorRow scrolls the current screen up so that the cursor's row is
// within rows, when the screen is to have that few: vt's Resize cuts the
// rows at the bottom and puts the cursor on the last, leaving it on
// another row's text. The rows scrolled off are gone (no scrollback).
func (s *Screen) keepCursorRow(rows int) {
	if s.vt == nil {
		return
	}
	i := 0
	if s.em.IsAltScreen() {
		i = 1
	}
	_, y := s.vt.scrs[i].CursorPosition()
	k := y - rows + 1
	if k <= 0 {
		return
	}
	lines := s.vt.bufs[i].Lines
	gone := append([]uv.Line(nil), lines[:k]...)
	copy(lines, lines[k:])
	for j, l := range gone {
		for x := range l {
			l[x] = uv.EmptyCell
		}
		lines[len(lines)-k+j] = l
	}
}

// Wait returns nil once the screen has not changed for quiet, counted from
// its last change (so at once if it has been still that long already), or
// ctx.Err() if ctx ends first. A change is a cell that shows something
// else, a scroll, an erase, a move of the cursor, a switch between main and
// alternate screen, or a resize.
func (s *Screen) Wait(ctx context.Context, quiet time.Duration) error {
	for {
		s.mu.Lock()
		left := quiet - time.Since(s.last)
		s.mu.Unlock()
		if left <= 0 {
			return nil
		}
		// No change can end the wait earlier than this: sleep until then,
		// and look again (the deadline moves with each change).
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// WaitMatch returns nil once Text matches re (at once if it does already),
// ctx.Err() if ctx ends first, or ErrClosed if the screen is closed without
// matching.
func (s *Screen) WaitMatch(ctx context.Context, re *regexp.Regexp) error {
	for {
		s.mu.Lock()
		text := s.textLocked()
		closed := s.closed
		if s.changed == nil && !closed {
			s.changed = make(chan struct{})
		}
		changed := s.changed
		s.mu.Unlock()
		if re.MatchString(text) {
			return nil
		}
		if closed {
			return fmt.Errorf("%w before the screen matched %q", ErrClosed, re)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// Close ends the screen: Write, Type, Press and Resize return ErrClosed,
// Input reads io.EOF, WaitMatch returns. Text and Cursor keep showing the
// last screen. Close does not wait for a Tee writer (see Tee).
func (s *Screen) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.closeEmulator()
	s.mu.Unlock()
	s.in.close()
	s.tee.set(nil)
	return nil
}
