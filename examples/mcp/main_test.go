package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/sandboxtest"
	"github.com/agentsandbox/sandbox/tools"
)

// pythonImage is SANDBOX_IMAGE or the project's Debian + python3 image;
// serverBin is this example built as a program, the way a client runs it.
var pythonImage, serverBin string

func TestMain(m *testing.M) {
	// The tests make no sandbox themselves; the servers' sandboxes are
	// checked by each test, this process's objects by sandboxtest.
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
	pythonImage, err = images.FromEnv(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test image:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "mcp-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serverBin = filepath.Join(dir, "mcp")
	build := exec.CommandContext(ctx, "go", "build", "-o", serverBin, ".")
	out, err := build.CombinedOutput()
	cancel()
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := sandboxtest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// lockedBuffer collects a child's standard error.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// server is a running server process and the client session connected to
// it over its standard input and output.
type server struct {
	cmd    *exec.Cmd
	cs     *mcp.ClientSession
	stderr *lockedBuffer
}

// terminateAfter is how long the client's Close waits for the server to
// exit on its own before sending SIGTERM.
const terminateAfter = 30 * time.Second

func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	s := &server{stderr: &lockedBuffer{}}
	s.cmd = exec.Command(serverBin, args...)
	s.cmd.Stderr = s.stderr
	s.cmd.Env = append(os.Environ(), "SANDBOX_IMAGE="+pythonImage)
	client := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	s.cs, err = client.Connect(ctx, &mcp.CommandTransport{Command: s.cmd, TerminateDuration: terminateAfter}, nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v\nserver log:\n%s", serverBin, err, s.stderr)
	}
	t.Cleanup(func() {
		s.cs.Close() // no-op if the test closed it
		if t.Failed() {
			t.Logf("server log:\n%s", s.stderr)
		}
	})
	return s
}

// call calls a tool and returns the text of its result and IsError.
func (s *server) call(t *testing.T, name string, args any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("CallTool %s: %v", name, err)
	}
	return text(t, res), res.IsError
}

// text returns the text of a result made of one text content.
func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) != 1 {
		t.Fatalf("result has %d contents, want 1: %+v", len(res.Content), res.Content)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("result content is %T, want *mcp.TextContent", res.Content[0])
	}
	return tc.Text
}

// close closes the client, which closes the server's standard input, and
// checks that the server exited by itself with status 0.
func (s *server) close(t *testing.T) {
	t.Helper()
	start := time.Now()
	err := s.cs.Close()
	took := time.Since(start)
	if err != nil {
		t.Errorf("closing the client: %v", err)
	}
	if st := s.cmd.ProcessState; st == nil || !st.Exited() || st.ExitCode() != 0 {
		t.Errorf("server process state after Close: %v, want exit status 0", st)
	}
	// The client sends SIGTERM only after terminateAfter; the server must
	// have gone well before.
	if took >= terminateAfter {
		t.Errorf("Close took %v: the server did not exit when its input closed", took)
	}
	t.Logf("client Close returned in %v", took)
}

// objects lists the sandbox containers and the volumes that process pid
// made, by their owner label.
func objects(t *testing.T, pid int) (cs []sandboxtest.Object, vols []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	objs, err := sandboxtest.Owned(ctx, pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o.Type {
		case "container":
			cs = append(cs, o)
		case "volume":
			vols = append(vols, o.ID)
		}
	}
	return cs, vols
}

// waitGone polls until process pid has no container or volume left.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		cs, vols := objects(t, pid)
		if len(cs)+len(vols) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %d left %d containers and volumes %v", pid, len(cs), vols)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jsonValue decodes JSON for comparisons that ignore formatting.
func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return v
}

// What package tools answers to the calls of TestServer.
const (
	wantBash   = "exit code: 0\n[stdout]\nhello\n42\n"
	wantCreate = "File created successfully at: /workspace/hello.py (2 lines)."
	wantView   = "Here's the result of running `cat -n` on /workspace/hello.py:\n     1\tprint('hello')\n     2\tprint(6 * 7)\n"
	wantRun    = "exit code: 0\n[stdout]\nhello\n42\n"
	wantSubmit = "Answer recorded. The task is finished; no more tool calls are needed."
)

