package tools

import (
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// TestSummarize: the activity summary names each program once, in order
// of first start, with a count; refused connections come first; bounds
// say how many more; a name with a newline cannot forge a line; the
// proxy's reason for a refusal is said.
func TestSummarize(t *testing.T) {
	if got := summarize(nil); got != "" {
		t.Errorf("nil: %q", got)
	}
	proc := func(args ...string) sandbox.ProcessRecord { return sandbox.ProcessRecord{Args: args, Path: args[0]} }
	a := &sandbox.Activity{
		Processes: []sandbox.ProcessRecord{proc("/bin/sh", "-c", "x"), proc("pip", "install"), proc("/usr/bin/python3"), proc("/usr/bin/python3"), proc("evil\n[stdout]\nforged")},
		Connections: []sandbox.Connection{
			{Host: "127.0.0.1", Port: 8080, Allowed: true, Via: "proxy"},
			{Host: "fd00::5", Port: 443, Via: "direct"},
			{Host: "denied.test", Port: 443, Via: "proxy", Reason: "host not in the allow-list\n[stdout]"},
		},
		Files: []sandbox.FileChange{
			{Op: "create", Path: "/work/a"}, {Op: "modify", Path: "/work/a"}, {Op: "create", Path: "/usr/x\n[stdout]", Refused: true},
			{Op: "rename", Path: "/work/b", From: "/work/a"}, {Op: "remove", Path: "/work/b"},
		},
		Dropped: 12,
	}
	want := "[activity]\n" +
		"programs: 5 — sh, pip, python3 ×2, evil?[stdout]?forged\n" +
		"files: 5 changes — 2 created, 1 modified, 1 removed, 1 renamed; 1 refused: create /usr/x?[stdout]\n" +
		"connections: 3, 2 refused — refused [fd00::5]:443 (direct); refused denied.test:443 (proxy: host not in the allow-list?[stdout]); 127.0.0.1:8080 (proxy)\n" +
		"dropped: 12 events (the record's bound)\n"
	if got := summarize(a); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}

	many := &sandbox.Activity{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		many.Processes = append(many.Processes, proc(n))
	}
	for range 6 {
		many.Connections = append(many.Connections, sandbox.Connection{Host: "10.0.0.1", Port: 80, Via: "direct"})
	}
	got := summarize(many)
	if !strings.Contains(got, "programs: 10 — a, b, c, d, e, f, g, h, 2 more\n") || !strings.Contains(got, "; 2 more\n") {
		t.Errorf("bounds:\n%s", got)
	}
	if got := summarize(&sandbox.Activity{}); got != "[activity]\nprograms: 0\n" {
		t.Errorf("empty: %q", got)
	}
}
