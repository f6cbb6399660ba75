package tools

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParse feeds arbitrary tool names and arguments to the argument layer:
// it must never panic, and must either refuse with a message for the model
// or return a call whose fields are all checked.
func FuzzParse(f *testing.F) {
	for _, s := range []struct{ name, args string }{
		{ExecuteBash, `{"command": "ls -la", "timeout": 30}`},
		{ExecuteBash, `{"command": "ls", "timeout": "1e3"}`},
		{ExecuteBash, `{"command": 5}`},
		{ExecuteBash, `"{\"command\": \"ls\"}"`},
		{ExecuteBash, ``},
		{Editor, `{"command": "view", "path": "/workspace", "view_range": [1, -1]}`},
		{Editor, `{"command": "view", "path": "/a", "view_range": ["1", 2.0]}`},
		{Editor, `{"command": "create", "path": "/workspace/a.py", "file_text": "print(1)\n"}`},
		{Editor, `{"command": "str_replace", "path": "/a", "old_str": "x", "new_str": null}`},
		{Editor, `{"command": "insert", "path": "/a", "insert_line": 1e300, "new_str": "x"}`},
		{Editor, `{"command": "insert", "path": "/a", "insert_line": -0, "new_str": "x"}`},
		{Editor, `{"command": "undo_edit", "path": "relative/x"}`},
		{Editor, `{"command": "view", "path": "/a/../../b/./c/"}`},
		{Submit, `{"answer": "42"}`},
		{Submit, `null`},
		{"unknown", `{}`},
		{Editor, `{"command": "view", "path": "/a", "path": 3}`},
		{Editor, `[1, 2`},
	} {
		f.Add(s.name, s.args)
	}
	f.Fuzz(func(t *testing.T, name, args string) {
		c, err := parse(name, args)
		if err != nil {
			if c != nil {
				t.Fatalf("parse returned both %v and %v", c, err)
			}
			var rp *relPathError
			var m mistake
			switch {
			case errors.As(err, &rp):
				if strings.HasPrefix(rp.path, "/") || rp.path == "" {
					t.Fatalf("relative-path error for %q", rp.path)
				}
				if msg := rp.message("/workspace"); !strings.HasPrefix(msg, "Error: ") {
					t.Fatalf("message %q", msg)
				}
			case errors.As(err, &m):
				if !strings.HasPrefix(string(m), "Error: ") || !utf8.ValidString(string(m)) && utf8.ValidString(name) {
					t.Fatalf("bad message %q", m)
				}
			default:
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		switch c := c.(type) {
		case bashCall:
			if name != ExecuteBash || strings.TrimSpace(c.command) == "" || strings.ContainsRune(c.command, 0) ||
				c.timeout < 0 || c.timeout > maxTimeout {
				t.Fatalf("bad bash call %+v from %q", c, args)
			}
		case editorCall:
			if name != Editor || !slices.Contains(editorCommands, c.command) || !path.IsAbs(c.path) ||
				path.Clean(c.path) != c.path || strings.ContainsRune(c.path, 0) {
				t.Fatalf("bad editor call %+v from %q", c, args)
			}
			switch c.command {
			case cmdCreate:
				if c.fileText == nil {
					t.Fatalf("create without file_text: %q", args)
				}
			case cmdStrReplace:
				if c.oldStr == nil || *c.oldStr == "" {
					t.Fatalf("str_replace without old_str: %q", args)
				}
			case cmdInsert:
				if c.insertLine == nil || *c.insertLine < 0 || *c.insertLine > maxLine || c.newStr == nil {
					t.Fatalf("bad insert: %q", args)
				}
			case cmdView:
				if r := c.viewRange; r != nil && (len(r) != 2 || r[0] < 1 || r[0] > maxLine || (r[1] != -1 && r[1] < r[0])) {
					t.Fatalf("bad view_range %v: %q", r, args)
				}
			}
		case submitCall:
			if name != Submit {
				t.Fatalf("submit call from tool %q", name)
			}
		default:
			t.Fatalf("parse returned %T", c)
		}
	})
}

func TestHeadTail(t *testing.T) {
	for _, tc := range []struct {
		limit  int
		writes []string
		want   string
	}{
		{10, []string{"hello"}, "hello"},
		{10, []string{"0123456789"}, "0123456789"},
		{10, []string{"01234", "56789"}, "0123456789"},
		// Without line breaks the cut is at the byte.
		{10, []string{"0123456789ab"}, "01234\n[... 2 bytes omitted: output truncated to 10 bytes, the start and the end are shown ...]\n789ab"},
		// The tail ring wraps over many small writes.
		{10, strings.Split("abcdefghijklmnopqrstuvwxyz", ""), "abcde\n[... 16 bytes omitted: output truncated to 10 bytes, the start and the end are shown ...]\nvwxyz"},
		// Cuts move to line breaks in the kept halves.
		{20, []string{"l1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nl9\n"}, "l1\nl2\nl3\n[... 9 bytes omitted: output truncated to 20 bytes, the start and the end are shown ...]\nl7\nl8\nl9\n"},
		// A rune split by the cut is dropped, not mangled.
		{8, []string{"ééééééééé"}, "éé\n[... 10 bytes omitted: output truncated to 8 bytes, the start and the end are shown ...]\néé"},
	} {
		h := newHeadTail(tc.limit)
		for _, w := range tc.writes {
			h.Write([]byte(w))
		}
		if got := h.text(); got != tc.want {
			t.Errorf("limit %d, writes %q:\n got %q\nwant %q", tc.limit, tc.writes, got, tc.want)
		}
	}
}

// FuzzHeadTail checks that whatever is written, the kept text is the
// whole input when it fits, and otherwise a prefix and a suffix of it with
// the omitted count adding up.
func FuzzHeadTail(f *testing.F) {
	f.Add(10, []byte("hello world, this is long"), 3)
	f.Add(7, []byte("a\nb\nc\nd\ne\nf\ng\nh\n"), 1)
	f.Fuzz(func(t *testing.T, limit int, data []byte, chunk int) {
		if limit < 2 || limit > 1000 || chunk < 1 {
			return
		}
		h := newHeadTail(limit)
		for rest := data; len(rest) > 0; {
			k := min(chunk, len(rest))
			h.Write(rest[:k])
			rest = rest[k:]
		}
		got := h.text()
		if len(data) <= limit {
			if got != string(data) {
				t.Fatalf("kept %q of %q", got, data)
			}
			return
		}
		var head, rest string
		if r, ok := strings.CutPrefix(got, "[... "); ok {
			rest = r
		} else if head, rest, ok = strings.Cut(got, "\n[... "); !ok {
			t.Fatalf("no note in %q", got)
		}
		note, tail, ok := strings.Cut(rest, " ...]\n")
		if !ok {
			t.Fatalf("no end of note in %q", got)
		}
		var omitted, lim int
		if _, err := fmt.Sscanf(note, "%d bytes omitted: output truncated to %d bytes", &omitted, &lim); err != nil || lim != limit {
			t.Fatalf("note %q: %v", note, err)
		}
		if !strings.HasSuffix(string(data), tail) {
			t.Fatalf("tail %q is not a suffix of %q", tail, data)
		}
		// The head either ended with a line break (taken by the note's
		// line) or was given one.
		withBreak := strings.HasPrefix(string(data), head+"\n") && len(head)+1+omitted+len(tail) == len(data)
		without := strings.HasPrefix(string(data), head) && len(head)+omitted+len(tail) == len(data)
		if !withBreak && !without {
			t.Fatalf("head %q, %d omitted, tail %q do not make up %q", head, omitted, tail, data)
		}
		if omitted <= 0 || len(head)+len(tail) > limit {
			t.Fatalf("kept %d+%d bytes, omitted %d, limit %d", len(head), len(tail), omitted, limit)
		}
	})
}

func TestNumbered(t *testing.T) {
	lines := []string{"a", "bb", "ccc"}
	if got, last := numbered(lines, 1, 3, 1000, 1000); got != "     1\ta\n     2\tbb\n     3\tccc\n" || last != 3 {
		t.Errorf("numbered = %q, %d", got, last)
	}
	if got, last := numbered(lines, 2, 3, 1000, 1); got != "     2\tbb\n" || last != 2 {
		t.Errorf("numbered with maxLines 1 = %q, %d", got, last)
	}
	if got, last := numbered(lines, 1, 3, 19, 1000); got != "     1\ta\n     2\tbb\n" || last != 2 {
		t.Errorf("numbered with maxBytes 19 = %q, %d", got, last)
	}
	if got, last := numbered([]string{"xxxxxxxxxx"}, 1, 1, 10, 1000); got != "     1\txxx [... line 1 cut: 7 more bytes not shown]\n" || last != 1 {
		t.Errorf("numbered of a long line = %q, %d", got, last)
	}
	if got := splitLines("a\n\nb"); !slices.Equal(got, []string{"a", "", "b"}) {
		t.Errorf("splitLines = %q", got)
	}
	if got := splitLines("a\n"); !slices.Equal(got, []string{"a"}) {
		t.Errorf("splitLines = %q", got)
	}
	if got := splitLines(""); got != nil {
		t.Errorf("splitLines(\"\") = %q", got)
	}
}

func TestRemember(t *testing.T) {
	s := New(nil)
	for i := range maxUndo + 3 {
		s.remember("/a", version{data: []byte{byte(i)}, existed: true})
	}
	if got := len(s.history["/a"]); got != maxUndo {
		t.Errorf("kept %d versions, want %d", got, maxUndo)
	}
	v, ok := s.recall("/a")
	if !ok || v.data[0] != maxUndo+2 {
		t.Errorf("recall = %v, %v", v, ok)
	}
	// The byte bound drops the oldest versions of any path, never the
	// newest one.
	s = New(nil)
	big := make([]byte, maxHistoryBytes/3+1)
	s.remember("/a", version{data: big})
	s.remember("/b", version{data: big})
	s.remember("/a", version{data: big})
	if len(s.history["/a"]) != 1 || len(s.history["/b"]) != 1 || s.histBytes != 2*len(big) {
		t.Errorf("after the bound: /a %d, /b %d, %d bytes", len(s.history["/a"]), len(s.history["/b"]), s.histBytes)
	}
	_, okA := s.recall("/a")
	_, okB := s.recall("/b")
	_, okA2 := s.recall("/a")
	if !okA || !okB || okA2 || s.histBytes != 0 {
		t.Errorf("recall: %v %v %v, %d bytes left", okA, okB, okA2, s.histBytes)
	}
}
