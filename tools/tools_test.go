package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
	"github.com/agentsandbox/sandbox/tools"
)

// check compares a tool's text with the exact text expected.
func check(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got: %q\nwant: %q", what, got, want)
	}
}

// args encodes tool arguments as the model would send them.
func args(kv ...any) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestDefinitions(t *testing.T) {
	t.Parallel()
	set := tools.New(nil) // definitions need no sandbox
	defs := set.Definitions()
	var names []string
	for _, d := range defs {
		names = append(names, d.Name)
		var s map[string]any
		if err := json.Unmarshal(d.Parameters, &s); err != nil {
			t.Fatalf("%s: schema is not JSON: %v", d.Name, err)
		}
		checkSchema(t, d.Name, s)
		if d.Description == "" {
			t.Errorf("%s: no description", d.Name)
		}
	}
	if want := []string{tools.ExecuteBash, tools.Terminal, tools.Python, tools.Editor, tools.Submit}; !slices.Equal(names, want) {
		t.Errorf("names = %v, want %v", names, want)
	}

	oa := set.OpenAITools()
	an := set.AnthropicTools()
	if len(oa) != 5 || len(an) != 5 {
		t.Fatalf("got %d OpenAI and %d Anthropic tools, want 5 each", len(oa), len(an))
	}
	for i, d := range defs {
		fn, _ := oa[i]["function"].(map[string]any)
		if oa[i]["type"] != "function" || fn["name"] != d.Name || fn["description"] != d.Description {
			t.Errorf("OpenAI tool %d = %v", i, oa[i])
		}
		if an[i]["name"] != d.Name || an[i]["description"] != d.Description {
			t.Errorf("Anthropic tool %d = %v", i, an[i])
		}
		for _, s := range []any{fn["parameters"], an[i]["input_schema"]} {
			got, _ := json.Marshal(s)
			var want any
			json.Unmarshal(d.Parameters, &want)
			wantJSON, _ := json.Marshal(want)
			if string(got) != string(wantJSON) {
				t.Errorf("%s: schema in tool entry = %s, want %s", d.Name, got, wantJSON)
			}
		}
		if len(oa[i]) != 2 || len(fn) != 3 || len(an[i]) != 3 {
			t.Errorf("%s: unexpected keys: %v / %v", d.Name, oa[i], an[i])
		}
	}
	// The entries are fresh: changing one does not change the next.
	oa[0]["function"].(map[string]any)["parameters"].(map[string]any)["type"] = "changed"
	defs[0].Parameters[0] = 'X'
	if got := set.OpenAITools()[0]["function"].(map[string]any)["parameters"].(map[string]any)["type"]; got != "object" {
		t.Errorf("OpenAITools shares maps between calls: type = %v", got)
	}
	if got := set.Definitions()[0].Parameters[0]; got != '{' {
		t.Errorf("Definitions shares its schema bytes: %q", got)
	}
}

// checkSchema checks that s is a JSON Schema for an object of known
// properties: type object, typed properties, required naming properties,
// additionalProperties false.
func checkSchema(t *testing.T, name string, s map[string]any) {
	t.Helper()
	if s["type"] != "object" {
		t.Errorf("%s: type = %v", name, s["type"])
	}
	if s["additionalProperties"] != false {
		t.Errorf("%s: additionalProperties = %v", name, s["additionalProperties"])
	}
	props, ok := s["properties"].(map[string]any)
	if !ok || len(props) == 0 {
		t.Fatalf("%s: properties = %v", name, s["properties"])
	}
	types := []string{"string", "number", "integer", "boolean", "array", "object"}
	for p, v := range props {
		ps, ok := v.(map[string]any)
		if !ok {
			t.Errorf("%s.%s: not an object", name, p)
			continue
		}
		typ, _ := ps["type"].(string)
		if !slices.Contains(types, typ) {
			t.Errorf("%s.%s: type = %v", name, p, ps["type"])
		}
		if d, _ := ps["description"].(string); d == "" {
			t.Errorf("%s.%s: no description", name, p)
		}
		if typ == "array" {
			items, _ := ps["items"].(map[string]any)
			if items == nil || !slices.Contains(types, items["type"].(string)) {
				t.Errorf("%s.%s: items = %v", name, p, ps["items"])
			}
		}
		if e, ok := ps["enum"].([]any); ok && len(e) == 0 {
			t.Errorf("%s.%s: empty enum", name, p)
		}
	}
	req, ok := s["required"].([]any)
	if !ok || len(req) == 0 && name != tools.Terminal { // a terminal call may only look
		t.Errorf("%s: required = %v", name, s["required"])
	}
	for _, r := range req {
		if _, ok := props[r.(string)]; !ok {
			t.Errorf("%s: required %v is not a property", name, r)
		}
	}
	for k := range s {
		if !slices.Contains([]string{"type", "properties", "required", "additionalProperties"}, k) {
			t.Errorf("%s: unexpected schema keyword %q", name, k)
		}
	}
}

