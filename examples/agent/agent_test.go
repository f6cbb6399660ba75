package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	_ "image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Images: busyboxImage is tiny; pythonImage has python3 with pandas and
// matplotlib.
var busyboxImage, pythonImage string

func TestMain(m *testing.M) {
	os.Setenv("AGENTSANDBOX_PULL", "never") // tests never reach a registry
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	// On an engine that puts no resource limits in force (rootless Podman
	// on cgroup v1) New refuses the example's sandboxes, which have the
	// default limits: its tests do not apply there.
	if caps, err := sandbox.DefaultDriver.Caps(ctx); err == nil && caps.NoResourceLimits {
		cancel()
		fmt.Fprintf(os.Stderr, "not applicable on %v: it puts no resource limits in force (driver.Caps.NoResourceLimits), and the example's sandboxes have the default limits\n", caps.Engine)
		os.Exit(0)
	}
	var err error
	if busyboxImage, err = images.Ensure(ctx, images.Busybox, os.Stderr); err == nil {
		pythonImage, err = images.FromEnv(ctx, os.Stderr)
	}
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test images:", err)
		os.Exit(1)
	}
	os.Exit(sandboxtest.Main(m))
}

// reply is one scripted answer of the fake model.
type reply struct {
	content string
	calls   []toolCall
}

type toolCall struct{ id, name, arguments string }

// wireMessage is a message of a chat-completions request.
type wireMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

func (m wireMessage) text() string {
	var s string
	json.Unmarshal(m.Content, &s)
	return s
}

