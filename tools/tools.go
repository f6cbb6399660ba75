// Package tools gives a language model function-calling tools over a
// sandbox: a shell, a terminal, a file editor and a way to hand in its
// answer.
//
// A Set holds the tools of one sandbox (one episode of an agent). Its
// Definitions go into the model's request (OpenAITools and AnthropicTools
// give them in the shape of the chat-completions and messages APIs), and
// each tool call the model makes goes to Call, whose text goes back to the
// model as the tool's result:
//
//	set := tools.New(sb)
//	req.Tools = set.OpenAITools()
//	// ... for each tool call in the model's reply:
//	text, err := set.Call(ctx, call.Name, call.Arguments)
//	if err != nil {
//		return err // the sandbox or the engine failed, or ctx ended
//	}
//	messages = append(messages, toolMessage(call.ID, text))
//	if answer, ok := set.Submitted(); ok {
//		return answer
//	}
//
// The tools are:
//
//   - terminal {text?, keys?, wait_for?, timeout?, restart?}: works a
//     terminal in the sandbox (a sandbox.Terminal running a shell, started
//     on the first call and kept): types text, presses keys, waits for the
//     screen to settle or to match wait_for, and shows the screen as text.
//     For what execute_bash cannot do: editors, REPLs, pagers, programs
//     that ask questions, a runaway program stopped with C-c. See
//     [Terminal].
//   - python {code, timeout?}: runs code in a persistent Python session
//     (a sandbox.Interpreter started on the first call), like a notebook
//     cell; see [Python].
//   - execute_bash {command, timeout?}: runs the command with /bin/sh -c in
//     the sandbox's working directory and shows the exit code, then
//     standard output and standard error in "[stdout]" and "[stderr]"
//     sections. Long output keeps its start and its end (where tracebacks
//     are) with a note saying how much was left out; a command running past
//     its timeout is killed with every process it started, and an
//     out-of-memory kill is reported.
//   - str_replace_editor {command, path, ...}: the file editor of SWE-agent
//     and of Anthropic's text editor tool, with the commands view, create,
//     str_replace, insert and undo_edit. See [Editor] for the details.
//   - submit {answer}: records the final answer, which Submitted returns.
//
// # Mistakes and failures
//
// Whatever a model sends — an unknown tool, arguments that are not JSON,
// a missing or mistyped parameter, a relative path, a missing file, an
// old_str that is not unique — Call answers with a message for the model
// that starts with "Error: " and says what to do instead, and a nil error.
// A command that fails, times out or runs out of memory is data for the
// model too. The error of Call is only for the sandbox or the engine
// failing (errors.Is(err, sandbox.ErrClosed), sandbox.ErrSandboxGone,
// sandbox.ErrEngineUnavailable) or ctx ending; then the episode cannot go
// on.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox"
)