func TestExecuteBash(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	for _, tc := range []struct{ name, args, want string }{
		{"both streams", args("command", "echo hello; echo oops >&2; exit 3"),
			"exit code: 3\n[stdout]\nhello\n[stderr]\noops\n"},
		{"no output", args("command", "true"), "exit code: 0\n(no output)\n"},
		{"no final newline", args("command", "printf 'no newline'"), "exit code: 0\n[stdout]\nno newline\n"},
		{"stderr only", args("command", "ls /nonexistent"),
			"exit code: 1\n[stderr]\nls: /nonexistent: No such file or directory\n"},
		{"not found", args("command", "no-such-program --x"),
			"exit code: 127\n[stderr]\n/bin/sh: no-such-program: not found\n"},
		{"working directory", args("command", "pwd; cd /tmp && pwd"), "exit code: 0\n[stdout]\n/workspace\n/tmp\n"},
		{"fresh shell each call", args("command", "pwd; echo ${X:-unset}"), "exit code: 0\n[stdout]\n/workspace\nunset\n"},
		{"empty stdin", args("command", "cat; echo done"), "exit code: 0\n[stdout]\ndone\n"},
		{"invalid UTF-8", args("command", `printf '\377\376ok\n'`), "exit code: 0\n[stdout]\n\uFFFDok\n"},
		{"timeout as a string", args("command", "echo x", "timeout", "5"), "exit code: 0\n[stdout]\nx\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, tc.name, call(t, set, tools.ExecuteBash, tc.args), tc.want)
		})
	}

	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		got := call(t, set, tools.ExecuteBash, args("command", "echo started; sleep 30; echo never", "timeout", 3))
		if d := time.Since(start); d > testenv.HangGuard {
			t.Errorf("a 3s timeout returned after %v", d)
		} else {
			t.Logf("a 3s timeout returned after %v", d)
		}
		check(t, "timeout", got, "exit code: 137\nnote: the command timed out after 3s and was killed, with every process it started\n[stdout]\nstarted\n")
		if ps := mustExec(t, sb, "ps -o args"); strings.Contains(ps, "sleep 30") {
			t.Errorf("sleep still runs after the timeout:\n%s", ps)
		}
		// The sandbox is still usable.
		check(t, "after timeout", call(t, set, tools.ExecuteBash, args("command", "echo ok")), "exit code: 0\n[stdout]\nok\n")
	})

	t.Run("traceback after long output", func(t *testing.T) {
		got := call(t, set, tools.ExecuteBash, args("command", "seq 1 200000; echo 'ValueError: the end' >&2; exit 1"))
		if !strings.HasPrefix(got, "exit code: 1\n[stdout]\n1\n2\n3\n") {
			t.Errorf("start of output lost: %q", got[:min(len(got), 80)])
		}
		if !strings.Contains(got, "199999\n200000\n[stderr]\nValueError: the end\n") {
			t.Errorf("end of output lost: %q", got[max(0, len(got)-120):])
		}
		// seq 1 200000 writes 1288895 bytes; 16384 are shown.
		if !strings.Contains(got, "bytes omitted: output truncated to 16384 bytes, the start and the end are shown ...]\n") {
			t.Errorf("no truncation note in %q", got)
		}
		if len(got) > 16384+300 {
			t.Errorf("model sees %d bytes", len(got))
		}
	})
}

func TestExecuteBashOptions(t *testing.T) {
	t.Parallel()
	set, _ := newSet(t, tools.WithOutputLimit(100), tools.WithDefaultTimeout(time.Second))
	// seq 1 1000 prints 3893 bytes: the first 50 end after "19\n" and the
	// last 50 start after "988\n".
	var head, tail strings.Builder
	for i := 1; i <= 19; i++ {
		fmt.Fprintf(&head, "%d\n", i)
	}
	for i := 989; i <= 1000; i++ {
		fmt.Fprintf(&tail, "%d\n", i)
	}
	want := "exit code: 0\n[stdout]\n" + head.String() +
		"[... 3796 bytes omitted: output truncated to 100 bytes, the start and the end are shown ...]\n" + tail.String()
	check(t, "seq", call(t, set, tools.ExecuteBash, args("command", "seq 1 1000")), want)

	start := time.Now()
	check(t, "default timeout", call(t, set, tools.ExecuteBash, args("command", "sleep 20")),
		"exit code: 137\nnote: the command timed out after 1s and was killed, with every process it started\n(no output)\n")
	if d := time.Since(start); d > testenv.HangGuard {
		t.Errorf("a 1s default timeout returned after %v", d)
	} else {
		t.Logf("a 1s default timeout returned after %v", d)
	}
	check(t, "explicit timeout wins", call(t, set, tools.ExecuteBash, args("command", "sleep 1.5; echo slept", "timeout", 10)),
		"exit code: 0\n[stdout]\nslept\n")
}

// TestExecuteBashActivity: with WithActivitySummary and the sandbox's
// record on, the result ends with what the command ran; without the
// record, nothing is added.
func TestExecuteBashActivity(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, busyboxImage, sandbox.WithActivity(true))
	set := tools.New(sb, tools.WithActivitySummary())
	check(t, "with the record", call(t, set, tools.ExecuteBash, args("command", "/bin/true; /bin/true; /bin/echo hi; : > made; (: > /etc/x) 2>/dev/null; exit 0")),
		"exit code: 0\n[stdout]\nhi\n[activity]\nprograms: 4 — sh, true ×2, echo\nfiles: 2 changes — 2 created; 1 refused: create /etc/x\n")
	check(t, "one file", call(t, set, tools.ExecuteBash, args("command", "rm made")),
		"exit code: 0\n(no output)\n[activity]\nprograms: 1 — sh\nfiles: 1 change — 1 removed\n") // busybox's rm runs in its shell
	off, _ := newSet(t, tools.WithActivitySummary())
	check(t, "without", call(t, off, tools.ExecuteBash, args("command", "/bin/true")), "exit code: 0\n(no output)\n")
}

