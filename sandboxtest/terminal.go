package sandboxtest

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// terminal works a Terminal as a person would: a shell that keeps its
// state, stty following a resize, vi editing a file through keys (when the
// image has a vi), top drawing its header, C-c ending sleep 1000 with the
// prompt back, a flood of output leaving the right screen, and Close
// killing everything the terminal started, seen from inside.
func (c conformance) terminal(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	term, err := sb.Terminal(ctx)
	if err != nil {
		t.Fatalf("Terminal: %v", err)
	}
	defer term.Close()
	if term.ID() == "" {
		t.Error("the terminal has no ID")
	}
	tm := termTest{t: t, term: term}

	// A REPL keeps state from one input to the next.
	tm.typ("x=41\r")
	tm.typ("echo value=$((x+1))\r")
	tm.match(`\bvalue=42\n`)

	// stty size follows Resize.
	if err := term.Resize(30, 100); err != nil {
		t.Fatalf("Resize(30, 100): %v", err)
	}
	tm.typ("stty size\r")
	tm.match(`(?m)^30 100$|\s30 100$`)
	if err := term.Resize(24, 80); err != nil {
		t.Fatalf("Resize(24, 80): %v", err)
	}

	// C-c stops sleep 1000, as SIGINT (130), and the prompt comes back.
	tm.typ("clear; sleep 1000\r")
	Eventually(t, time.Minute, func() (bool, string) {
		ps := run(t, sb, psScript).Stdout
		return strings.Contains(ps, "sleep 1000"), "sleep 1000 is not running:\n" + ps
	})
	if err := term.Press("C-c"); err != nil {
		t.Fatal(err)
	}
	tm.typ("echo status=$?\r")
	tm.match(`\bstatus=130\n`)

	// top draws a full screen with its header line (busybox's or procps').
	tm.typ("clear; top\r")
	tm.match(`(?m)^(top - \d|Mem: \d)`)
	tm.typ("q")
	tm.exited(sb, "top")
	tm.typ("clear; echo top=$?\r")
	tm.match(`\btop=0\n`)

	// vi edits and saves a file through keys, if the image has one.
	if r := run(t, sb, "command -v vi"); r.ExitCode != 0 {
		t.Log("the image has no vi: the editor's part is not run")
	} else {
		tm.vi(ctx, sb)
	}

	// A flood of output: the screen shows its end, the shell its prompt.
	const flood = 20 << 20
	tm.typ(fmt.Sprintf("clear; head -c %d /dev/zero | tr '\\0' 'y' | fold -w 80; echo; echo flood-end\r", flood))
	tm.matchWithin(3*time.Minute, `(?m)^flood-end$`)
	rows := strings.Split(term.Screen(), "\n")
	end := slices.Index(rows, "flood-end")
	if end < 20 {
		t.Fatalf("after the flood, flood-end is on row %d, want the bottom; the screen:\n%s", end, term.Screen())
	}
	for _, r := range rows[:end] {
		if r != strings.Repeat("y", 80) {
			t.Fatalf("after the flood, a row is %q, want 80 y's; the screen:\n%s", r, term.Screen())
		}
	}

	// Close kills everything the terminal started, however detached.
	tm.typ("sleep 1001 & setsid sleep 1002 & (trap '' HUP INT TERM; exec sleep 1003) & echo started\r")
	tm.match(`\bstarted\n`)
	Eventually(t, time.Minute, func() (bool, string) {
		ps := run(t, sb, psScript).Stdout
		return strings.Contains(ps, "sleep 1001") && strings.Contains(ps, "sleep 1002") && strings.Contains(ps, "sleep 1003"),
			"the sleeps are not all running:\n" + ps
	})
	if err := term.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ps := run(t, sb, psScript).Stdout
	for _, n := range []string{"sleep 1001", "sleep 1002", "sleep 1003"} {
		if strings.Contains(ps, n) {
			t.Errorf("%q outlived the terminal's Close:\n%s", n, ps)
		}
	}
	if err := term.Type("echo\r"); err == nil {
		t.Error("Type after Close succeeded")
	}
}

// termChild is the terminal/attach subtest's other process: it starts a
// terminal in sb, sets a shell variable, opens the note in vi if the
// image has one, and prints the terminal's ID and its screen, quoted.
func termChild(ctx context.Context, sb *sandbox.Sandbox) error {
	term, err := sb.Terminal(ctx)
	if err != nil {
		return err
	}
	wait := func(re string) error {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := term.WaitMatch(wctx, regexp.MustCompile(re)); err != nil {
			return fmt.Errorf("the screen does not match %q: %v; it shows:\n%s", re, err, term.Screen())
		}
		return nil
	}
	if err := term.Type("x=5; echo ready-$((x*2))\r"); err != nil {
		return err
	}
	if err := wait(`\bready-10\n`); err != nil {
		return err
	}
	if r, err := sb.Exec(ctx, "command -v vi"); err == nil && r.ExitCode == 0 {
		if err := term.Type("vi note\r"); err != nil {
			return err
		}
		if err := wait(`(?m)^made$`); err != nil {
			return err
		}
	}
	// The screen settles: what is printed is what it shows from now on.
	if err := term.Wait(ctx, time.Second); err != nil {
		return err
	}
	fmt.Printf("\nagentsandbox-lease TERM=%s %s\n", term.ID(), strconv.Quote(term.Screen()))
	return nil
}