// Tool names.
const (
	// ExecuteBash runs a shell command: {"command": string, "timeout"?:
	// seconds}.
	ExecuteBash = "execute_bash"

	// Terminal works an interactive terminal: {"text"?: string, "keys"?:
	// [key names], "wait_for"?: regular expression, "timeout"?: seconds,
	// "restart"?: bool}. The Set keeps one terminal (sandbox.Terminal)
	// running a shell, started on the first call, again after its program
	// ended, and anew on restart (which kills everything the old one
	// started). A call types text (a newline in it is the Enter key), then
	// presses keys (sandbox.TerminalKeys lists the names: Enter, Escape,
	// C-c, Up, F1...), then waits: until the screen shows a match of
	// wait_for, or else until it has been still for 0.3 s; at most timeout
	// (default 10 s, or the Set's default timeout, capped at 10 minutes),
	// after which the result says the screen did not match or kept
	// changing. The result is the screen as text, headed by its size and
	// the cursor's position, with notes (the program's end, a restart).
	// Set.Close ends the terminal.
	Terminal = "terminal"

	// Python runs code in a persistent Python session: {"code": string,
	// "timeout"?: seconds}. Variables, imports and loaded data stay from
	// one call to the next, as in a notebook. The result shows standard
	// output and standard error, the value of a trailing expression, and
	// the error with its traceback; each matplotlib figure (and any image
	// displayed) is saved as a PNG file in the working directory's
	// figures/ directory, named in the text, and returned in
	// Result.Images. A timeout interrupts the code (KeyboardInterrupt,
	// state kept); code that ignores it is killed and the session starts
	// anew, which the result says.
	Python = "python"

	// Editor views, creates and edits files: {"command": "view" | "create" |
	// "str_replace" | "insert" | "undo_edit", "path": absolute path,
	// "file_text"?, "old_str"?, "new_str"?, "insert_line"?, "view_range"?}.
	//
	//   - view on a file prints it numbered like `cat -n` (a 6-wide line
	//     number and a tab), at most 2000 lines or 16 KiB at once with a note
	//     on how to page with view_range [start, end] (end -1: to the end);
	//     on a directory it lists the files and directories up to 2 levels
	//     deep, hidden ones left out. Binary files (NUL bytes or invalid
	//     UTF-8) are not shown: the message gives their size.
	//   - create writes file_text to path, making missing parent
	//     directories. An existing file is overwritten, as with Anthropic's
	//     tool (SWE-agent refuses instead); the message says so, and
	//     undo_edit brings the old content back.
	//   - str_replace replaces old_str, which must occur exactly once in
	//     the file, with new_str (missing: delete). Otherwise nothing
	//     changes and the message says there is no occurrence, or how many
	//     there are and in which lines.
	//   - insert puts new_str after line insert_line (0: at the top).
	//   - undo_edit reverts the last create, str_replace or insert on path,
	//     as many times as there are edits kept (the last 10 per path).
	//
	// After an edit the message shows the edited region with 4 lines of
	// context, numbered. Paths must be absolute and may point anywhere in
	// the sandbox; the sandbox is the boundary. The file's permission bits
	// are kept. Files are read through symbolic links, but an edit through
	// a link replaces the link with a regular file, as sed -i does: edit
	// the link's target instead.
	Editor = "str_replace_editor"

	// Submit records the final answer: {"answer": string}.
	Submit = "submit"
)

// Definition describes one tool for a model.
type Definition struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the tool's arguments: an object
	// with properties, required and additionalProperties false.
	Parameters json.RawMessage
}

// Set is the tool set for one sandbox (one episode): it keeps the editor's
// undo history and the submitted answer. It is safe for concurrent use.
type Set struct {
	sb         *sandbox.Sandbox
	outLimit   int
	defTimeout time.Duration
	actSummary bool // WithActivitySummary

	mu        sync.Mutex
	locks     map[string]*sync.Mutex // per path, for edits
	history   map[string][]version   // undo history per path, oldest first
	histBytes int
	seq       uint64
	answer    string
	submitted bool
	workdir   string // found on first need

	termMu sync.Mutex // serializes terminal calls
	term   *sandbox.Terminal

	pyMu    sync.Mutex // serializes python calls
	py      *sandbox.Interpreter
	figures int // images saved so far
}

// Result is a tool's result: the text for the model and the images the
// call produced (python's figures), for protocols that can show a model
// images (an MCP image content, a message's image part).
type Result struct {
	Text   string
	Images []Image
}

// Image is an image a tool call produced, also saved in the sandbox at
// Path.
type Image struct {
	MIME string
	Data []byte
	Path string
}

// version is a file's content before an edit.
type version struct {
	seq     uint64
	data    []byte
	mode    fs.FileMode
	existed bool
}

// Option configures a Set.
type Option func(*Set)

// DefaultOutputLimit is how many bytes of each output stream execute_bash
// shows the model by default.
const DefaultOutputLimit = 16 << 10

// WithOutputLimit sets how many bytes of standard output, and as many of
// standard error, execute_bash shows the model (default
// DefaultOutputLimit). Longer output keeps its first and last halves.
func WithOutputLimit(n int) Option {
	return func(t *Set) {
		if n > 0 {
			t.outLimit = n
		}
	}
}