func TestExecuteBashOOM(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, pythonImage, sandbox.WithLimits(sandbox.Limits{Memory: 64 << 20}))
	set := tools.New(sb)
	got := call(t, set, tools.ExecuteBash, args("command", `echo allocating; python3 -c "b = b'x' * (512 << 20)"`))
	check(t, "oom", got, "exit code: 137\nnote: the command was killed by the out-of-memory killer: the sandbox ran out of memory\n[stdout]\nallocating\n[stderr]\nKilled\n")
	check(t, "after oom", call(t, set, tools.ExecuteBash, args("command", "echo ok")), "exit code: 0\n[stdout]\nok\n")
}

const appPy = `import sys

def greet(name):
    print("hello", name)

greet(sys.argv[1])
`

func TestEditor(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	ed := func(kv ...any) string {
		t.Helper()
		return call(t, set, tools.Editor, args(kv...))
	}
	const p = "/workspace/src/app.py"

	check(t, "create", ed("command", "create", "path", p, "file_text", appPy),
		"File created successfully at: /workspace/src/app.py (6 lines).")
	check(t, "content", mustExec(t, sb, "cat "+p), appPy)
	check(t, "view", ed("command", "view", "path", p),
		"Here's the result of running `cat -n` on /workspace/src/app.py:\n"+
			"     1\timport sys\n"+
			"     2\t\n"+
			"     3\tdef greet(name):\n"+
			"     4\t    print(\"hello\", name)\n"+
			"     5\t\n"+
			"     6\tgreet(sys.argv[1])\n")
	check(t, "view_range", ed("command", "view", "path", p, "view_range", []int{3, 4}),
		"Here's the result of running `cat -n` on /workspace/src/app.py:\n"+
			"     3\tdef greet(name):\n"+
			"     4\t    print(\"hello\", name)\n")
	check(t, "view_range to the end", ed("command", "view", "path", p, "view_range", []int{5, -1}),
		"Here's the result of running `cat -n` on /workspace/src/app.py:\n     5\t\n     6\tgreet(sys.argv[1])\n")
	check(t, "view_range past the end", ed("command", "view", "path", p, "view_range", []int{6, 100}),
		"Here's the result of running `cat -n` on /workspace/src/app.py:\n     6\tgreet(sys.argv[1])\n")
	check(t, "view_range start past the end", ed("command", "view", "path", p, "view_range", []int{7, 9}),
		"Error: Invalid view_range [7, 9]: /workspace/src/app.py has 6 lines, so start must be between 1 and 6.")
	check(t, "view_range backwards", ed("command", "view", "path", p, "view_range", []int{4, 2}),
		"Error: Invalid view_range [4, 2]: start must be 1 or more, and end -1 or at least start.")

	check(t, "str_replace", ed("command", "str_replace", "path", p,
		"old_str", `    print("hello", name)`, "new_str", "    msg = \"hello \" + name\n    print(msg)"),
		"The file /workspace/src/app.py has been edited. Here's the result of running `cat -n` on a snippet of /workspace/src/app.py:\n"+
			"     1\timport sys\n"+
			"     2\t\n"+
			"     3\tdef greet(name):\n"+
			"     4\t    msg = \"hello \" + name\n"+
			"     5\t    print(msg)\n"+
			"     6\t\n"+
			"     7\tgreet(sys.argv[1])\n"+
			"Review the changes and make sure they are as expected. Edit the file again if necessary.")
	check(t, "run", call(t, set, tools.ExecuteBash, args("command", "cd src && sh -c 'echo would run app.py'")),
		"exit code: 0\n[stdout]\nwould run app.py\n")
	check(t, "no occurrence", ed("command", "str_replace", "path", p, "old_str", "print(name)", "new_str", "x"),
		"Error: No replacement was performed: old_str did not appear verbatim in /workspace/src/app.py. View the file to copy the exact text, whitespace and indentation included.")
	check(t, "two occurrences", ed("command", "str_replace", "path", p, "old_str", "name", "new_str", "who"),
		"Error: No replacement was performed: old_str has 2 occurrences in /workspace/src/app.py, in lines 3, 4 — make old_str unique by including more of the surrounding lines.")
	check(t, "same text", ed("command", "str_replace", "path", p, "old_str", "import sys", "new_str", "import sys"),
		"Error: old_str and new_str are the same, so there is nothing to replace.")
	check(t, "delete", ed("command", "str_replace", "path", p, "old_str", "import sys\n\n"),
		"The file /workspace/src/app.py has been edited. Here's the result of running `cat -n` on a snippet of /workspace/src/app.py:\n"+
			"     1\tdef greet(name):\n"+
			"     2\t    msg = \"hello \" + name\n"+
			"     3\t    print(msg)\n"+
			"     4\t\n"+
			"     5\tgreet(sys.argv[1])\n"+
			"Review the changes and make sure they are as expected. Edit the file again if necessary.")

	check(t, "insert at top", ed("command", "insert", "path", p, "insert_line", 0, "new_str", "import os\nimport sys"),
		"The file /workspace/src/app.py has been edited. Here's the result of running `cat -n` on a snippet of /workspace/src/app.py:\n"+
			"     1\timport os\n"+
			"     2\timport sys\n"+
			"     3\tdef greet(name):\n"+
			"     4\t    msg = \"hello \" + name\n"+
			"     5\t    print(msg)\n"+
			"     6\t\n"+
			"Review the changes and make sure they are as expected (correct indentation, no duplicated lines). Edit the file again if necessary.")
	check(t, "insert at end", ed("command", "insert", "path", p, "insert_line", 7, "new_str", "greet(\"world\")\n"),
		"The file /workspace/src/app.py has been edited. Here's the result of running `cat -n` on a snippet of /workspace/src/app.py:\n"+
			"     4\t    msg = \"hello \" + name\n"+
			"     5\t    print(msg)\n"+
			"     6\t\n"+
			"     7\tgreet(sys.argv[1])\n"+
			"     8\tgreet(\"world\")\n"+
			"Review the changes and make sure they are as expected (correct indentation, no duplicated lines). Edit the file again if necessary.")
	check(t, "insert out of range", ed("command", "insert", "path", p, "insert_line", 20, "new_str", "x"),
		"Error: Invalid insert_line 20: it must be between 0 and 8, the number of lines in /workspace/src/app.py.")
	check(t, "content after edits", mustExec(t, sb, "cat "+p),
		"import os\nimport sys\ndef greet(name):\n    msg = \"hello \" + name\n    print(msg)\n\ngreet(sys.argv[1])\ngreet(\"world\")\n")

	// Undo walks back through every edit, then removes the created file.
	check(t, "undo insert", ed("command", "undo_edit", "path", p),
		"Last edit to /workspace/src/app.py undone. Here's the result of running `cat -n` on /workspace/src/app.py:\n"+
			"     1\timport os\n     2\timport sys\n     3\tdef greet(name):\n     4\t    msg = \"hello \" + name\n"+
			"     5\t    print(msg)\n     6\t\n     7\tgreet(sys.argv[1])\n")
	for i := 0; i < 3; i++ {
		ed("command", "undo_edit", "path", p)
	}
	check(t, "content after undos", mustExec(t, sb, "cat "+p), appPy)
	check(t, "undo create", ed("command", "undo_edit", "path", p),
		"Last edit to /workspace/src/app.py undone: the file did not exist before it was created, so it was removed.")
	check(t, "removed", mustExec(t, sb, "ls /workspace/src"), "")
	check(t, "no history", ed("command", "undo_edit", "path", p),
		"Error: No edit history for /workspace/src/app.py: undo_edit reverts the last create, str_replace or insert made on it with this tool.")
	check(t, "view missing", ed("command", "view", "path", p), "Error: The path /workspace/src/app.py does not exist.")
	check(t, "str_replace missing", ed("command", "str_replace", "path", p, "old_str", "a", "new_str", "b"),
		"Error: The path /workspace/src/app.py does not exist.")
	check(t, "insert missing", ed("command", "insert", "path", p, "insert_line", 0, "new_str", "b"),
		"Error: The path /workspace/src/app.py does not exist.")

	// create overwrites, keeping the permission bits; undo brings it back.
	mustExec(t, sb, "printf '#!/bin/sh\\necho old\\n' > run.sh && chmod 750 run.sh")
	check(t, "overwrite", ed("command", "create", "path", "/workspace/run.sh", "file_text", "#!/bin/sh\necho new\n"),
		"File overwritten: /workspace/run.sh (2 lines). Its previous content was replaced; undo_edit brings it back.")
	check(t, "run new", mustExec(t, sb, "./run.sh; stat -c %a run.sh"), "new\n750\n")
	ed("command", "str_replace", "path", "/workspace/run.sh", "old_str", "new", "new_str", "newer")
	check(t, "mode kept by str_replace", mustExec(t, sb, "./run.sh; stat -c %a run.sh"), "newer\n750\n")
	ed("command", "undo_edit", "path", "/workspace/run.sh")
	ed("command", "undo_edit", "path", "/workspace/run.sh")
	check(t, "run old", mustExec(t, sb, "./run.sh; stat -c %a run.sh"), "old\n750\n")

	// Empty files, Windows line endings.
	check(t, "create empty", ed("command", "create", "path", "/workspace/empty.txt", "file_text", ""),
		"File created successfully at: /workspace/empty.txt (0 lines).")
	check(t, "view empty", ed("command", "view", "path", "/workspace/empty.txt", "view_range", []int{1, 5}),
		"Here's the result of running `cat -n` on /workspace/empty.txt:\n(the file is empty)\n")
	check(t, "insert into empty", ed("command", "insert", "path", "/workspace/empty.txt", "insert_line", 0, "new_str", "first"),
		"The file /workspace/empty.txt has been edited. Here's the result of running `cat -n` on a snippet of /workspace/empty.txt:\n"+
			"     1\tfirst\n"+
			"Review the changes and make sure they are as expected (correct indentation, no duplicated lines). Edit the file again if necessary.")
	check(t, "delete everything", ed("command", "str_replace", "path", "/workspace/empty.txt", "old_str", "first\n", "new_str", ""),
		"The file /workspace/empty.txt has been edited. It is now empty.\nReview the changes and make sure they are as expected. Edit the file again if necessary.")
	mustExec(t, sb, `printf 'a = 1\r\nb = 2\r\n' > crlf.txt`)
	check(t, "crlf", ed("command", "str_replace", "path", "/workspace/crlf.txt", "old_str", "a = 1\nb = 2", "new_str", "x"),
		"Error: No replacement was performed: old_str did not appear verbatim in /workspace/crlf.txt. Note: the file has Windows line endings (\\r\\n). View the file to copy the exact text, whitespace and indentation included.")
}

