package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/tools"
)

// workdir is the sandbox's working directory, where the model works and
// whose files are copied out at the end.
const workdir = "/workspace"

// systemPrompt tells the model where it is and what its tools do.
const systemPrompt = `You are an autonomous agent solving a task in a sandbox: a Linux container without network access, with Python 3 and the usual shell tools (the image may also have numpy, pandas and matplotlib). Your working directory is /workspace; the files you save there are handed to the user when you finish.

Your tools:
- execute_bash runs a shell command and shows its exit code, standard output and standard error. Every call starts a new shell in /workspace, so cd does not carry over; there is no network, so do not try to install packages.
- terminal works an interactive terminal that stays open across calls: type text (a newline is Enter), press keys such as C-c or Escape, and read the screen. Use it for programs that need a keyboard (editors, REPLs, prompts) or to stop a program that runs too long.
- str_replace_editor views, creates and edits files; paths must be absolute (for example /workspace/main.py).
- submit hands in your final answer and ends the task.

Work step by step: write your code to a file, run it, read any error and fix the code, and check the result before you submit. For plots, use matplotlib with the Agg backend and save them into /workspace with savefig. When the task is done, call submit with a short answer: the result, and the files you made.`

// Config is what Run needs to reach the model and start the sandbox.
type Config struct {
	// BaseURL is the OpenAI-compatible endpoint, such as
	// "https://api.openai.com/v1" or "http://localhost:11434/v1"; empty
	// uses the client's default ($OPENAI_BASE_URL, else OpenAI's).
	BaseURL string
	Model   string // required
	APIKey  string // sent as a bearer token when not empty
	// MaxSteps bounds the model requests (default 30).
	MaxSteps int
	// Out is the host directory that receives the files left in the
	// sandbox's working directory (hidden ones excepted); "" skips copying.
	Out string
	// Image is the sandbox's image; it needs /bin/sh.
	Image string
	// Limits are the sandbox's limits; zero fields keep the defaults.
	Limits sandbox.Limits
	// HTTPClient, if set, makes the model requests.
	HTTPClient *http.Client
}

// Outcome is how an episode ended.
type Outcome struct {
	Answer    string // what the model submitted
	Submitted bool   // whether it called submit
	Steps     int    // model requests made
	// Stop says why the loop ended: "submitted", "model stopped" (a reply
	// without tool calls) or "step limit".
	Stop string
	// Artifacts are the host paths copied into Config.Out.
	Artifacts []string
	// Calls are the tool calls of the episode with their results, in order.
	Calls []Call
}

// Call is one tool call of the model and the text it got back.
type Call struct {
	Step      int
	ID        string
	Name      string
	Arguments string
	Result    string
}

