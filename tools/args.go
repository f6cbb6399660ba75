package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file is the argument layer: it turns a tool name and the JSON
// arguments a model sent into a checked call, or into the message that
// tells the model what was wrong. It never touches a sandbox, so it can be
// fuzzed on its own.

// mistake is a mistake of the model: its text is shown to the model as the
// tool's result.
type mistake string

func (m mistake) Error() string { return string(m) }

// mistakef formats a mistake; the text gets the "Error: " prefix.
func mistakef(format string, a ...any) mistake {
	// What the model sent may hold invalid UTF-8 (JSON strings can carry
	// it through): the message goes back to the model as text.
	return mistake(strings.ToValidUTF8("Error: "+fmt.Sprintf(format, a...), "\uFFFD"))
}

// relPathError is a relative path given to str_replace_editor; the message
// suggests the absolute path, which needs the sandbox's working directory.
type relPathError struct{ path string }

func (e *relPathError) Error() string { return e.message("") }

func (e *relPathError) message(workdir string) string {
	msg := fmt.Sprintf("Error: The path %s is not an absolute path; it must start with `/`.", e.path)
	if workdir != "" {
		msg += fmt.Sprintf(" Maybe you meant %s?", path.Join(workdir, e.path))
	}
	return msg
}

// bashCall is a checked execute_bash call.
type bashCall struct {
	command string
	timeout time.Duration // 0: the Set's default
}

// terminalCall is a checked terminal call.
type terminalCall struct {
	text    string
	keys    []string
	waitFor *regexp.Regexp // nil: wait for the screen to settle
	timeout time.Duration  // 0: the default
	restart bool
}

// pythonCall is a checked python call.
type pythonCall struct {
	code    string
	timeout time.Duration // 0: the Set's default
}

// editorCall is a checked str_replace_editor call. Pointers are nil for
// parameters that were not given (or were null).
type editorCall struct {
	command    string
	path       string // absolute and clean
	fileText   *string
	oldStr     *string
	newStr     *string
	insertLine *int
	viewRange  []int // nil, or exactly two numbers
}

// submitCall is a checked submit call.
type submitCall struct{ answer string }

// maxTimeout bounds the timeout a model may ask for; the sandbox's own
// Limits.ExecTimeout still applies on top.
const maxTimeout = 24 * time.Hour

// Editor commands.
const (
	cmdView       = "view"
	cmdCreate     = "create"
	cmdStrReplace = "str_replace"
	cmdInsert     = "insert"
	cmdUndoEdit   = "undo_edit"
)

var editorCommands = []string{cmdView, cmdCreate, cmdStrReplace, cmdInsert, cmdUndoEdit}

// parameter names of each tool, in the order they are listed to the model.
var (
	bashParams   = []string{"command", "timeout"}
	termParams   = []string{"text", "keys", "wait_for", "timeout", "restart"}
	pythonParams = []string{"code", "timeout"}
	editorParams = []string{"command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"}
	submitParams = []string{"answer"}
)

// argExamples are shown when the arguments are not a JSON object.
var argExamples = map[string]string{
	ExecuteBash: `{"command": "ls -la"}`,
	Terminal:    `{"text": "python3\n"}`,
	Python:      `{"code": "print(1 + 1)"}`,
	Editor:      `{"command": "view", "path": "/workspace"}`,
	Submit:      `{"answer": "42"}`,
}

// parse checks a call and returns a bashCall, editorCall or submitCall, or
// an error that is a mistake or a *relPathError. It never panics.
func parse(name, argsJSON string) (any, error) {
	var params []string
	switch name {
	case ExecuteBash:
		params = bashParams
	case Terminal:
		params = termParams
	case Python:
		params = pythonParams
	case Editor:
		params = editorParams
	case Submit:
		params = submitParams
	default:
		return nil, mistakef("Unknown tool %s. The tools are: %s, %s, %s, %s, %s.", quote(name), ExecuteBash, Terminal, Python, Editor, Submit)
	}
	args, err := decodeObject(name, argsJSON, params)
	if err != nil {
		return nil, err
	}
	switch name {
	case ExecuteBash:
		return parseBash(args)
	case Terminal:
		return parseTerminal(args)
	case Python:
		return parsePython(args)
	case Editor:
		return parseEditor(args)
	default:
		return parseSubmit(args)
	}
}

