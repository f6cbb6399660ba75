package tools_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/tools"
)

func TestTerminalArguments(t *testing.T) {
	t.Parallel()
	set := tools.New(nil)
	for _, c := range []struct{ args, want string }{
		{`{"keys": "Enter", "text": 3}`, "Error: Parameter `text` must be a string, got a number."},
		{`{"keys": [1]}`, "Error: Parameter `keys` must be an array of key names"},
		{`{"wait_for": "("}`, "Error: Parameter `wait_for` is not a valid regular expression"},
		{`{"timeout": 0}`, "Error: Parameter `timeout` must be a number of seconds greater than 0 and at most 600"},
		{`{"timeout": 601}`, "Error: Parameter `timeout` must be"},
		{`{"restart": "yes"}`, "Error: Parameter `restart` must be true or false"},
		{`{"command": "ls"}`, `Error: Unknown parameter "command" for terminal. Its parameters are: text, keys, wait_for, timeout, restart.`},
		{`{"text": "` + strings.Repeat("a", 64<<10+1) + `"}`, "Error: Parameter `text` is 65537 bytes"},
	} {
		out, err := set.Call(context.Background(), tools.Terminal, c.args)
		if err != nil || !strings.HasPrefix(out, c.want) {
			t.Errorf("Call(terminal, %.60s): %q, %v; want it to start with %q", c.args, out, err, c.want)
		}
	}
}

// A scripted model works the terminal tool: it edits a file in vi,
// answers a program's question, stops a runaway loop with C-c, makes
// mistakes, restarts the terminal; Set.Close ends it.
func TestTerminalTrajectory(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	ctx := testCtx(t)
	mustExec(t, sb, `printf 'hello\n' > notes.txt`)
	step := func(args, want string) string {
		t.Helper()
		out := call(t, set, tools.Terminal, args)
		if !regexp.MustCompile(want).MatchString(out) {
			t.Fatalf("terminal %s:\n%s\nwant a match of %q", args, out, want)
		}
		return out
	}
	const prompt = `\$\n$` // the screen ends with the shell's prompt
	// The first call starts the shell and shows its prompt.
	step(`{}`, `(?s)^\[screen 24x80, cursor at row \d+, column \d+\]\n.*`+prompt)
	step(`{"wait_for": "\\$$"}`, `(?s)^\[screen 24x80, cursor at row \d+, column \d+\]\n.*`+prompt)

	// vi: open, append, leave insert mode, add a line, save.
	step(`{"text": "vi notes.txt\n", "wait_for": "(?m)^hello$"}`, `(?m)^hello$`)
	step(`{"text": "A, world", "wait_for": "hello, world"}`, `(?m)^hello, world$`)
	step(`{"keys": ["Escape"]}`, `(?m)^hello, world$`)
	step(`{"text": "oanother line", "wait_for": "another line"}`, `(?m)^another line$`)
	step(`{"keys": ["Escape"]}`, `another line`)
	step(`{"text": ":wq\n", "wait_for": "\\$$"}`, prompt)
	if got, err := sb.ReadFile(ctx, "notes.txt"); err != nil || string(got) != "hello, world\nanother line\n" {
		t.Errorf("notes.txt: %q, %v", got, err)
	}

	// An interactive prompt, answered. The wait names the prompt's own
	// line: the shell's echo of the command line, written a character at
	// a time, passes through "...Your name?" while the line editor still
	// holds the terminal raw, and an answer typed then is never echoed.
	step(`{"text": "printf 'Your name? '; read name; echo \"hi $name\"\n", "wait_for": "(?m)^Your name\\?$"}`, `(?m)^Your name\?\n$`)
	step(`{"text": "Ada\n", "wait_for": "hi Ada"}`, `(?m)^hi Ada$`)

	// A runaway loop: the screen keeps changing; C-c stops it.
	out := step(`{"text": "while :; do echo spam; done\n", "timeout": 2}`, `note: the screen was still changing after 2s`)
	if !strings.Contains(out, "spam") {
		t.Fatalf("no spam on the screen:\n%s", out)
	}
	step(`{"keys": ["C-c"], "wait_for": "\\$$"}`, prompt)
	step(`{"text": "echo status=$?\n", "wait_for": "status=\\d+"}`, `(?m)^status=130$`)

	// Mistakes: an unknown key, a wait that does not match.
	step(`{"keys": ["Ctrl+C"]}`, `^Error: unknown key "Ctrl\+C"`)
	step(`{"text": "echo nope\n", "wait_for": "never shown", "timeout": 0.5}`, `note: the screen did not match "never shown" within 0.5s`)

	// The shell's end is said, and the next call starts a new one.
	step(`{"text": "exit 4\n", "wait_for": "never shown", "timeout": 60}`,
		`note: the screen did not match "never shown"\nnote: the terminal's program has ended \(exit status 4\); the next call starts a new shell`)
	step(`{"text": "echo again\n", "wait_for": "(?m)^again$"}`, `note: the terminal's program had ended \(exit status 4\); a new shell started`)

	// restart kills what ran; Set.Close ends the terminal.
	step(`{"text": "sleep 1021 &\n"}`, prompt)
	step(`{"restart": true}`, `note: the terminal was closed, with every process it started; a new shell started`)
	if ps := mustExec(t, sb, psScript); strings.Contains(ps, "sleep 1021") {
		t.Errorf("sleep 1021 outlived the restart:\n%s", ps)
	}
	step(`{"text": "sleep 1022 &\n"}`, prompt)
	if err := set.Close(); err != nil {
		t.Fatal(err)
	}
	if ps := mustExec(t, sb, psScript); strings.Contains(ps, "sleep 1022") || slices.Contains(strings.Split(ps, "\n"), "sh ") {
		t.Errorf("the terminal outlived Set.Close:\n%s", ps)
	}
}

const psScript = `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done`