// Run solves task with the model in a new sandbox, printing each step to
// w: the model's text, its tool calls summarised and their results
// abbreviated. It ends when the model submits an answer, replies without a
// tool call, or MaxSteps requests have been made; then it copies the files
// of the working directory to cfg.Out and closes the sandbox. The error is
// for the model's endpoint, the sandbox or ctx failing; the Outcome then
// describes the episode until the failure.
func Run(ctx context.Context, cfg Config, task string, w io.Writer) (*Outcome, error) {
	if cfg.Model == "" {
		return nil, errors.New("agent: no model: pass -model or set OPENAI_MODEL")
	}
	if cfg.Image == "" {
		return nil, errors.New("agent: no sandbox image")
	}
	if strings.TrimSpace(task) == "" {
		return nil, errors.New("agent: empty task")
	}
	maxSteps := cfg.MaxSteps
	if maxSteps <= 0 {
		maxSteps = 30
	}
	opts := []option.RequestOption{option.WithMaxRetries(2), option.WithRequestTimeout(5 * time.Minute)}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(cfg.BaseURL))
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	client := openai.NewClient(opts...)

	start := time.Now()
	sb, err := sandbox.New(ctx, sandbox.WithImage(cfg.Image), sandbox.WithWorkdir(workdir), sandbox.WithLimits(cfg.Limits))
	if err != nil {
		return nil, err
	}
	defer sb.Close()
	fmt.Fprintf(w, "sandbox %.12s started from %s in %v\n", sb.ID(), cfg.Image, time.Since(start).Round(10*time.Millisecond))

	set := tools.New(sb)
	params := openai.ChatCompletionNewParams{
		Model:    cfg.Model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(systemPrompt), openai.UserMessage(task)},
		Tools:    toolParams(set),
	}
	out := &Outcome{}
	for out.Stop == "" && out.Steps < maxSteps {
		out.Steps++
		fmt.Fprintf(w, "\n── step %d ──\n", out.Steps)
		resp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			return out, fmt.Errorf("agent: step %d: model request: %w", out.Steps, err)
		}
		if len(resp.Choices) == 0 {
			return out, fmt.Errorf("agent: step %d: the model's reply has no choices", out.Steps)
		}
		msg := resp.Choices[0].Message
		if text := strings.TrimSpace(msg.Content); text != "" {
			fmt.Fprintf(w, "assistant: %s\n", indent(text, "           "))
		}
		params.Messages = append(params.Messages, assistantParam(msg))
		if len(msg.ToolCalls) == 0 {
			out.Stop = "model stopped"
			fmt.Fprintf(w, "(the model stopped without a tool call: finish_reason %q)\n", resp.Choices[0].FinishReason)
			break
		}
		for _, tc := range msg.ToolCalls {
			name, arguments := callOf(tc)
			fmt.Fprintf(w, "→ %s\n", summarize(name, arguments))
			result, err := set.Call(ctx, name, arguments)
			if err != nil {
				return out, fmt.Errorf("agent: step %d: %s: %w", out.Steps, name, err)
			}
			fmt.Fprintf(w, "%s\n", abbreviate(result))
			out.Calls = append(out.Calls, Call{Step: out.Steps, ID: tc.ID, Name: name, Arguments: arguments, Result: result})
			params.Messages = append(params.Messages, openai.ToolMessage(result, tc.ID))
		}
		if answer, ok := set.Submitted(); ok {
			out.Answer, out.Submitted, out.Stop = answer, true, "submitted"
		}
	}
	if out.Stop == "" {
		out.Stop = "step limit"
		fmt.Fprintf(w, "\n(step limit of %d reached)\n", maxSteps)
	}

	if cfg.Out != "" {
		if out.Artifacts, err = copyArtifacts(ctx, sb, cfg.Out); err != nil {
			return out, err
		}
		fmt.Fprintf(w, "\ncopied %d item(s) from %s to %s\n", len(out.Artifacts), workdir, cfg.Out)
		for _, a := range out.Artifacts {
			fmt.Fprintf(w, "  %s\n", a)
		}
	}
	if out.Submitted {
		fmt.Fprintf(w, "\nanswer: %s\n", indent(out.Answer, "        "))
	} else {
		fmt.Fprintf(w, "\nno answer submitted (%s after %d steps)\n", out.Stop, out.Steps)
	}
	return out, nil
}

// callOf returns the tool name and arguments of a call.
func callOf(tc openai.ChatCompletionMessageToolCallUnion) (name, arguments string) {
	if tc.Type == "custom" {
		return tc.Custom.Name, tc.Custom.Input
	}
	return tc.Function.Name, tc.Function.Arguments
}

// assistantParam turns the model's reply into the history's assistant
// message. Unlike msg.ToParam, it keeps tool calls whose "type" the server
// left out, as some OpenAI-compatible servers do.
func assistantParam(msg openai.ChatCompletionMessage) openai.ChatCompletionMessageParamUnion {
	var p openai.ChatCompletionAssistantMessageParam
	if msg.Content != "" {
		p.Content.OfString = openai.String(msg.Content)
	}
	for _, tc := range msg.ToolCalls {
		name, arguments := callOf(tc)
		p.ToolCalls = append(p.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       tc.ID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: name, Arguments: arguments},
			},
		})
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: &p}
}