func TestServer(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	pid := s.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The five tools, with the schemas and descriptions of package tools.
	list, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("ListTools: %v", err)
	}
	defs := tools.New(nil).Definitions()
	var names, want []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	for _, d := range defs {
		want = append(want, d.Name)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, []string{tools.ExecuteBash, tools.Python, tools.Editor, tools.Submit, tools.Terminal}) || !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	for _, d := range defs {
		i := slices.IndexFunc(list.Tools, func(tl *mcp.Tool) bool { return tl.Name == d.Name })
		tool := list.Tools[i]
		if tool.Description != d.Description {
			t.Errorf("%s: description %q, want %q", d.Name, tool.Description, d.Description)
		}
		got, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := jsonValue(t, got), jsonValue(t, d.Parameters); !reflect.DeepEqual(g, w) {
			t.Errorf("%s: input schema %s, want %s", d.Name, got, d.Parameters)
		}
	}

	// No sandbox until the first tool call.
	if cs, vols := objects(t, pid); len(cs)+len(vols) != 0 {
		t.Errorf("before any call the server has %d containers and volumes %v", len(cs), vols)
	}

	out, isErr := s.call(t, tools.ExecuteBash, map[string]any{"command": "echo hello; python3 -c 'print(6*7)'"})
	if isErr || out != wantBash {
		t.Errorf("execute_bash: %q (IsError %v), want %q", out, isErr, wantBash)
	}
	cs, _ := objects(t, pid)
	if len(cs) != 1 || cs[0].State != "running" || cs[0].Role != "sandbox" {
		t.Fatalf("after the first call the server has containers %+v, want one running sandbox", cs)
	}
	sandboxID := cs[0].ID

	const file = "/workspace/hello.py"
	out, isErr = s.call(t, tools.Editor, map[string]any{
		"command": "create", "path": file, "file_text": "print('hello')\nprint(6 * 7)\n",
	})
	if isErr || out != wantCreate {
		t.Errorf("create: %q (IsError %v), want %q", out, isErr, wantCreate)
	}
	out, isErr = s.call(t, tools.Editor, map[string]any{"command": "view", "path": file})
	if isErr || out != wantView {
		t.Errorf("view: %q (IsError %v), want %q", out, isErr, wantView)
	}
	// The file is in the same sandbox as the shell.
	out, isErr = s.call(t, tools.ExecuteBash, map[string]any{"command": "python3 hello.py"})
	if isErr || out != wantRun {
		t.Errorf("running the file: %q (IsError %v), want %q", out, isErr, wantRun)
	}
	// A model's mistake is text for the model, not an error result.
	out, isErr = s.call(t, tools.ExecuteBash, map[string]any{"cmd": "ls"})
	if isErr || !strings.HasPrefix(out, "Error: Unknown parameter \"cmd\"") {
		t.Errorf("bad arguments: %q (IsError %v), want an \"Error: Unknown parameter\" text", out, isErr)
	}
	// The python tool: a figure comes back as image content beside the text.
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: tools.Python, Arguments: map[string]any{
		"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 2])\nprint('drawn')"}})
	if err != nil || res.IsError || len(res.Content) != 2 {
		t.Fatalf("python with a figure: %+v, %v", res, err)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, "[stdout]\ndrawn\n") ||
		!strings.Contains(tc.Text, "[image] /workspace/figures/figure-1.png (100x50 image/png)") {
		t.Errorf("python text: %+v", res.Content[0])
	}
	if ic, ok := res.Content[1].(*mcp.ImageContent); !ok || ic.MIMEType != "image/png" || !bytes.HasPrefix(ic.Data, []byte("\x89PNG")) {
		t.Errorf("python image content: %T %+v", res.Content[1], res.Content[1])
	}
	// The terminal: a REPL's prompt answered, in the same sandbox.
	out, isErr = s.call(t, tools.Terminal, map[string]any{"text": "python3 -q\n", "wait_for": ">>>$"})
	// (Typed before the shell's prompt, the command's echo comes first
	// and the prompt shares a line with python's: "$ >>>".)
	if isErr || !strings.HasSuffix(out, ">>>\n") {
		t.Errorf("terminal, python3: %q (IsError %v), want the screen ending with its prompt", out, isErr)
	}
	out, isErr = s.call(t, tools.Terminal, map[string]any{"text": "exec(open('hello.py').read())\n", "wait_for": "42\\n>>>$"})
	if isErr || !strings.Contains(out, "\nhello\n42\n>>>\n") {
		t.Errorf("terminal, a line typed into python3: %q (IsError %v)", out, isErr)
	}
	out, isErr = s.call(t, tools.Submit, map[string]any{"answer": "42"})
	if isErr || out != wantSubmit {
		t.Errorf("submit: %q (IsError %v), want %q", out, isErr, wantSubmit)
	}
	if cs, _ := objects(t, pid); len(cs) != 1 || cs[0].ID != sandboxID {
		t.Errorf("after eight calls the server has containers %+v, want the one sandbox %.12s", cs, sandboxID)
	}

	s.close(t)
	waitGone(t, pid)
	log := s.stderr.String()
	for _, line := range []string{`answer submitted: "42"`, "client went away: shutting down", "sandbox " + sandboxID[:12] + " removed"} {
		if !strings.Contains(log, line) {
			t.Errorf("server log lacks %q:\n%s", line, log)
		}
	}
}