// WithDefaultTimeout sets the timeout of execute_bash calls that do not
// give one. Without it only the sandbox's Limits.ExecTimeout applies, which
// also bounds the timeouts the model asks for.
func WithDefaultTimeout(d time.Duration) Option {
	return func(t *Set) {
		if d > 0 {
			t.defTimeout = d
		}
	}
}

// New returns the tools for sb. The Set does not own sb: close the sandbox
// when the episode is over. A Set made with a nil sandbox gives its
// definitions and takes submit; its other tools return an error.
func New(sb *sandbox.Sandbox, opts ...Option) *Set {
	t := &Set{
		sb:       sb,
		outLimit: DefaultOutputLimit,
		locks:    map[string]*sync.Mutex{},
		history:  map[string][]version{},
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

var definitions = []Definition{
	{
		Name: ExecuteBash,
		Description: `Run a shell command in the sandbox, a Linux container without network access, and see its exit code, standard output and standard error.
* The command runs with /bin/sh -c in the working directory, as a non-root user. Each call starts a new shell: cd and variables do not carry over, so chain commands with && when needed.
* Standard input is empty: do not start interactive programs (editors, pagers, REPLs waiting for input).
* Long output is cut in the middle; the start and the end are shown. Redirect big outputs to a file and search it with grep, head or tail.
* A command running longer than timeout seconds (or the sandbox's own limit) is killed with every process it started.`,
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "command": {"type": "string", "description": "The shell command to run, e.g. \"python3 main.py\" or \"ls -la /workspace\"."},
    "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400, "description": "Seconds after which the command is killed. Optional; the sandbox's limit applies anyway."}
  },
  "required": ["command"],
  "additionalProperties": false
}`),
	},
	{
		Name: Terminal,
		Description: `Work an interactive terminal in the sandbox, as a person at a keyboard would: type text, press keys, and read the screen. Use it for what execute_bash cannot do: editors (vi), REPLs (python3, sh), pagers, programs that ask questions, long-running programs you want to watch or interrupt.
* One terminal running a shell is kept across calls (cd, variables and running programs stay). It starts on the first call; restart: true kills it, with everything it started, and starts a new one.
* text is typed as is, except that a newline is the Enter key. keys are pressed after it: Enter, Tab, Escape, Backspace, Delete, Up, Down, Left, Right, Home, End, PageUp, PageDown, F1-F12, C-a ... C-z (Ctrl: C-c interrupts, C-d ends input), M-x (Alt).
* Each call then waits until the screen matches the regular expression wait_for, or, without it, until the screen stops changing, at most timeout seconds, and shows the screen (24 rows x 80 columns) with the cursor's position. Call with no text and no keys to look at the screen again, or to wait for it.`,
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "text": {"type": "string", "description": "Text to type, e.g. \"ls -la\\n\" (a newline is the Enter key) or \"ihello\" in vi."},
    "keys": {"type": "array", "items": {"type": "string"}, "description": "Keys to press after the text, in order, e.g. [\"Escape\"], [\"C-c\"] or [\"Up\", \"Enter\"]."},
    "wait_for": {"type": "string", "description": "A regular expression (RE2) to wait for on the screen, e.g. \"[$#] $\" for a shell prompt. Without it the call waits until the screen stops changing."},
    "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 600, "description": "Seconds to wait at most (default 10). The screen is shown either way."},
    "restart": {"type": "boolean", "description": "Kill the terminal and everything it started, then start a new shell, before typing."}
  },
  "required": [],
  "additionalProperties": false
}`),
	},
	{
		Name: Python,
		Description: `Run Python code in a persistent Python session in the sandbox, like a Jupyter notebook: variables, imports, functions and loaded data stay from one call to the next, so load a file once and reuse it.
