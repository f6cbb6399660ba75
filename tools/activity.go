package tools

import (
	"fmt"
	"path"
	"strings"

	"github.com/agentsandbox/sandbox"
)

// WithActivitySummary has execute_bash end its result with a short
// summary of what the command did (an [activity] section: the programs it
// ran, the files it changed, the connections it attempted, refused
// changes and connections first), from the
// command's activity record. The sandbox must keep one
// (sandbox.WithActivity(true)); where it keeps none, nothing is added.
func WithActivitySummary() Option {
	return func(t *Set) { t.actSummary = true }
}

// Bounds of an activity summary: it names at most maxSummaryNames
// programs and maxSummaryConns connections, and says how many more.
const (
	maxSummaryNames = 8
	maxSummaryConns = 4
)

// summarize renders a for the model:
//
//	[activity]
//	programs: 5 — sh, pip ×2, python3 ×2
//	files: 40 changes — 31 created, 2 modified, 6 removed, 1 renamed; refused: create /usr/lib/x
//	connections: 2, 1 refused — refused 10.0.0.5:443 (direct); 127.0.0.1:8080 (proxy)
//	dropped: 12 events (the record's bound)
//
// The programs' lines name each program once, by its base name, in order
// of first start; "" when a is nil.
func summarize(a *sandbox.Activity) string {
	if a == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("[activity]\n")
	var names []string
	count := map[string]int{}
	for _, p := range a.Processes {
		n := path.Base(p.Path)
		if len(p.Args) > 0 {
			n = path.Base(p.Args[0])
		}
		n = printable(n, 64)
		if count[n] == 0 {
			names = append(names, n)
		}
		count[n]++
	}
	fmt.Fprintf(&b, "programs: %d", len(a.Processes))
	for i, n := range names {
		if i == maxSummaryNames {
			fmt.Fprintf(&b, ", %d more", len(names)-i)
			break
		}
		sep := ", "
		if i == 0 {
			sep = " — "
		}
		b.WriteString(sep + n)
		if count[n] > 1 {
			fmt.Fprintf(&b, " ×%d", count[n])
		}
	}
	b.WriteByte('\n')
	if len(a.Files) > 0 {
		b.WriteString(filesLine(a.Files))
	}
	if len(a.Connections) > 0 {
		var refused, allowed []sandbox.Connection
		for _, c := range a.Connections {
			if c.Allowed {
				allowed = append(allowed, c)
			} else {
				refused = append(refused, c)
			}
		}
		fmt.Fprintf(&b, "connections: %d", len(a.Connections))
		if len(refused) > 0 {
			fmt.Fprintf(&b, ", %d refused", len(refused))
		}
		for i, c := range append(refused, allowed...) {
			if i == maxSummaryConns {
				fmt.Fprintf(&b, "; %d more", len(a.Connections)-i)
				break
			}
			sep := "; "
			if i == 0 {
				sep = " — "
			}
			state := ""
			if !c.Allowed {
				state = "refused "
			}
			via := c.Via
			if c.Reason != "" {
				via += ": " + printable(c.Reason, 80)
			}
			fmt.Fprintf(&b, "%s%s%s (%s)", sep, state, hostPort(c), via)
		}
		b.WriteByte('\n')
	}
	if a.Dropped > 0 {
		fmt.Fprintf(&b, "dropped: %d events (the record's bound)\n", a.Dropped)
	}
	return b.String()
}

// filesLine summarizes a command's file changes: how many of each kind,
// and the refused ones by name.
func filesLine(files []sandbox.FileChange) string {
	var b strings.Builder
	count := map[string]int{}
	var refused []sandbox.FileChange
	for _, f := range files {
		count[f.Op]++
		if f.Refused {
			refused = append(refused, f)
		}
	}
	fmt.Fprintf(&b, "files: %d change", len(files))
	if len(files) != 1 {
		b.WriteByte('s')
	}
	sep := " — "
	for _, op := range []string{"create", "modify", "remove", "rename"} {
		if count[op] > 0 {
			fmt.Fprintf(&b, "%s%d %s", sep, count[op], map[string]string{"create": "created", "modify": "modified", "remove": "removed", "rename": "renamed"}[op])
			sep = ", "
		}
	}
	for i, f := range refused {
		if i == maxSummaryConns {
			fmt.Fprintf(&b, ", %d more", len(refused)-i)
			break
		}
		if i == 0 {
			fmt.Fprintf(&b, "; %d refused: ", len(refused))
		} else {
			b.WriteString(", ")
		}
		b.WriteString(printable(f.Op, 8) + " " + printable(f.Path, 256))
	}
	b.WriteByte('\n')
	return b.String()
}

// hostPort formats a connection's destination.
func hostPort(c sandbox.Connection) string {
	h := printable(c.Host, 253)
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	return fmt.Sprintf("%s:%d", h, c.Port)
}

// printable bounds s to n bytes and makes it one line of valid UTF-8: a
// program's name is the sandbox's to choose, and a newline in it must not
// forge a line of the result.
func printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '\u2028' || r == '\u2029' {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	return truncateUTF8(s, n)
}
