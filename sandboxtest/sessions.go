package sandboxtest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// sessions checks commands that survive a detach: a command of a leased
// sandbox, on a terminal, runs on when its Sandbox detaches; another
// Sandbox (Open) lists it, attaches, gets the output kept meanwhile (the
// drop said on one line), resizes it, takes it over from a second attach
// and waits for its exit.
func (c conformance) sessions(t *testing.T) {
	ctx := ctxFor(t)
	sb, err := sandbox.New(ctx, append(append([]sandbox.Option{}, c.opts...), sandbox.WithLease(time.Minute))...)
	if err != nil {
		t.Fatalf("New leased: %v", err)
	}
	id := sb.ID()
	closed := false
	t.Cleanup(func() {
		if !closed {
			sb.Close()
		}
	})
	cmd := sb.Command(ctx, "sh", "-c", `echo started; while [ ! -e go ]; do sleep 0.05; done; head -c `+
		strconv.Itoa(sandbox.SessionBuffer+100)+` /dev/zero | tr '\0' x; echo; echo kept-end; touch flooded; `+
		`trap 'stty size; exit 6' WINCH; while :; do sleep 1; done`)
	cmd.TTY = &sandbox.TTY{}
	out := &screen{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cid := cmd.ID()
	out.waitFor(t, 0, "started\r\n")
	if err := sb.Detach(); err != nil {
		t.Fatal(err)
	}
	closed = true
	sb2, err := sandbox.Open(ctx, id, c.opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { sb2.Close() })
	run(t, sb2, "touch go")
	Eventually(t, 30*time.Second, func() (bool, string) {
		return run(t, sb2, "test -e flooded").ExitCode == 0, "the detached command has not written its output"
	})
	list, err := sb2.Sessions(ctx)
	if err != nil {
		t.Fatalf("Sessions: %v", err)
	}
	var s *sandbox.Session
	for i := range list {
		if list[i].ID == cid {
			s = &list[i]
		}
	}
	if s == nil || !s.Terminal || !s.Running || len(s.Args) < 1 || s.Args[0] != "sh" {
		t.Fatalf("Sessions: %+v, want %s: a running terminal's sh", list, cid)
	}
	first := &screen{}
	a, err := sb2.AttachCommand(ctx, cid, first, nil)
	if err != nil {
		t.Fatalf("AttachCommand: %v", err)
	}
	first.waitFor(t, 0, "kept-end\r\n")
	kept := first.String()
	line, rest, _ := strings.Cut(kept, "\n")
	if !strings.HasPrefix(line, "[sandbox: ") || !strings.Contains(line, "dropped") || len(rest) != sandbox.SessionBuffer ||
		strings.Count(rest, "x") != sandbox.SessionBuffer-len("\r\nkept-end\r\n") {
		t.Errorf("replayed: first line %q, then %d bytes (%d x), want %d", line, len(rest), strings.Count(rest, "x"), sandbox.SessionBuffer)
	}
	// A second attach takes it over; a resize reaches it there.
	second := &screen{}
	b, err := sb2.AttachCommand(ctx, cid, second, nil)
	if err != nil {
		t.Fatalf("second AttachCommand: %v", err)
	}
	if err := a.Wait(); !errors.Is(err, sandbox.ErrTakenOver) {
		t.Errorf("Wait of the Cmd taken over: %v, want ErrTakenOver", err)
	}
	if err := b.Resize(11, 22); err != nil {
		t.Fatalf("Resize after the reattach: %v", err)
	}
	var ee *sandbox.ExitError
	if err := b.Wait(); !errors.As(err, &ee) || ee.Code != 6 || !strings.Contains(second.String(), "11 22\r\n") {
		t.Errorf("Wait after the reattach: %v (want exit status 6); output %q", err, second.String())
	}
	if _, err := sb2.AttachCommand(ctx, "no-such-command", nil, nil); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("AttachCommand of an unknown ID: %v, want ErrNoSession", err)
	}
}