* The value of the last expression is shown (a pandas DataFrame as a table), with standard output, standard error and any error with its traceback.
* matplotlib figures are captured automatically: each one is saved as a PNG in /workspace/figures (or the working directory's figures/) and named in the result; do not call plt.show() to display them, and call savefig yourself only to save a figure elsewhere.
* input() is not available. Long-running code is interrupted at the timeout (the session is kept); code that cannot be interrupted is killed and the session restarts empty.`,
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "code": {"type": "string", "description": "The Python code to run, e.g. \"import pandas as pd\\ndf = pd.read_csv('data.csv')\\ndf.describe()\"."},
    "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400, "description": "Seconds after which the code is interrupted. Optional; the sandbox's limit applies anyway."}
  },
  "required": ["code"],
  "additionalProperties": false
}`),
	},
	{
		Name: Editor,
		Description: "View, create and edit text files in the sandbox. Paths must be absolute (for example /workspace/main.py).\n" +
			"* `view` on a file prints it with line numbers like `cat -n`; long files are cut, so page with `view_range` [start, end] (end -1 means to the end). `view` on a directory lists its files and directories up to 2 levels deep, hidden ones left out.\n" +
			"* `create` writes `file_text` to `path`, making missing directories. It overwrites an existing file; undo_edit brings the old content back.\n" +
			"* `str_replace` replaces `old_str` with `new_str` (missing: delete old_str). old_str must match exactly one place in the file, whitespace and indentation included; include enough surrounding lines to make it unique.\n" +
			"* `insert` inserts `new_str` after line `insert_line` (0 inserts at the top).\n" +
			"* `undo_edit` reverts the last create, str_replace or insert on `path`.\n" +
			"Binary files are not shown; use execute_bash for them.",
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"], "description": "The command to run."},
    "path": {"type": "string", "description": "Absolute path of the file or directory, e.g. /workspace/main.py."},
    "file_text": {"type": "string", "description": "For create: the content of the file."},
    "old_str": {"type": "string", "description": "For str_replace: the exact text to replace; it must occur exactly once."},
    "new_str": {"type": "string", "description": "For str_replace: the replacement text (missing: delete old_str). For insert: the text to insert."},
    "insert_line": {"type": "integer", "minimum": 0, "description": "For insert: new_str goes after this line; 0 inserts at the top."},
    "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2, "description": "For view of a file: [start, end] lines to show, numbered from 1; end -1 shows to the end."}
  },
  "required": ["command", "path"],
  "additionalProperties": false
}`),
	},
	{
		Name:        Submit,
		Description: "Submit your final answer when the task is done. This ends the task: call it once, after checking your work. Files you were asked to make must already be saved in the working directory.",
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "answer": {"type": "string", "description": "Your final answer: the result asked for, or a short summary of what you did and where the outputs are."}
  },
  "required": ["answer"],
  "additionalProperties": false
}`),
	},
}

// Definitions returns the tools' names, descriptions and JSON Schemas.
func (t *Set) Definitions() []Definition {
	out := make([]Definition, len(definitions))
	for i, d := range definitions {
		d.Parameters = append(json.RawMessage(nil), d.Parameters...)
		out[i] = d
	}
	return out
}

// schema returns a fresh decoded copy of a tool's parameter schema.
func schema(d Definition) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(d.Parameters, &m); err != nil {
		panic(fmt.Sprintf("tools: bad schema of %s: %v", d.Name, err)) // fixed at compile time; tested
	}
	return m
}

// OpenAITools returns the tools as entries of the chat-completions API's
// "tools" list: {"type": "function", "function": {"name", "description",
// "parameters"}}. Each call returns fresh maps.
func (t *Set) OpenAITools() []map[string]any {
	var out []map[string]any
	for _, d := range definitions {
		out = append(out, map[string]any{
			"type": "function",
			"function": map[string]any{
				"name":        d.Name,
				"description": d.Description,
				"parameters":  schema(d),
			},
		})
	}
	return out
}

// AnthropicTools returns the tools as entries of the messages API's
// "tools" list: {"name", "description", "input_schema"}. Each call returns
// fresh maps.
func (t *Set) AnthropicTools() []map[string]any {
	var out []map[string]any
	for _, d := range definitions {
		out = append(out, map[string]any{
			"name":         d.Name,
			"description":  d.Description,
			"input_schema": schema(d),
		})
	}
	return out
}