func TestEditorPaths(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	ed := func(kv ...any) string {
		t.Helper()
		return call(t, set, tools.Editor, args(kv...))
	}
	mustExec(t, sb, `mkdir -p proj/pkg/deep/deeper proj/.git/objects proj/empty
echo 'x' > proj/main.py; echo y > proj/pkg/util.py; echo z > proj/pkg/deep/deeper/f.py; echo h > proj/.env
echo g > proj/.git/HEAD; echo n > proj/pkg/.hidden; ln -s pkg proj/link`)
	check(t, "directory", ed("command", "view", "path", "/workspace/proj"),
		"Here's the files and directories up to 2 levels deep in /workspace/proj, excluding hidden items:\n"+
			"/workspace/proj/\n"+
			"/workspace/proj/empty/\n"+
			"/workspace/proj/link\n"+
			"/workspace/proj/main.py\n"+
			"/workspace/proj/pkg/\n"+
			"/workspace/proj/pkg/deep/\n"+
			"/workspace/proj/pkg/util.py\n")
	check(t, "directory with trailing slash", ed("command", "view", "path", "/workspace/proj/pkg/"),
		"Here's the files and directories up to 2 levels deep in /workspace/proj/pkg, excluding hidden items:\n"+
			"/workspace/proj/pkg/\n"+
			"/workspace/proj/pkg/deep/\n"+
			"/workspace/proj/pkg/deep/deeper/\n"+
			"/workspace/proj/pkg/util.py\n")
	check(t, "view_range on a directory", ed("command", "view", "path", "/workspace/proj", "view_range", []int{1, 2}),
		"Error: view_range cannot be used when path is a directory.")
	check(t, "create on a directory", ed("command", "create", "path", "/workspace/proj", "file_text", "x"),
		"Error: The path /workspace/proj is a directory; create needs a file path.")
	check(t, "str_replace on a directory", ed("command", "str_replace", "path", "/workspace/proj", "old_str", "x"),
		"Error: The path /workspace/proj is a directory; str_replace needs a file.")
	check(t, "relative path", ed("command", "view", "path", "proj/main.py"),
		"Error: The path proj/main.py is not an absolute path; it must start with `/`. Maybe you meant /workspace/proj/main.py?")
	check(t, "unclean path", ed("command", "view", "path", "/workspace/proj/../proj/./main.py"),
		"Here's the result of running `cat -n` on /workspace/proj/main.py:\n     1\tx\n")
	check(t, "through a symlink", ed("command", "view", "path", "/workspace/proj/link/util.py"),
		"Here's the result of running `cat -n` on /workspace/proj/link/util.py:\n     1\ty\n")

	// Anywhere in the sandbox: /tmp (a tmpfs), the image's files, /proc.
	check(t, "create in /tmp", ed("command", "create", "path", "/tmp/notes/a.txt", "file_text", "one\ntwo\n"),
		"File created successfully at: /tmp/notes/a.txt (2 lines).")
	check(t, "edit in /tmp", ed("command", "str_replace", "path", "/tmp/notes/a.txt", "old_str", "two", "new_str", "three"),
		"The file /tmp/notes/a.txt has been edited. Here's the result of running `cat -n` on a snippet of /tmp/notes/a.txt:\n"+
			"     1\tone\n     2\tthree\n"+
			"Review the changes and make sure they are as expected. Edit the file again if necessary.")
	check(t, "view image file", ed("command", "view", "path", "/etc/group"),
		"Here's the result of running `cat -n` on /etc/group:\n     1\troot:x:0:\n     2\tsandbox:x:1000:\n")
	check(t, "read-only root", ed("command", "create", "path", "/etc/motd", "file_text", "hi"),
		"Error: Cannot write /etc/motd: read-only file system.")
	check(t, "read-only parent", ed("command", "create", "path", "/opt/tool/x.txt", "file_text", "hi"),
		"Error: Cannot create directory /opt/tool: /opt: read-only file system.")
	if got := ed("command", "view", "path", "/proc/meminfo"); !strings.HasPrefix(got, "Here's the result of running `cat -n` on /proc/meminfo:\n     1\tMemTotal:") {
		t.Errorf("view /proc/meminfo = %q", got)
	}
	// /proc/self is the agent's for file operations: refused, as it is to
	// commands, also through a link the sandbox planted.
	check(t, "agent's /proc", ed("command", "view", "path", "/proc/self/status"),
		"Error: Cannot access /proc/self/status: permission denied.")
	mustExec(t, sb, "ln -s /proc/self/maps /workspace/notes.txt")
	check(t, "link to the agent's /proc", ed("command", "view", "path", "/workspace/notes.txt"),
		"Error: Cannot access /workspace/notes.txt: permission denied.")
	check(t, "device", ed("command", "view", "path", "/dev/zero"),
		"Error: /dev/zero is not a regular file (a device); str_replace_editor handles text files and directories.")
	check(t, "missing parent", ed("command", "view", "path", "/nonexistent/dir/file"),
		"Error: The path /nonexistent/dir/file does not exist.")
}

