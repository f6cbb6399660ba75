package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// These tests run a Terminal over a pseudo-terminal of the host
// (NewHostTerminal): what the Terminal does itself — keys, screen, waits,
// errors, Close — without an engine. The same behaviour in a sandbox is
// the conformance suite's "terminal" subtest and terminal_test.go.

func hostTerminal(t *testing.T, args ...string) *sandbox.Terminal {
	t.Helper()
	if len(args) == 0 {
		args = []string{"/bin/sh"}
	}
	term, err := sandbox.NewHostTerminal(args...)
	if err != nil {
		t.Skipf("no pseudo-terminal on this host: %v", err)
	}
	t.Cleanup(func() { term.Close() })
	return term
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitMatch fails the test unless the screen comes to match re.
func waitMatch(t *testing.T, term *sandbox.Terminal, re string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := term.WaitMatch(ctx, regexp.MustCompile(re)); err != nil {
		ended := "running"
		select {
		case <-term.Done():
			ended = fmt.Sprintf("ended: %v", term.Err())
		default:
		}
		t.Fatalf("WaitMatch(%q): %v (the program: %s); the screen:\n%s", re, err, ended, term.Screen())
	}
}

func typeText(t *testing.T, term *sandbox.Terminal, text string) {
	t.Helper()
	if err := term.Type(text); err != nil {
		t.Fatalf("Type(%q): %v", text, err)
	}
}

func TestTerminalHostShell(t *testing.T) {
	term := hostTerminal(t)
	typeText(t, term, "x=41\r")
	typeText(t, term, "echo $((x+1))\r")
	waitMatch(t, term, `(?m)\b42$`)
	if err := term.Resize(30, 100); err != nil {
		t.Fatal(err)
	}
	if r, c := term.Size(); r != 30 || c != 100 {
		t.Fatalf("Size = %d × %d after Resize(30, 100)", r, c)
	}
	typeText(t, term, "stty size\r")
	waitMatch(t, term, `(?m)\b30 100$`)
	// Escape sequences change the emulated screen only: a clear and a
	// title; the cursor's position follows.
	typeText(t, term, "clear; printf '\\033]0;title\\007\\033[5;10Hmark'; sleep 1000\r")
	waitMatch(t, term, `^\n\n\n\n {9}mark$`)
	if r, c := term.Cursor(); r != 4 || c != 13 {
		t.Errorf("Cursor = %d, %d; want 4, 13", r, c)
	}
	// C-c interrupts the foreground job; the shell says so by $?.
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		return sandbox.HostSessionRuns(term, "sleep", "1000"), "sleep 1000 does not run"
	})
	if err := term.Press("C-c"); err != nil {
		t.Fatal(err)
	}
	typeText(t, term, "echo status=$?\r")
	waitMatch(t, term, `(?m)\bstatus=130$`)
}

func TestTerminalHostErrors(t *testing.T) {
	term := hostTerminal(t)
	if err := term.Press("Enter", "NoSuchKey"); !errors.Is(err, sandbox.ErrUnknownKey) {
		t.Errorf("Press of an unknown key: %v; want ErrUnknownKey", err)
	}
	for _, size := range [][2]int{{0, 80}, {24, 0}, {201, 80}, {24, 501}, {-1, -1}} {
		if err := term.Resize(size[0], size[1]); !errors.Is(err, sandbox.ErrTerminalSize) {
			t.Errorf("Resize(%d, %d): %v; want ErrTerminalSize", size[0], size[1], err)
		}
	}
	if err := term.WaitMatch(context.Background(), nil); err == nil {
		t.Error("WaitMatch(nil) succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := term.WaitMatch(ctx, regexp.MustCompile("never shown")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitMatch past its deadline: %v", err)
	}
	cancel()
	if term.Err() != nil {
		t.Errorf("Err while running: %v", term.Err())
	}
	typeText(t, term, "echo bye; exit 3\r")
	err := term.WaitMatch(shortCtx(t), regexp.MustCompile("never shown"))
	if !errors.Is(err, sandbox.ErrTerminalEnded) {
		t.Fatalf("WaitMatch when the program ends: %v; want ErrTerminalEnded", err)
	}
	select { // already: WaitMatch saw the end
	case <-term.Done():
	default:
		t.Fatal("WaitMatch returned ErrTerminalEnded before Done was closed")
	}
	var ee *sandbox.ExitError
	if !errors.As(term.Err(), &ee) || ee.Code != 3 {
		t.Errorf("Err = %v; want exit status 3", term.Err())
	}
	if !regexp.MustCompile(`(?m)\bbye$`).MatchString(term.Screen()) {
		t.Errorf("the last screen is not kept:\n%s", term.Screen())
	}
	if err := term.Type("x"); !errors.Is(err, sandbox.ErrTerminalEnded) {
		t.Errorf("Type after the end: %v; want ErrTerminalEnded", err)
	}
	if err := term.Resize(10, 10); !errors.Is(err, sandbox.ErrTerminalEnded) {
		t.Errorf("Resize after the end: %v; want ErrTerminalEnded", err)
	}
	// What matches still matches after the end.
	if err := term.WaitMatch(shortCtx(t), regexp.MustCompile("bye")); err != nil {
		t.Errorf("WaitMatch of the last screen: %v", err)
	}
	if err := term.Close(); err != nil {
		t.Fatal(err)
	}
	if err := term.Type("x"); !errors.Is(err, sandbox.ErrTerminalClosed) {
		t.Errorf("Type after Close: %v; want ErrTerminalClosed", err)
	}
	if err := term.Press("Enter"); !errors.Is(err, sandbox.ErrTerminalClosed) {
		t.Errorf("Press after Close: %v; want ErrTerminalClosed", err)
	}
	if err := term.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestTerminalHostClose(t *testing.T) {
	term := hostTerminal(t)
	typeText(t, term, "sleep 1000 & echo pid=$!\r")
	waitMatch(t, term, `(?m)\bpid=\d+$`)
	m := regexp.MustCompile(`(?m)\bpid=(\d+)$`).FindStringSubmatch(term.Screen())
	pid, _ := strconv.Atoi(m[1])
	wctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- term.WaitMatch(wctx, regexp.MustCompile("never shown")) }()
	if err := term.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, sandbox.ErrTerminalClosed) {
		t.Errorf("WaitMatch ended by Close: %v; want ErrTerminalClosed", err)
	}
	cancel()
	// The host's sleep is a child of the shell, reaped by init once
	// killed; until then it is a zombie, which kill(0) still finds, so
	// look at its state.
	if err := syscall.Kill(pid, 0); err == nil && !sandbox.Zombie(pid) {
		t.Errorf("sleep (pid %d) outlived Close", pid)
	}
	select {
	case <-term.Done():
	default:
		t.Error("Done not closed after Close")
	}
}