// Call runs the tool name with the JSON arguments argsJSON (as the model
// sent them; empty means {}) and returns the text to show the model.
//
// Mistakes of the model — an unknown tool, malformed JSON, a missing or
// invalid parameter, a relative path, a missing file, an old_str that does
// not match exactly once — come back as a message starting with "Error: "
// and a nil error, as do failing, timed-out and out-of-memory commands. The
// error is only for the sandbox or engine failing (such as
// sandbox.ErrSandboxGone or sandbox.ErrClosed) or ctx ending, when the text
// may still describe what ran until then.
func (t *Set) Call(ctx context.Context, name, argsJSON string) (string, error) {
	r, err := t.CallResult(ctx, name, argsJSON)
	return r.Text, err
}

// CallResult is Call, also returning the images the call produced (the
// python tool's figures), for callers whose protocol can show them to the
// model. The text names each image's path in the sandbox either way.
func (t *Set) CallResult(ctx context.Context, name, argsJSON string) (Result, error) {
	c, err := parse(name, argsJSON)
	if err != nil {
		var rp *relPathError
		if errors.As(err, &rp) {
			return Result{Text: rp.message(t.lookupWorkdir(ctx))}, nil
		}
		return Result{Text: err.Error()}, nil
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("tools: %s: %w", name, err)
	}
	if _, ok := c.(submitCall); !ok && t.sb == nil {
		return Result{}, fmt.Errorf("tools: %s: the Set has no sandbox", name)
	}
	var text string
	switch c := c.(type) {
	case bashCall:
		text, err = t.bash(ctx, c)
	case terminalCall:
		text, err = t.terminal(ctx, c)
	case pythonCall:
		return t.python(ctx, c)
	case editorCall:
		text, err = t.edit(ctx, c)
	case submitCall:
		text = t.submit(c)
	default:
		err = fmt.Errorf("tools: internal error: unexpected call %T", c)
	}
	return Result{Text: text}, err
}

// Close ends the python tool's session and the terminal tool's terminal,
// if they were started. The sandbox stays open.
func (t *Set) Close() error {
	terr := t.closeTerminal()
	t.pyMu.Lock()
	defer t.pyMu.Unlock()
	if t.py == nil {
		return terr
	}
	err := t.py.Close()
	t.py = nil
	return errors.Join(err, terr)
}

// Submitted returns the answer given with the submit tool, and whether it
// was called. After several calls the last answer counts.
func (t *Set) Submitted() (answer string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.answer, t.submitted
}

func (t *Set) submit(c submitCall) string {
	t.mu.Lock()
	again := t.submitted
	t.answer, t.submitted = c.answer, true
	t.mu.Unlock()
	if again {
		return "Answer recorded, replacing the one submitted before. The task is finished; no more tool calls are needed."
	}
	return "Answer recorded. The task is finished; no more tool calls are needed."
}

// lookupWorkdir returns the sandbox's working directory, asking the sandbox
// the first time; "" if that fails.
func (t *Set) lookupWorkdir(ctx context.Context) string {
	t.mu.Lock()
	wd := t.workdir
	t.mu.Unlock()
	if wd != "" || t.sb == nil {
		return wd
	}
	out, err := t.sb.Command(ctx, "pwd").Output()
	wd = strings.TrimSpace(string(out))
	if err != nil || !strings.HasPrefix(wd, "/") {
		return ""
	}
	t.mu.Lock()
	t.workdir = wd
	t.mu.Unlock()
	return wd
}

// isInfra reports whether err is the sandbox, the engine or ctx failing,
// rather than something about the path or command the model chose.
func isInfra(ctx context.Context, err error) bool {
	return ctx.Err() != nil ||
		errors.Is(err, sandbox.ErrClosed) ||
		errors.Is(err, sandbox.ErrSandboxGone) ||
		errors.Is(err, sandbox.ErrEngineUnavailable) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded)
}