func TestEditorLargeAndBinary(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	ed := func(kv ...any) string {
		t.Helper()
		return call(t, set, tools.Editor, args(kv...))
	}
	mustExec(t, sb, `printf '\211PNG\r\n\032\n\000\000\000\rIHDR' > image.png
printf 'caf\351\n' > latin1.txt
seq 1 100000 > big.txt
awk 'BEGIN { while (i++ < 20000) printf "x"; print "" }' > wide.txt`)
	check(t, "binary", ed("command", "view", "path", "/workspace/image.png"),
		"Error: /workspace/image.png is a binary file (16 bytes), so it is not shown: str_replace_editor handles text only. Use execute_bash to inspect it, for example `od -c /workspace/image.png | head`.")
	check(t, "invalid UTF-8", ed("command", "view", "path", "/workspace/latin1.txt"),
		"Error: /workspace/latin1.txt is a binary file (5 bytes), so it is not shown: str_replace_editor handles text only. Use execute_bash to inspect it, for example `od -c /workspace/latin1.txt | head`.")
	check(t, "str_replace binary", ed("command", "str_replace", "path", "/workspace/image.png", "old_str", "PNG", "new_str", "GIF"),
		"Error: /workspace/image.png is a binary file (16 bytes), so it is not shown: str_replace_editor handles text only. Use execute_bash to inspect it, for example `od -c /workspace/image.png | head`.")

	// 100000 lines: the first view stops at 16 KiB (lines of 7 to 13 bytes).
	got := ed("command", "view", "path", "/workspace/big.txt")
	var want strings.Builder
	n := 0
	for i := 1; ; i++ {
		line := fmt.Sprintf("%6d\t%d\n", i, i)
		if want.Len()+len(line) > 16384 {
			break
		}
		want.WriteString(line)
		n = i
	}
	body := want.String()
	want.Reset()
	want.WriteString("Here's the result of running `cat -n` on /workspace/big.txt:\n" + body)
	fmt.Fprintf(&want, "[Showing lines 1-%d of 100000: one view shows at most 2000 lines and 16384 bytes. Use view_range to see more, e.g. [%d, %d].]\n", n, n+1, 2*n)
	check(t, "big", got, want.String())
	if n < 1300 || n > 1500 {
		t.Errorf("a view showed %d lines", n)
	}
	check(t, "big view_range", ed("command", "view", "path", "/workspace/big.txt", "view_range", []int{99999, -1}),
		"Here's the result of running `cat -n` on /workspace/big.txt:\n 99999\t99999\n100000\t100000\n")
	got = ed("command", "view", "path", "/workspace/wide.txt")
	wantWide := "Here's the result of running `cat -n` on /workspace/wide.txt:\n     1\t" + strings.Repeat("x", 16384-7) +
		" [... line 1 cut: 3623 more bytes not shown]\n"
	check(t, "wide", got, wantWide)

	// Files above 32 MiB are refused whole; a view_range does not help.
	mustExec(t, sb, "dd if=/dev/zero bs=1M count=33 2>/dev/null | tr '\\0' 'a' > huge.txt")
	check(t, "huge", ed("command", "view", "path", "/workspace/huge.txt", "view_range", []int{1, 2}),
		"Error: /workspace/huge.txt is 34603008 bytes, too large for str_replace_editor (at most 33554432). Use execute_bash to work on parts of it (head, tail, grep -n, sed -n '100,200p').")
}