// quote quotes a name the model sent, bounding its length.
func quote(s string) string {
	if len(s) > 80 {
		s = truncateUTF8(s, 80) + "..."
	}
	return strconv.Quote(s)
}

// decodeObject decodes the arguments as a JSON object whose keys are all
// in params. Empty arguments count as {}; a JSON string holding an object
// (arguments encoded twice, which some models do) is unwrapped once.
func decodeObject(tool, raw string, params []string) (map[string]json.RawMessage, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" || raw == "null" {
		return map[string]json.RawMessage{}, nil
	}
	var s string
	if raw[0] == '"' && json.Unmarshal([]byte(raw), &s) == nil {
		if inner := strings.TrimSpace(s); strings.HasPrefix(inner, "{") {
			raw = inner
		}
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, mistakef("The arguments of %s are not valid JSON (%v, at byte %d). Send one JSON object, for example %s.",
				tool, se, se.Offset, argExamples[tool])
		}
		return nil, mistakef("The arguments of %s must be a JSON object, for example %s; got %s.",
			tool, argExamples[tool], kind(json.RawMessage(raw)))
	}
	if args == nil { // "null" inside a string
		args = map[string]json.RawMessage{}
	}
	var unknown []string
	for k := range args {
		if !slices.Contains(params, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		for i, k := range unknown {
			unknown[i] = quote(k)
		}
		word := "parameter"
		if len(unknown) > 1 {
			word = "parameters"
		}
		return nil, mistakef("Unknown %s %s for %s. Its parameters are: %s.",
			word, strings.Join(unknown, ", "), tool, strings.Join(params, ", "))
	}
	return args, nil
}