type wireRequest struct {
	Model    string        `json:"model"`
	Messages []wireMessage `json:"messages"`
	Tools    []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string         `json:"name"`
			Parameters map[string]any `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
}

// fakeModel is an OpenAI-compatible chat-completions server on loopback
// that replays a scripted trajectory and records what the agent sent.
type fakeModel struct {
	t       *testing.T
	replies []reply
	srv     *httptest.Server

	mu       sync.Mutex
	requests []wireRequest
}

func newFakeModel(t *testing.T, replies []reply) *fakeModel {
	f := &fakeModel{t: t, replies: replies}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeModel) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error": {"message": "not found"}}`, http.StatusNotFound)
		return
	}
	if got := r.Header.Get("Authorization"); got != "Bearer test-key" {
		f.t.Errorf("Authorization = %q", got)
	}
	var req wireRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		f.t.Errorf("decoding request: %v", err)
		http.Error(w, `{"error": {"message": "bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	n := len(f.requests)
	f.mu.Unlock()
	if n > len(f.replies) {
		f.t.Errorf("request %d: the script has only %d replies", n, len(f.replies))
		http.Error(w, `{"error": {"message": "script exhausted"}}`, http.StatusBadRequest)
		return
	}
	// The tool results must answer the previous reply's calls, in order.
	if n > 1 {
		var ids []string
		for _, c := range f.replies[n-2].calls {
			ids = append(ids, c.id)
		}
		var got []string
		for _, m := range tail(req.Messages) {
			got = append(got, m.ToolCallID)
		}
		if !slices.Equal(got, ids) {
			f.t.Errorf("request %d answers tool calls %v, want %v", n, got, ids)
		}
	}
	rep := f.replies[n-1]
	msg := map[string]any{"role": "assistant", "content": rep.content}
	finish := "stop"
	if len(rep.calls) > 0 {
		finish = "tool_calls"
		var calls []map[string]any
		for _, c := range rep.calls {
			call := map[string]any{"id": c.id, "type": "function",
				"function": map[string]any{"name": c.name, "arguments": c.arguments}}
			if strings.HasPrefix(c.id, "untyped") {
				delete(call, "type") // as some compatible servers send them
			}
			calls = append(calls, call)
		}
		msg["tool_calls"] = calls
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "created": 1700000000, "model": req.Model,
		"choices": []map[string]any{{"index": 0, "finish_reason": finish, "message": msg, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
	})
}

// tail returns the tool messages after the last assistant message.
func tail(msgs []wireMessage) []wireMessage {
	var out []wireMessage
	for i := len(msgs) - 1; i >= 0 && msgs[i].Role == "tool"; i-- {
		out = append([]wireMessage{msgs[i]}, out...)
	}
	return out
}

// results returns the tool results shown to the model in request i (from
// 0): the answers to the calls of reply i-1.
func (f *fakeModel) results(i int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.requests) {
		f.t.Fatalf("only %d requests were made", len(f.requests))
	}
	var out []string
	for _, m := range tail(f.requests[i].Messages) {
		out = append(out, m.text())
	}
	return out
}

func (f *fakeModel) config(t *testing.T, img string) Config {
	return Config{
		BaseURL:    f.srv.URL + "/v1/",
		Model:      "fake-model",
		APIKey:     "test-key",
		MaxSteps:   10,
		Out:        filepath.Join(t.TempDir(), "out"),
		Image:      img,
		HTTPClient: f.srv.Client(),
	}
}

// jsonArgs encodes tool arguments.
func jsonArgs(kv ...any) string {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func check(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got: %q\nwant: %q", what, got, want)
	}
}

const buggyPlot = `import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

sales = pd.DataFrame({"month": ["Jan", "Feb", "Mar", "Apr"], "sales": [120, 135, 160, 150]})
ax = sales.plot(x="month", y="revenue", kind="bar", legend=False, figsize=(8, 4.8))
ax.set_ylabel("units sold")
ax.set_title("Sales per month")
plt.savefig("/workspace/chart.png", dpi=100)
print("saved /workspace/chart.png")
`

// TestPlotTrajectory replays a model that writes a plotting script with a
// wrong column name, runs it, reads the traceback, fixes the script, runs
// it again and submits; the chart comes back to the host.
func TestPlotTrajectory(t *testing.T) {
	t.Parallel()
	const answer = "chart.png is a bar chart of sales per month (Jan-Apr); the script first used a column that does not exist ('revenue' instead of 'sales')."
	f := newFakeModel(t, []reply{
		{content: "I'll write the plotting script first.", calls: []toolCall{{"call_1", "str_replace_editor",
			jsonArgs("command", "create", "path", "/workspace/plot.py", "file_text", buggyPlot)}}},
		{calls: []toolCall{{"call_2", "execute_bash", jsonArgs("command", "python3 plot.py")}}},
		{content: "The data frame has no 'revenue' column; the values are in 'sales'.", calls: []toolCall{{"call_3", "str_replace_editor",
			jsonArgs("command", "str_replace", "path", "/workspace/plot.py", "old_str", `y="revenue"`, "new_str", `y="sales"`)}}},
		{calls: []toolCall{{"call_4", "execute_bash", jsonArgs("command", "python3 plot.py", "timeout", 120)}}},
		{content: "Let me check the total in a Python session.", calls: []toolCall{{"call_5", "python",
			jsonArgs("code", "import pandas as pd\nsales = pd.DataFrame({'sales': [120, 135, 160, 150]})")}}},
		{calls: []toolCall{{"call_6", "python", jsonArgs("code", "sales['sales'].sum()")}}},
		{content: "The chart is saved.", calls: []toolCall{{"call_7", "submit", jsonArgs("answer", answer)}}},
	})
	cfg := f.config(t, pythonImage)
	var transcript bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := Run(ctx, cfg, "Plot the monthly sales as a bar chart into /workspace/chart.png.", &transcript)
	t.Logf("transcript:\n%s", transcript.String())
	if err != nil {
		t.Fatal(err)
	}
	if out.Stop != "submitted" || !out.Submitted || out.Answer != answer || out.Steps != 7 || len(out.Calls) != 7 {
		t.Errorf("outcome: stop %q, submitted %v, %d steps, %d calls, answer %q", out.Stop, out.Submitted, out.Steps, len(out.Calls), out.Answer)
	}

	// The first request: system prompt, task, the three tools.
	f.mu.Lock()
	first := f.requests[0]
	f.mu.Unlock()
	if first.Model != "fake-model" || len(first.Messages) != 2 || first.Messages[0].Role != "system" ||
		first.Messages[0].text() != systemPrompt || first.Messages[1].Role != "user" ||
		first.Messages[1].text() != "Plot the monthly sales as a bar chart into /workspace/chart.png." {
		t.Errorf("first request: %+v", first)
	}
	var names []string
	for _, tl := range first.Tools {
		names = append(names, tl.Function.Name)
		if tl.Type != "function" || tl.Function.Parameters["type"] != "object" {
			t.Errorf("tool %+v", tl)
		}
	}
	if !slices.Equal(names, []string{"execute_bash", "terminal", "python", "str_replace_editor", "submit"}) {
		t.Errorf("tools = %v", names)
	}

	// (1) create
	check(t, "create", strings.Join(f.results(1), "|"), "File created successfully at: /workspace/plot.py (11 lines).")
	// (2) the traceback
	run1 := f.results(2)
	if len(run1) != 1 {
		t.Fatalf("results of step 2: %q", run1)
	}
	t.Logf("what the model saw after its first run:\n%s", run1[0])
	if !strings.HasPrefix(run1[0], "exit code: 1\n[stderr]\n") ||
		!strings.Contains(run1[0], "\nTraceback (most recent call last):\n  File \"/workspace/plot.py\", line 7, in <module>\n") ||
		!strings.HasSuffix(run1[0], "\nKeyError: 'revenue'\n") {
		t.Errorf("first run: %q", run1[0])
	}
	// (3) the fix
	check(t, "str_replace", strings.Join(f.results(3), "|"),
		"The file /workspace/plot.py has been edited. Here's the result of running `cat -n` on a snippet of /workspace/plot.py:\n"+
			"     3\timport matplotlib.pyplot as plt\n"+
			"     4\timport pandas as pd\n"+
			"     5\t\n"+
			"     6\tsales = pd.DataFrame({\"month\": [\"Jan\", \"Feb\", \"Mar\", \"Apr\"], \"sales\": [120, 135, 160, 150]})\n"+
			"     7\tax = sales.plot(x=\"month\", y=\"sales\", kind=\"bar\", legend=False, figsize=(8, 4.8))\n"+
			"     8\tax.set_ylabel(\"units sold\")\n"+
			"     9\tax.set_title(\"Sales per month\")\n"+
			"    10\tplt.savefig(\"/workspace/chart.png\", dpi=100)\n"+
			"    11\tprint(\"saved /workspace/chart.png\")\n"+
			"Review the changes and make sure they are as expected. Edit the file again if necessary.")
	// (4) the second run
	check(t, "second run", strings.Join(f.results(4), "|"), "exit code: 0\n[stdout]\nsaved /workspace/chart.png\n")
	// (5, 6) a Python session: the second call uses the first one's variable
	check(t, "python", strings.Join(f.results(5), "|"), "(no output)\n")
	check(t, "python again", strings.Join(f.results(6), "|"), "[output]\n565\n")
	// (7) submit
	check(t, "submit", out.Calls[6].Result, "Answer recorded. The task is finished; no more tool calls are needed.")

	// The chart came back to the host, and hidden caches did not.
	data, err := os.ReadFile(filepath.Join(cfg.Out, "chart.png"))
	if err != nil {
		t.Fatal(err)
	}
	pc, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil || format != "png" || pc.Width != 800 || pc.Height != 480 {
		t.Errorf("chart.png: %v %s %dx%d", err, format, pc.Width, pc.Height)
	}
	script, err := os.ReadFile(filepath.Join(cfg.Out, "plot.py"))
	if err != nil {
		t.Fatal(err)
	}
	check(t, "plot.py on the host", string(script), strings.Replace(buggyPlot, `y="revenue"`, `y="sales"`, 1))
	ents, _ := os.ReadDir(cfg.Out)
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, []string{"chart.png", "plot.py"}) {
		t.Errorf("copied %v", got)
	}
	if want := []string{filepath.Join(cfg.Out, "chart.png"), filepath.Join(cfg.Out, "plot.py")}; !slices.Equal(out.Artifacts, want) {
		t.Errorf("Artifacts = %v, want %v", out.Artifacts, want)
	}

	// The terminal shows each step readably.
	for _, want := range []string{
		"── step 1 ──\nassistant: I'll write the plotting script first.\n→ str_replace_editor create /workspace/plot.py (11 lines)\n  │ File created successfully at: /workspace/plot.py (11 lines).\n",
		"── step 2 ──\n→ execute_bash $ python3 plot.py\n  │ exit code: 1\n  │ [stderr]\n",
		"  │ KeyError: 'revenue'\n",
		"→ str_replace_editor str_replace /workspace/plot.py: y=\"revenue\" ⇒ y=\"sales\"\n",
		"→ execute_bash $ python3 plot.py   (timeout 120s)\n  │ exit code: 0\n  │ [stdout]\n  │ saved /workspace/chart.png\n",
		"→ python >>> import pandas as pd (+1 lines)\n  │ (no output)\n",
		"→ python >>> sales['sales'].sum()\n  │ [output]\n  │ 565\n",
		"→ submit: chart.png is a bar chart",
		"copied 2 item(s) from /workspace to " + cfg.Out + "\n",
		"\nanswer: " + answer + "\n",
	} {
		if !strings.Contains(transcript.String(), want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
}

// TestMalformedTrajectory replays a model that makes every kind of mistake:
// each gets a clear message, the loop goes on, and ends when the model
// stops without submitting.
func TestMalformedTrajectory(t *testing.T) {
	t.Parallel()
	f := newFakeModel(t, []reply{
		{content: "Let me look around.", calls: []toolCall{
			{"m1", "execute_bash", `{"command": "ls -la /workspace`},
			{"m2", "jupyter", `{"code": "print(1)"}`},
			{"m3", "execute_bash", `{"cmd": "ls"}`},
			{"m4", "str_replace_editor", `{"command": "view"}`},
		}},
		{calls: []toolCall{
			{"m5", "str_replace_editor", jsonArgs("command", "view", "path", "notes.py")},
			{"m6", "str_replace_editor", jsonArgs("command", "create", "path", "/workspace/notes.py", "file_text", "a = 1\nb = 2\na = 1\n")},
		}},
		{calls: []toolCall{
			{"m7", "str_replace_editor", jsonArgs("command", "str_replace", "path", "/workspace/notes.py", "old_str", "c = 3", "new_str", "c = 4")},
			{"m8", "str_replace_editor", jsonArgs("command", "str_replace", "path", "/workspace/notes.py", "old_str", "a = 1", "new_str", "a = 2")},
		}},
		{calls: []toolCall{
			{"m9", "execute_bash", jsonArgs("command", `printf '\211PNG\r\n\032\n\000\000\000\rIHDR' > blob.png && seq 1 50000 > big.txt && wc -c blob.png big.txt`)},
		}},
		{calls: []toolCall{
			{"m10", "str_replace_editor", jsonArgs("command", "view", "path", "/workspace/blob.png")},
			{"m11", "str_replace_editor", jsonArgs("command", "view", "path", "/workspace/big.txt")},
			{"m12", "str_replace_editor", `{"command": "insert", "path": "/workspace/notes.py", "insert_line": "two", "new_str": "x"}`},
		}},
		{content: "I could not finish the task."},
	})
	cfg := f.config(t, busyboxImage)
	var transcript bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := Run(ctx, cfg, "Explore the workspace.", &transcript)
	t.Logf("transcript:\n%s", transcript.String())
	if err != nil {
		t.Fatal(err)
	}
	if out.Stop != "model stopped" || out.Submitted || out.Steps != 6 || len(out.Calls) != 12 {
		t.Errorf("outcome: stop %q, submitted %v, %d steps, %d calls", out.Stop, out.Submitted, out.Steps, len(out.Calls))
	}

	step := func(i int, want ...string) {
		t.Helper()
		got := f.results(i)
		if len(got) != len(want) {
			t.Errorf("request %d has %d tool results, want %d: %q", i, len(got), len(want), got)
			return
		}
		for j := range want {
			check(t, fmt.Sprintf("request %d, result %d", i, j), got[j], want[j])
		}
	}
	step(1,
		`Error: The arguments of execute_bash are not valid JSON (unexpected end of JSON input, at byte 30). Send one JSON object, for example {"command": "ls -la"}.`,
		`Error: Unknown tool "jupyter". The tools are: execute_bash, terminal, python, str_replace_editor, submit.`,
		"Error: Unknown parameter \"cmd\" for execute_bash. Its parameters are: command, timeout.",
		"Error: Parameter `path` is required for command view: an absolute path such as /workspace/main.py.")
	step(2,
		"Error: The path notes.py is not an absolute path; it must start with `/`. Maybe you meant /workspace/notes.py?",
		"File created successfully at: /workspace/notes.py (3 lines).")
	step(3,
		"Error: No replacement was performed: old_str did not appear verbatim in /workspace/notes.py. View the file to copy the exact text, whitespace and indentation included.",
		"Error: No replacement was performed: old_str has 2 occurrences in /workspace/notes.py, in lines 1, 3 — make old_str unique by including more of the surrounding lines.")
	step(4, "exit code: 0\n[stdout]\n       16 blob.png\n   288894 big.txt\n   288910 total\n")
	// A view of 50000 lines stops at 16 KiB with a note on paging.
	var body strings.Builder
	n := 0
	for i := 1; ; i++ {
		line := fmt.Sprintf("%6d\t%d\n", i, i)
		if body.Len()+len(line) > 16384 {
			break
		}
		body.WriteString(line)
		n = i
	}
	step(5,
		"Error: /workspace/blob.png is a binary file (16 bytes), so it is not shown: str_replace_editor handles text only. Use execute_bash to inspect it, for example `od -c /workspace/blob.png | head`.",
		"Here's the result of running `cat -n` on /workspace/big.txt:\n"+body.String()+
			fmt.Sprintf("[Showing lines 1-%d of 50000: one view shows at most 2000 lines and 16384 bytes. Use view_range to see more, e.g. [%d, %d].]\n", n, n+1, 2*n),
		"Error: Parameter `insert_line` must be an integer, got \"two\".")

	// Nothing broke: the files are intact and copied out.
	notes, err := os.ReadFile(filepath.Join(cfg.Out, "notes.py"))
	if err != nil {
		t.Fatal(err)
	}
	check(t, "notes.py", string(notes), "a = 1\nb = 2\na = 1\n")
	for _, name := range []string{"blob.png", "big.txt"} {
		if _, err := os.Stat(filepath.Join(cfg.Out, name)); err != nil {
			t.Error(err)
		}
	}
	for _, want := range []string{
		"→ execute_bash {\"command\": \"ls -la /workspace\n",
		"→ jupyter {\"code\": \"print(1)\"}\n  │ Error: Unknown tool \"jupyter\".",
		"→ execute_bash {\"cmd\": \"ls\"}\n",
		"→ str_replace_editor {\"command\": \"view\"}\n",
		"(the model stopped without a tool call: finish_reason \"stop\")\n",
		"no answer submitted (model stopped after 6 steps)\n",
	} {
		if !strings.Contains(transcript.String(), want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
}

// TestStepLimit stops a model that never ends.
func TestStepLimit(t *testing.T) {
	t.Parallel()
	var replies []reply
	for i := range 3 {
		replies = append(replies, reply{calls: []toolCall{{fmt.Sprintf("untyped%d", i), "execute_bash", jsonArgs("command", "echo again")}}})
	}
	f := newFakeModel(t, replies)
	cfg := f.config(t, busyboxImage)
	cfg.MaxSteps, cfg.Out = 2, ""
	var transcript bytes.Buffer
	out, err := Run(context.Background(), cfg, "loop", &transcript)
	if err != nil {
		t.Fatal(err)
	}
	if out.Stop != "step limit" || out.Steps != 2 || len(out.Calls) != 2 || out.Submitted || out.Artifacts != nil {
		t.Errorf("outcome %+v", out)
	}
	if !strings.Contains(transcript.String(), "(step limit of 2 reached)\n") {
		t.Errorf("transcript:\n%s", transcript.String())
	}
	check(t, "second result", strings.Join(f.results(1), "|"), "exit code: 0\n[stdout]\nagain\n")
	// The history sent back keeps the calls, typed as functions.
	f.mu.Lock()
	msgs := f.requests[1].Messages
	f.mu.Unlock()
	asst := msgs[len(msgs)-2]
	if asst.Role != "assistant" || len(asst.ToolCalls) != 1 || asst.ToolCalls[0].ID != "untyped0" ||
		asst.ToolCalls[0].Type != "function" || asst.ToolCalls[0].Function.Name != "execute_bash" {
		t.Errorf("assistant message sent back: %+v", asst)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		task string
		want string
	}{
		{Config{Image: "x"}, "task", "agent: no model: pass -model or set OPENAI_MODEL"},
		{Config{Model: "m"}, "task", "agent: no sandbox image"},
		{Config{Model: "m", Image: "x"}, " ", "agent: empty task"},
	} {
		if _, err := Run(context.Background(), tc.cfg, tc.task, &bytes.Buffer{}); err == nil || err.Error() != tc.want {
			t.Errorf("Run(%+v, %q) = %v, want %q", tc.cfg, tc.task, err, tc.want)
		}
	}
}

// TestModelEndpointDown reports a failing endpoint as an error and cleans
// up the sandbox.
func TestModelEndpointDown(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error": {"message": "invalid model"}}`, http.StatusBadRequest)
	}))
	defer srv.Close()
	cfg := Config{BaseURL: srv.URL + "/v1/", Model: "m", Image: busyboxImage, HTTPClient: srv.Client()}
	out, err := Run(context.Background(), cfg, "task", &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "agent: step 1: model request:") || !strings.Contains(err.Error(), "400") {
		t.Errorf("err = %v", err)
	}
	if out == nil || out.Steps != 1 {
		t.Errorf("outcome %+v", out)
	}
}