// TestMalformed sends the mistakes models make and checks the exact message
// each gets, and that the Set keeps working.
func TestMalformed(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	mustExec(t, sb, "printf 'a = 1\\nb = 2\\na = 1\\n' > dup.py")
	for _, tc := range []struct{ name, tool, args, want string }{
		{"unknown tool", "jupyter", `{"code": "print(1)"}`,
			`Error: Unknown tool "jupyter". The tools are: execute_bash, terminal, python, str_replace_editor, submit.`},
		{"empty tool name", "", `{}`,
			`Error: Unknown tool "". The tools are: execute_bash, terminal, python, str_replace_editor, submit.`},
		{"truncated JSON", tools.ExecuteBash, `{"command": "ls`,
			`Error: The arguments of execute_bash are not valid JSON (unexpected end of JSON input, at byte 15). Send one JSON object, for example {"command": "ls -la"}.`},
		{"trailing garbage", tools.ExecuteBash, `{"command": "ls"} x`,
			`Error: The arguments of execute_bash are not valid JSON (invalid character 'x' after top-level value, at byte 19). Send one JSON object, for example {"command": "ls -la"}.`},
		{"array", tools.ExecuteBash, `["ls"]`,
			`Error: The arguments of execute_bash must be a JSON object, for example {"command": "ls -la"}; got an array.`},
		{"bare string", tools.Editor, `"view /workspace"`,
			`Error: The arguments of str_replace_editor must be a JSON object, for example {"command": "view", "path": "/workspace"}; got a string.`},
		{"missing command", tools.ExecuteBash, `{}`,
			"Error: Parameter `command` is required for execute_bash: the shell command to run."},
		{"empty arguments", tools.ExecuteBash, ``,
			"Error: Parameter `command` is required for execute_bash: the shell command to run."},
		{"blank command", tools.ExecuteBash, `{"command": "  "}`,
			"Error: Parameter `command` is empty: give the shell command to run."},
		{"command not a string", tools.ExecuteBash, `{"command": ["ls", "-l"]}`,
			"Error: Parameter `command` must be a string, got an array."},
		{"NUL in command", tools.ExecuteBash, `{"command": "echo a\u0000b"}`,
			"Error: The command contains a NUL byte, which a shell command cannot hold."},
		{"unknown parameter", tools.ExecuteBash, `{"command": "ls", "cwd": "/tmp"}`,
			"Error: Unknown parameter \"cwd\" for execute_bash. Its parameters are: command, timeout."},
		{"two unknown parameters", tools.Submit, `{"answer": "1", "b": 1, "a": 2}`,
			"Error: Unknown parameters \"a\", \"b\" for submit. Its parameters are: answer."},
		{"negative timeout", tools.ExecuteBash, `{"command": "ls", "timeout": -5}`,
			"Error: Parameter `timeout` must be a number of seconds greater than 0 and at most 86400, got -5."},
		{"timeout not a number", tools.ExecuteBash, `{"command": "ls", "timeout": "soon"}`,
			"Error: Parameter `timeout` must be a number, got a string."},
		{"editor without command", tools.Editor, `{"path": "/workspace"}`,
			"Error: Parameter `command` is required for str_replace_editor: one of view, create, str_replace, insert, undo_edit."},
		{"editor unknown command", tools.Editor, `{"command": "delete", "path": "/workspace/dup.py"}`,
			"Error: Unknown command \"delete\" for str_replace_editor. The commands are: view, create, str_replace, insert, undo_edit."},
		{"editor without path", tools.Editor, `{"command": "view"}`,
			"Error: Parameter `path` is required for command view: an absolute path such as /workspace/main.py."},
		{"relative path", tools.Editor, `{"command": "view", "path": "dup.py"}`,
			"Error: The path dup.py is not an absolute path; it must start with `/`. Maybe you meant /workspace/dup.py?"},
		{"create without file_text", tools.Editor, `{"command": "create", "path": "/workspace/x.py"}`,
			"Error: Parameter `file_text` is required for command create."},
		{"str_replace without old_str", tools.Editor, `{"command": "str_replace", "path": "/workspace/dup.py", "new_str": "x"}`,
			"Error: Parameter `old_str` is required for command str_replace."},
		{"str_replace with empty old_str", tools.Editor, `{"command": "str_replace", "path": "/workspace/dup.py", "old_str": ""}`,
			"Error: Parameter `old_str` is empty: give the exact text to replace, with enough surrounding lines to be unique."},
		{"str_replace no match", tools.Editor, `{"command": "str_replace", "path": "/workspace/dup.py", "old_str": "c = 3", "new_str": "c = 4"}`,
			"Error: No replacement was performed: old_str did not appear verbatim in /workspace/dup.py. View the file to copy the exact text, whitespace and indentation included."},
		{"str_replace two matches", tools.Editor, `{"command": "str_replace", "path": "/workspace/dup.py", "old_str": "a = 1", "new_str": "a = 2"}`,
			"Error: No replacement was performed: old_str has 2 occurrences in /workspace/dup.py, in lines 1, 3 — make old_str unique by including more of the surrounding lines."},
		{"insert without insert_line", tools.Editor, `{"command": "insert", "path": "/workspace/dup.py", "new_str": "x"}`,
			"Error: Parameter `insert_line` is required for command insert: the line after which to insert (0 for the top)."},
		{"insert_line not an integer", tools.Editor, `{"command": "insert", "path": "/workspace/dup.py", "insert_line": 1.5, "new_str": "x"}`,
			"Error: Parameter `insert_line` must be an integer, got 1.5."},
		{"negative insert_line", tools.Editor, `{"command": "insert", "path": "/workspace/dup.py", "insert_line": -1, "new_str": "x"}`,
			"Error: Parameter `insert_line` must be 0 or more, got -1."},
		{"huge insert_line", tools.Editor, `{"command": "insert", "path": "/workspace/dup.py", "insert_line": 1e300, "new_str": "x"}`,
			"Error: Parameter `insert_line` is out of range: 1e300."},
		{"insert without new_str", tools.Editor, `{"command": "insert", "path": "/workspace/dup.py", "insert_line": 1}`,
			"Error: Parameter `new_str` is required for command insert."},
		{"view_range of one number", tools.Editor, `{"command": "view", "path": "/workspace/dup.py", "view_range": [3]}`,
			"Error: Parameter `view_range` must be two integers [start, end] (end -1 means the end of the file), got [3]."},
		{"view_range of strings", tools.Editor, `{"command": "view", "path": "/workspace/dup.py", "view_range": "1-3"}`,
			"Error: Parameter `view_range` must be two integers [start, end] (end -1 means the end of the file), got \"1-3\"."},
		{"view_range from 0", tools.Editor, `{"command": "view", "path": "/workspace/dup.py", "view_range": [0, 2]}`,
			"Error: Invalid view_range [0, 2]: start must be 1 or more, and end -1 or at least start."},
		{"path not a string", tools.Editor, `{"command": "view", "path": 7}`,
			"Error: Parameter `path` must be a string, got a number."},
		{"NUL in path", tools.Editor, `{"command": "view", "path": "/workspace/a\u0000b"}`,
			"Error: The path contains a NUL byte."},
		{"submit without answer", tools.Submit, `{}`,
			"Error: Parameter `answer` is required for submit: your final answer."},
		{"submit answer not a string", tools.Submit, `{"answer": 42}`,
			"Error: Parameter `answer` must be a string, got a number."},
		// Lenient where the meaning is clear.
		{"null parameters", tools.Editor, `{"command": "view", "path": "/workspace/dup.py", "view_range": null, "old_str": null}`,
			"Here's the result of running `cat -n` on /workspace/dup.py:\n     1\ta = 1\n     2\tb = 2\n     3\ta = 1\n"},
		{"arguments encoded twice", tools.ExecuteBash, `"{\"command\": \"echo twice\"}"`,
			"exit code: 0\n[stdout]\ntwice\n"},
		{"numbers as strings", tools.Editor, `{"command": "view", "path": "/workspace/dup.py", "view_range": ["2", "2"]}`,
			"Here's the result of running `cat -n` on /workspace/dup.py:\n     2\tb = 2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, tc.name, call(t, set, tc.tool, tc.args), tc.want)
		})
	}
	check(t, "file unchanged", mustExec(t, sb, "cat dup.py"), "a = 1\nb = 2\na = 1\n")
	if _, ok := set.Submitted(); ok {
		t.Error("a rejected submit counts as submitted")
	}
}