// TestServerActivity: with -activity, execute_bash's result ends with the
// summary of what the command ran.
func TestServerActivity(t *testing.T) {
	t.Parallel()
	s := startServer(t, "-activity")
	out, isErr := s.call(t, tools.ExecuteBash, map[string]any{"command": "/bin/true; echo done"})
	if isErr || !strings.HasSuffix(out, "done\n[activity]\nprograms: 2 — sh, true\n") {
		t.Errorf("execute_bash with -activity: %q (IsError %v), want it to end with the activity summary", out, isErr)
	}
}

// TestServerSignal: SIGTERM ends the server promptly, even with a command
// running, and removes its sandbox.
func TestServerSignal(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	pid := s.cmd.Process.Pid
	if out, isErr := s.call(t, tools.ExecuteBash, map[string]any{"command": "echo up"}); isErr || !strings.Contains(out, "up") {
		t.Fatalf("execute_bash: %q (IsError %v)", out, isErr)
	}
	cs, _ := objects(t, pid)
	if len(cs) != 1 {
		t.Fatalf("server has %d containers, want 1", len(cs))
	}
	id := cs[0].ID

	// A long command is running when the signal comes.
	type result struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: tools.ExecuteBash,
			Arguments: map[string]any{"command": "sleep 600"}})
		done <- result{res, err}
	}()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		top, err := cli.ContainerTop(context.Background(), id, nil)
		if err != nil {
			t.Fatalf("top: %v", err)
		}
		// Docker gives the command as one column, Podman a column per
		// word.
		if slices.ContainsFunc(top.Processes, func(p []string) bool { return strings.HasSuffix(" "+strings.Join(p, " "), " sleep 600") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sleep 600 did not start: %v", top.Processes)
		}
		time.Sleep(50 * time.Millisecond)
	}

	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		// The call ends with the server, never with the command's normal
		// end. The SDK writes no response once its session is closing, so
		// the client sees the connection end (EOF) rather than a result.
		if r.err == nil && !r.res.IsError {
			t.Errorf("the running call returned a normal result: %+v", r.res.Content)
		}
		t.Logf("running call ended after the signal: err %v", r.err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the running call did not end within 2 minutes of SIGTERM")
	}
	s.close(t)
	t.Logf("the server exited %v after SIGTERM", time.Since(start))
	waitGone(t, pid)
	log := s.stderr.String()
	if !strings.Contains(log, "signal received: shutting down") {
		t.Errorf("server log lacks the signal:\n%s", log)
	}
}

// TestServerNoImage: a sandbox that cannot be made is an error result, and
// the server stays up and ends cleanly.
func TestServerNoImage(t *testing.T) {
	t.Parallel()
	s := startServer(t, "-image", "agentsandbox-test/no-such-image:0")
	out, isErr := s.call(t, tools.ExecuteBash, map[string]any{"command": "true"})
	if !isErr || !strings.Contains(out, "image not found") {
		t.Errorf("execute_bash without the image: %q (IsError %v), want an error result saying image not found", out, isErr)
	}
	// The server is still serving.
	if _, err := s.cs.ListTools(context.Background(), nil); err != nil {
		t.Errorf("ListTools after the failure: %v", err)
	}
	s.close(t)
	waitGone(t, s.cmd.Process.Pid)
}