// kind names the JSON type of a value, for messages.
func kind(v json.RawMessage) string {
	t := strings.TrimSpace(string(v))
	if t == "" {
		return "nothing"
	}
	switch t[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

func isNull(v json.RawMessage) bool { return strings.TrimSpace(string(v)) == "null" }

// str returns the string parameter key; ok is false when it is absent or
// null.
func str(args map[string]json.RawMessage, key string) (s string, ok bool, err error) {
	v, present := args[key]
	if !present || isNull(v) {
		return "", false, nil
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false, mistakef("Parameter `%s` must be a string, got %s.", key, kind(v))
	}
	return s, true, nil
}

// number returns the numeric parameter key, also accepting a string that
// holds a number; ok is false when it is absent or null.
func number(args map[string]json.RawMessage, key string) (f float64, ok bool, err error) {
	v, present := args[key]
	if !present || isNull(v) {
		return 0, false, nil
	}
	f, err = toNumber(v)
	if err != nil {
		return 0, false, mistakef("Parameter `%s` must be a number, got %s.", key, kind(v))
	}
	return f, true, nil
}

func toNumber(v json.RawMessage) (float64, error) {
	var f float64
	if err := json.Unmarshal(v, &f); err == nil {
		return f, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return 0, errors.New("not a number")
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, errors.New("not a number")
	}
	return f, nil
}

// maxLine bounds line numbers so that arithmetic on them cannot overflow.
const maxLine = 1 << 30

// integer returns the integer parameter key; ok is false when it is absent
// or null.
func integer(args map[string]json.RawMessage, key string) (n int, ok bool, err error) {
	v, present := args[key]
	if !present || isNull(v) {
		return 0, false, nil
	}
	f, err := toNumber(v)
	if err != nil || f != math.Trunc(f) {
		return 0, false, mistakef("Parameter `%s` must be an integer, got %s.", key, describe(v))
	}
	if f < -maxLine || f > maxLine {
		return 0, false, mistakef("Parameter `%s` is out of range: %s.", key, describe(v))
	}
	return int(f), true, nil
}

// describe shows a short value the model sent, or its kind if long.
func describe(v json.RawMessage) string {
	t := strings.TrimSpace(string(v))
	if len(t) <= 40 {
		return t
	}
	return kind(v)
}

func parseBash(args map[string]json.RawMessage) (any, error) {
	cmd, ok, err := str(args, "command")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, mistakef("Parameter `command` is required for %s: the shell command to run.", ExecuteBash)
	}
	if strings.TrimSpace(cmd) == "" {
		return nil, mistakef("Parameter `command` is empty: give the shell command to run.")
	}
	if strings.ContainsRune(cmd, 0) {
		return nil, mistakef("The command contains a NUL byte, which a shell command cannot hold.")
	}
	timeout, err := parseTimeout(args)
	if err != nil {
		return nil, err
	}
	return bashCall{command: cmd, timeout: timeout}, nil
}

// parseTimeout checks the optional timeout parameter (0: not given).
func parseTimeout(args map[string]json.RawMessage) (time.Duration, error) {
	t, ok, err := number(args, "timeout")
	if err != nil || !ok {
		return 0, err
	}
	if !(t > 0) || t > maxTimeout.Seconds() {
		return 0, mistakef("Parameter `timeout` must be a number of seconds greater than 0 and at most %d, got %s.",
			int(maxTimeout.Seconds()), describe(args["timeout"]))
	}
	return max(time.Duration(t*float64(time.Second)), time.Millisecond), nil
}

// maxTypeText bounds the text one terminal call types.
const maxTypeText = 64 << 10

func parseTerminal(args map[string]json.RawMessage) (any, error) {
	var c terminalCall
	text, _, err := str(args, "text")
	if err != nil {
		return nil, err
	}
	if len(text) > maxTypeText {
		return nil, mistakef("Parameter `text` is %d bytes; type at most %d at once (write long content to a file with %s instead).", len(text), maxTypeText, Editor)
	}
	c.text = text
	if v, ok := args["keys"]; ok && !isNull(v) {
		var keys []string
		if err := json.Unmarshal(v, &keys); err != nil {
			var one string
			if json.Unmarshal(v, &one) != nil {
				return nil, mistakef("Parameter `keys` must be an array of key names such as [\"C-c\"] or [\"Escape\", \"Enter\"], got %s.", describe(v))
			}
			keys = []string{one}
		}
		if len(keys) > 1000 {
			return nil, mistakef("Parameter `keys` names %d keys; press at most 1000 at once.", len(keys))
		}
		c.keys = keys
	}
	if re, ok, err := str(args, "wait_for"); err != nil {
		return nil, err
	} else if ok && re != "" {
		if c.waitFor, err = regexp.Compile(re); err != nil {
			return nil, mistakef("Parameter `wait_for` is not a valid regular expression (Go RE2 syntax): %v.", err)
		}
	}
	t, ok, err := number(args, "timeout")
	if err != nil {
		return nil, err
	}
	if ok {
		if !(t > 0) || t > terminalMaxWait.Seconds() {
			return nil, mistakef("Parameter `timeout` must be a number of seconds greater than 0 and at most %d, got %s.",
				int(terminalMaxWait.Seconds()), describe(args["timeout"]))
		}
		c.timeout = max(time.Duration(t*float64(time.Second)), time.Millisecond)
	}
	if v, ok := args["restart"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &c.restart); err != nil {
			return nil, mistakef("Parameter `restart` must be true or false, got %s.", describe(v))
		}
	}
	return c, nil
}

func parsePython(args map[string]json.RawMessage) (any, error) {
	code, ok, err := str(args, "code")
	if err != nil {
		return nil, err
	}
	if !ok || strings.TrimSpace(code) == "" {
		return nil, mistakef("Parameter `code` is required for %s: the Python code to run.", Python)
	}
	timeout, err := parseTimeout(args)
	if err != nil {
		return nil, err
	}
	return pythonCall{code: code, timeout: timeout}, nil
}