func TestSubmit(t *testing.T) {
	t.Parallel()
	set := tools.New(nil) // submit needs no sandbox
	if a, ok := set.Submitted(); ok || a != "" {
		t.Fatalf("Submitted() = %q, %v before any call", a, ok)
	}
	check(t, "first", call(t, set, tools.Submit, `{"answer": "42"}`),
		"Answer recorded. The task is finished; no more tool calls are needed.")
	if a, ok := set.Submitted(); !ok || a != "42" {
		t.Errorf("Submitted() = %q, %v", a, ok)
	}
	check(t, "second", call(t, set, tools.Submit, `{"answer": ""}`),
		"Answer recorded, replacing the one submitted before. The task is finished; no more tool calls are needed.")
	if a, ok := set.Submitted(); !ok || a != "" {
		t.Errorf("Submitted() = %q, %v", a, ok)
	}
	if _, err := set.Call(context.Background(), tools.ExecuteBash, `{"command": "ls"}`); err == nil {
		t.Error("execute_bash without a sandbox: no error")
	}
	check(t, "relative path without a sandbox", call(t, set, tools.Editor, `{"command": "view", "path": "a"}`),
		"Error: The path a is not an absolute path; it must start with `/`.")
}

func TestSandboxFailures(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	call(t, set, tools.Editor, args("command", "create", "path", "/workspace/a.txt", "file_text", "a\n"))

	// A cancelled context ends a running command and is an error.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var out string
	var err error
	go func() {
		defer close(done)
		out, err = set.Call(ctx, tools.ExecuteBash, args("command", "echo started; sleep 30"))
	}()
	// The sleep itself, not the shell whose arguments also say "sleep 30":
	// once it runs, "started" has been written.
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		ps := mustExec(t, sb, "ps -o args")
		return slices.Contains(strings.Split(ps, "\n"), "sleep 30"), "the command never started:\n" + ps
	})
	start := time.Now()
	cancel()
	<-done
	if d := time.Since(start); d > testenv.HangGuard {
		t.Errorf("Call returned %v after cancel", d)
	} else {
		t.Logf("Call returned %v after cancel", d)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	check(t, "cancelled", out, "exit code: 137\nnote: the command was killed because the episode was cancelled\n[stdout]\nstarted\n")
	if _, err := set.Call(ctx, tools.Editor, args("command", "view", "path", "/workspace/a.txt")); !errors.Is(err, context.Canceled) {
		t.Errorf("view with a cancelled ctx: err = %v", err)
	}

	// After Close, every sandbox tool fails with ErrClosed; mistakes and
	// submit still answer.
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tool, args string }{
		{tools.ExecuteBash, args("command", "echo hi")},
		{tools.Editor, args("command", "view", "path", "/workspace/a.txt")},
		{tools.Editor, args("command", "view", "path", "/workspace")},
		{tools.Editor, args("command", "create", "path", "/workspace/b.txt", "file_text", "b")},
		{tools.Editor, args("command", "str_replace", "path", "/workspace/a.txt", "old_str", "a", "new_str", "b")},
		{tools.Editor, args("command", "insert", "path", "/workspace/a.txt", "insert_line", 0, "new_str", "b")},
		{tools.Editor, args("command", "undo_edit", "path", "/workspace/a.txt")},
	} {
		out, err := set.Call(testCtx(t), c.tool, c.args)
		if !errors.Is(err, sandbox.ErrClosed) || out != "" {
			t.Errorf("%s %s after Close: %q, %v; want ErrClosed", c.tool, c.args, out, err)
		}
	}
	// The failed undo kept its history entry.
	check(t, "mistake after close", call(t, set, tools.Editor, `{"command": "view"}`),
		"Error: Parameter `path` is required for command view: an absolute path such as /workspace/main.py.")
	check(t, "relative path after close", call(t, set, tools.Editor, `{"command": "view", "path": "x"}`),
		"Error: The path x is not an absolute path; it must start with `/`.")
	check(t, "submit after close", call(t, set, tools.Submit, `{"answer": "done"}`),
		"Answer recorded. The task is finished; no more tool calls are needed.")
}