// toolParams turns the tool set into the request's tool list.
func toolParams(set *tools.Set) []openai.ChatCompletionToolUnionParam {
	var ts []openai.ChatCompletionToolUnionParam
	for _, d := range set.Definitions() {
		var schema map[string]any
		if err := json.Unmarshal(d.Parameters, &schema); err != nil {
			panic(err) // the tools package tests its schemas
		}
		ts = append(ts, openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name:        d.Name,
			Description: openai.String(d.Description),
			Parameters:  openai.FunctionParameters(schema),
		}))
	}
	return ts
}

// copyArtifacts copies each non-hidden entry of the working directory into
// the host directory out, and returns the host paths.
func copyArtifacts(ctx context.Context, sb *sandbox.Sandbox, out string) ([]string, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	ents, err := sb.ReadDir(ctx, workdir)
	if err != nil {
		return nil, fmt.Errorf("agent: listing %s: %w", workdir, err)
	}
	var copied []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := sb.CopyOut(ctx, path.Join(workdir, e.Name()), out); err != nil {
			return copied, fmt.Errorf("agent: copying out %s: %w", e.Name(), err)
		}
		copied = append(copied, filepath.Join(out, e.Name()))
	}
	return copied, nil
}

// summarize describes a tool call in one or two lines.
func summarize(name, arguments string) string {
	var a map[string]any
	if json.Unmarshal([]byte(arguments), &a) != nil {
		return fmt.Sprintf("%s %s", name, clip(oneLine(arguments), 120))
	}
	s := func(k string) string { v, _ := a[k].(string); return v }
	switch {
	case name == tools.ExecuteBash && s("command") != "":
		line := "$ " + firstLine(s("command"))
		if t, ok := a["timeout"]; ok {
			line += fmt.Sprintf("   (timeout %vs)", t)
		}
		return "execute_bash " + line
	case name == tools.Python && s("code") != "":
		lines := strings.Split(strings.TrimRight(s("code"), "\n"), "\n")
		line := "python >>> " + clip(lines[0], 100)
		if len(lines) > 1 {
			line += fmt.Sprintf(" (+%d lines)", len(lines)-1)
		}
		return line
	case name == tools.Editor && s("command") != "" && s("path") != "":
		line := fmt.Sprintf("str_replace_editor %s %s", s("command"), s("path"))
		switch s("command") {
		case "create":
			line += fmt.Sprintf(" (%d lines)", countLines(s("file_text")))
		case "str_replace":
			line += fmt.Sprintf(": %s ⇒ %s", clip(firstLine(s("old_str")), 50), clip(firstLine(s("new_str")), 50))
		case "insert":
			line += fmt.Sprintf(" after line %v: %s", a["insert_line"], clip(firstLine(s("new_str")), 60))
		case "view":
			if r, ok := a["view_range"]; ok {
				line += fmt.Sprintf(" %v", r)
			}
		}
		return line
	case name == tools.Submit && a["answer"] != nil:
		return "submit: " + clip(oneLine(s("answer")), 120)
	}
	return fmt.Sprintf("%s %s", name, clip(oneLine(arguments), 120))
}

// abbreviate shows a tool result in at most a dozen lines: the first six
// and the last five, each cut at 240 characters.
func abbreviate(result string) string {
	lines := strings.Split(strings.TrimRight(result, "\n"), "\n")
	if len(lines) > 12 {
		omitted := fmt.Sprintf("… (%d lines not shown)", len(lines)-11)
		lines = append(append(lines[:6:6], omitted), lines[len(lines)-5:]...)
	}
	for i, l := range lines {
		lines[i] = "  │ " + clip(l, 240)
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	first, rest, more := strings.Cut(s, "\n")
	if more && strings.TrimSpace(rest) != "" {
		return fmt.Sprintf("%s … (+%d lines)", first, strings.Count(strings.TrimRight(rest, "\n"), "\n")+1)
	}
	return first
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// clip cuts s to n runes.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func indent(s, prefix string) string { return strings.ReplaceAll(s, "\n", "\n"+prefix) }

// countLines counts lines as an editor does: "a\nb" and "a\nb\n" both
// have two.
func countLines(s string) int {
	if s == "" {
		return 0
	}
	return strings.Count(strings.TrimSuffix(s, "\n"), "\n") + 1
}