func parseEditor(args map[string]json.RawMessage) (any, error) {
	cmd, ok, err := str(args, "command")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, mistakef("Parameter `command` is required for %s: one of %s.", Editor, strings.Join(editorCommands, ", "))
	}
	if !slices.Contains(editorCommands, cmd) {
		return nil, mistakef("Unknown command %s for %s. The commands are: %s.", quote(cmd), Editor, strings.Join(editorCommands, ", "))
	}
	p, ok, err := str(args, "path")
	if err != nil {
		return nil, err
	}
	if !ok || p == "" {
		return nil, mistakef("Parameter `path` is required for command %s: an absolute path such as /workspace/main.py.", cmd)
	}
	if strings.ContainsRune(p, 0) {
		return nil, mistakef("The path contains a NUL byte.")
	}
	if !strings.HasPrefix(p, "/") {
		return nil, &relPathError{path: p}
	}
	c := editorCall{command: cmd, path: path.Clean(p)}
	for _, f := range []struct {
		key string
		dst **string
	}{{"file_text", &c.fileText}, {"old_str", &c.oldStr}, {"new_str", &c.newStr}} {
		s, ok, err := str(args, f.key)
		if err != nil {
			return nil, err
		}
		if ok {
			*f.dst = &s
		}
	}
	if n, ok, err := integer(args, "insert_line"); err != nil {
		return nil, err
	} else if ok {
		c.insertLine = &n
	}
	if v, ok := args["view_range"]; ok && !isNull(v) {
		if c.viewRange, err = parseRange(v); err != nil {
			return nil, err
		}
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return c, nil
}

// parseRange decodes view_range: two integers, [start, end].
func parseRange(v json.RawMessage) ([]int, error) {
	bad := mistakef("Parameter `view_range` must be two integers [start, end] (end -1 means the end of the file), got %s.", describe(v))
	var elems []json.RawMessage
	if err := json.Unmarshal(v, &elems); err != nil || len(elems) != 2 {
		return nil, bad
	}
	r := make([]int, 2)
	for i, e := range elems {
		f, err := toNumber(e)
		if err != nil || f != math.Trunc(f) || f < -maxLine || f > maxLine {
			return nil, bad
		}
		r[i] = int(f)
	}
	return r, nil
}

// check verifies the parameters each command needs.
func (c editorCall) check() error {
	need := func(p *string, name string) error {
		if p == nil {
			return mistakef("Parameter `%s` is required for command %s.", name, c.command)
		}
		return nil
	}
	switch c.command {
	case cmdCreate:
		return need(c.fileText, "file_text")
	case cmdStrReplace:
		if err := need(c.oldStr, "old_str"); err != nil {
			return err
		}
		if *c.oldStr == "" {
			return mistakef("Parameter `old_str` is empty: give the exact text to replace, with enough surrounding lines to be unique.")
		}
	case cmdInsert:
		if c.insertLine == nil {
			return mistakef("Parameter `insert_line` is required for command insert: the line after which to insert (0 for the top).")
		}
		if *c.insertLine < 0 {
			return mistakef("Parameter `insert_line` must be 0 or more, got %d.", *c.insertLine)
		}
		return need(c.newStr, "new_str")
	case cmdView:
		if r := c.viewRange; r != nil && (r[0] < 1 || (r[1] != -1 && r[1] < r[0])) {
			return mistakef("Invalid view_range [%d, %d]: start must be 1 or more, and end -1 or at least start.", r[0], r[1])
		}
	}
	return nil
}

func parseSubmit(args map[string]json.RawMessage) (any, error) {
	a, ok, err := str(args, "answer")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, mistakef("Parameter `answer` is required for %s: your final answer.", Submit)
	}
	return submitCall{answer: a}, nil
}