// TestConcurrent runs tool calls from many goroutines on one Set: edits of
// one file are serialised, so none is lost.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	set, sb := newSet(t)
	const n = 8
	var text strings.Builder
	for i := range n {
		fmt.Fprintf(&text, "line %d = old\n", i)
	}
	call(t, set, tools.Editor, args("command", "create", "path", "/workspace/shared.txt", "file_text", text.String()))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := call(t, set, tools.Editor, args("command", "str_replace", "path", "/workspace/shared.txt",
				"old_str", fmt.Sprintf("line %d = old", i), "new_str", fmt.Sprintf("line %d = new", i)))
			if !strings.HasPrefix(got, "The file /workspace/shared.txt has been edited.") {
				t.Errorf("edit %d: %q", i, got)
			}
			own := fmt.Sprintf("/workspace/own%d.txt", i)
			call(t, set, tools.Editor, args("command", "create", "path", own, "file_text", "mine\n"))
			check(t, "bash", call(t, set, tools.ExecuteBash, args("command", "cat "+own)), "exit code: 0\n[stdout]\nmine\n")
		}()
	}
	wg.Wait()
	check(t, "all edits kept", mustExec(t, sb, "cat shared.txt"), strings.ReplaceAll(text.String(), "old", "new"))
	for range n {
		call(t, set, tools.Editor, args("command", "undo_edit", "path", "/workspace/shared.txt"))
	}
	check(t, "all undone", mustExec(t, sb, "cat shared.txt"), text.String())
}
