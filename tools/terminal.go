package tools

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox"
)

// Bounds of the terminal tool's waits.
const (
	// terminalQuiet is how long the screen must stay still for a call to
	// return without wait_for.
	terminalQuiet = 300 * time.Millisecond
	// terminalWait bounds a call's wait when it gives no timeout (and the
	// Set no default).
	terminalWait = 10 * time.Second
	// terminalMaxWait bounds the timeout a call may ask for: a model that
	// waits longer should look at the screen meanwhile.
	terminalMaxWait = 10 * time.Minute
)

// terminal runs a terminal call: the Set's terminal (started on the first
// call, and again after its program ended or a restart), the text typed,
// the keys pressed, a wait, and the screen shown.
func (t *Set) terminal(ctx context.Context, c terminalCall) (string, error) {
	t.termMu.Lock()
	defer t.termMu.Unlock()
	var notes []string
	fresh := false
	if c.restart && t.term != nil {
		t.term.Close()
		t.term = nil
		notes = append(notes, "the terminal was closed, with every process it started; a new shell started")
	}
	if t.term != nil {
		select {
		case <-t.term.Done():
			notes = append(notes, "the terminal's program had ended ("+exitText(t.term.Err())+"); a new shell started")
			t.term.Close()
			t.term = nil
		default:
		}
	}
	if t.term == nil {
		term, err := t.sb.Terminal(ctx)
		if err != nil {
			if isInfra(ctx, err) {
				return "", fmt.Errorf("tools: %s: %w", Terminal, err)
			}
			return fmt.Sprintf("Error: the terminal could not start: %v", err), nil
		}
		t.term = term
		fresh = true
	}
	term := t.term

	typed := time.Now()
	if c.text != "" {
		if err := term.Type(strings.ReplaceAll(c.text, "\n", "\r")); err != nil {
			return t.terminalErr(ctx, "typing the text", err, notes)
		}
	}
	if len(c.keys) > 0 {
		if err := term.Press(c.keys...); err != nil {
			return t.terminalErr(ctx, "pressing the keys", err, notes)
		}
	}

	wait := c.timeout
	if wait == 0 {
		wait = t.defTimeout
	}
	if wait <= 0 || (c.waitFor == nil && wait > terminalWait) {
		wait = terminalWait
	}
	wait = min(wait, terminalMaxWait)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var err error
	if fresh {
		// A new shell: its prompt first, then what was typed counts.
		err = term.WaitMatch(wctx, anything)
	}
	switch {
	case err != nil:
	case c.waitFor != nil:
		err = term.WaitMatch(wctx, c.waitFor)
	default:
		err = settle(wctx, term, typed)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return renderScreen(term, notes), fmt.Errorf("tools: %s: %w", Terminal, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) && c.waitFor != nil:
		notes = append(notes, fmt.Sprintf("the screen did not match %q within %s", c.waitFor, seconds(wait)))
	case errors.Is(err, context.DeadlineExceeded):
		notes = append(notes, fmt.Sprintf("the screen was still changing after %s", seconds(wait)))
	case errors.Is(err, sandbox.ErrTerminalEnded) && c.waitFor != nil:
		notes = append(notes, fmt.Sprintf("the screen did not match %q", c.waitFor))
	case errors.Is(err, sandbox.ErrTerminalEnded):
	default:
		return "", fmt.Errorf("tools: %s: %w", Terminal, err)
	}
	select {
	case <-term.Done():
		notes = append(notes, "the terminal's program has ended ("+exitText(term.Err())+"); the next call starts a new shell")
	default:
	}
	return renderScreen(term, notes), nil
}

// anything matches a screen that shows something.
var anything = regexp.MustCompile(`\S`)

// settle waits until the screen has been still for terminalQuiet, counted
// from its last change or from since, whichever is later: the program
// gets that long to answer what was typed at since before a screen that
// was still already counts as settled.
func settle(ctx context.Context, term *sandbox.Terminal, since time.Time) error {
	if d := terminalQuiet - time.Since(since); d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		case <-term.Done():
			tm.Stop()
			return nil
		case <-tm.C:
		}
	}
	return term.Wait(ctx, terminalQuiet)
}

// terminalErr is the result of a Type or Press that failed.
func (t *Set) terminalErr(ctx context.Context, what string, err error, notes []string) (string, error) {
	switch {
	case errors.Is(err, sandbox.ErrUnknownKey):
		return mistakef("%s", strings.TrimPrefix(err.Error(), "term: ")).Error(), nil
	case errors.Is(err, sandbox.ErrInputFull):
		return "Error: the program is not reading its input: 1 MiB of typed text waits already. " +
			"Look at the screen, press C-c to interrupt it, or restart the terminal.\n" + renderScreen(t.term, notes), nil
	case errors.Is(err, sandbox.ErrTerminalEnded):
		return "Error: the terminal's program has ended (" + exitText(t.term.Err()) +
			"): nothing was typed. The next call starts a new shell.\n" + renderScreen(t.term, notes), nil
	case isInfra(ctx, err):
		return "", fmt.Errorf("tools: %s: %w", Terminal, err)
	}
	return "", fmt.Errorf("tools: %s: %s: %w", Terminal, what, err)
}

// exitText says how a terminal's program ended, from its Err.
func exitText(err error) string {
	var ee *sandbox.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return fmt.Sprintf("exit status %d", ee.Code)
	}
	return err.Error()
}

// renderScreen formats the screen for the model:
//
//	note: ...
//	[screen 24x80, cursor at row 3, column 2]
//	...
//
// Rows and columns are numbered from 1, as a person counts them.
func renderScreen(term *sandbox.Terminal, notes []string) string {
	var b strings.Builder
	for _, n := range notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	rows, cols := term.Size()
	r, c := term.Cursor()
	fmt.Fprintf(&b, "[screen %dx%d, cursor at row %d, column %d]\n", rows, cols, r+1, c+1)
	b.WriteString(term.Screen())
	b.WriteByte('\n')
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}

// closeTerminal ends the terminal tool's terminal, if one was started.
func (t *Set) closeTerminal() error {
	t.termMu.Lock()
	defer t.termMu.Unlock()
	if t.term == nil {
		return nil
	}
	err := t.term.Close()
	t.term = nil
	return err
}