// terminalAttach: a terminal of a leased sandbox outlives the process
// that started it (killed), and another process attaches to it: vi's
// screen as it was, the shell's state, Close killing it.
func (c conformance) terminalAttach(t *testing.T) {
	ctx := ctxFor(t)
	label := fmt.Sprintf("conformance-term-%d", time.Now().UnixNano())
	// A lease of a minute: with MinLease's, renewals late on a loaded
	// machine ended the sandbox, and the terminal with it (exit 137).
	maker, id := startLeaseProc(t, "make-long:"+label, "ID")
	sb, err := sandbox.Open(ctx, id, c.opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer sb.Close()
	maker.cmd.Process.Kill()
	maker.cmd.Wait()
	user, v := startLeaseProc(t, "term:"+id, "TERM")
	tid, quoted, _ := strings.Cut(v, " ")
	screen, err := strconv.Unquote(quoted)
	if err != nil {
		t.Fatalf("the child's screen %q: %v", quoted, err)
	}
	user.cmd.Process.Kill()
	user.cmd.Wait()

	list, err := sb.Sessions(ctx)
	if err != nil {
		t.Fatalf("Sessions: %v", err)
	}
	i := slices.IndexFunc(list, func(s sandbox.Session) bool { return s.ID == tid })
	if i < 0 || !list[i].Terminal || !list[i].Running {
		t.Fatalf("Sessions: %+v; want the terminal %s running", list, tid)
	}
	term, err := sb.AttachTerminal(ctx, tid)
	if err != nil {
		t.Fatalf("AttachTerminal: %v", err)
	}
	defer term.Close()
	// The screen it had: the agent replays a terminal's last output, and
	// a full-screen program (vi) redraws on the resize of the attach.
	if strings.Contains(screen, "made") {
		Eventually(t, 30*time.Second, func() (bool, string) {
			return term.Screen() == screen, fmt.Sprintf("the screen reattached:\n%q\nwant the one it had:\n%q", term.Screen(), screen)
		})
	} else { // a shell: its lines (the resize may redraw its prompt)
		Eventually(t, 30*time.Second, func() (bool, string) {
			return strings.Contains(term.Screen(), "ready-10\n"), fmt.Sprintf("the shell's screen reattached:\n%q\nwant its lines:\n%q", term.Screen(), screen)
		})
	}
	tm := termTest{t: t, term: term}
	if strings.Contains(screen, "made") {
		tm.typ(":q\r")
		tm.exited(sb, "vi note")
	}
	tm.typ("echo kept-$x\r")
	tm.match(`\bkept-5\n`)
	if err := term.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ps := run(t, sb, psScript).Stdout
	if slices.Contains(strings.Split(ps, "\n"), "sh ") {
		t.Errorf("the terminal's shell outlived Close:\n%s", ps)
	}
}

// vi edits a file in the terminal's vi and checks what it saved.
func (tm termTest) vi(ctx context.Context, sb *sandbox.Sandbox) {
	t := tm.t
	if err := sb.WriteFile(ctx, "vi.txt", []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tm.typ("vi vi.txt\r")
	tm.match(`(?m)^hello$`)
	tm.typ("A, world")
	tm.match(`(?m)^hello, world$`)
	tm.escape()
	tm.typ("oline two")
	tm.match(`(?m)^line two$`)
	tm.escape()
	tm.typ(":wq\r")
	tm.exited(sb, "vi vi.txt")
	tm.typ("clear; echo vi=$?\r")
	tm.match(`\bvi=0\n`)
	got, err := sb.ReadFile(ctx, "vi.txt")
	if err != nil || string(got) != "hello, world\nline two\n" {
		t.Errorf("the file vi saved: %q, %v; want %q", got, err, "hello, world\nline two\n")
	}
}

// escape presses Escape in vi and waits for its command mode: busybox
// vi's status line starts with "-" rather than "I" there, vim's no longer
// says "-- INSERT --". Keys typed at once after an Escape could be taken
// for an escape sequence.
func (tm termTest) escape() {
	if err := tm.term.Press("Escape"); err != nil {
		tm.t.Fatal(err)
	}
	Eventually(tm.t, time.Minute, func() (bool, string) {
		s := tm.term.Screen()
		last := s[strings.LastIndexByte(s, '\n')+1:]
		return !strings.HasPrefix(last, "I ") && !strings.Contains(last, "-- INSERT --"),
			"vi is still in insert mode:\n" + s
	})
}

// exited waits until no process of the sandbox has the command line cmd
// (the program name and its arguments), so that what is typed next goes
// to the shell.
func (tm termTest) exited(sb *sandbox.Sandbox, cmd string) {
	tm.t.Helper()
	Eventually(tm.t, time.Minute, func() (bool, string) {
		ps := run(tm.t, sb, psScript).Stdout
		return !slices.Contains(strings.Split(ps, "\n"), cmd+" "), cmd + " still runs; the screen:\n" + tm.term.Screen()
	})
}

// termTest works a Terminal in a test.
type termTest struct {
	t    *testing.T
	term *sandbox.Terminal
}

func (tm termTest) typ(text string) {
	tm.t.Helper()
	if err := tm.term.Type(text); err != nil {
		tm.t.Fatalf("Type(%q): %v", text, err)
	}
}

// match waits for the screen to match re, failing the test after a
// minute.
func (tm termTest) match(re string) { tm.t.Helper(); tm.matchWithin(time.Minute, re) }

func (tm termTest) matchWithin(d time.Duration, re string) {
	tm.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := tm.term.WaitMatch(ctx, regexp.MustCompile(re)); err != nil {
		tm.t.Fatalf("the screen does not match %q: %v; it shows:\n%s", re, err, tm.term.Screen())
	}
}
