// Command mcp is a Model Context Protocol server, over stdio, that gives an
// MCP client (an agent, an IDE, Claude Desktop...) the sandbox tools of
// package tools: execute_bash, terminal, python, str_replace_editor and submit, all working in
// one hardened, network-less sandbox.
//
//	go run ./mcp [-image REF] [-activity]
//
// Register it with a client as a stdio server whose command is the built
// binary. The sandbox is made on the first tool call and removed when the
// client goes away (it closes the server's standard input) or the server
// gets SIGINT or SIGTERM; if the server is killed outright, the sandbox
// still ends itself, and Prune removes what is left.
//
// The image comes from -image, else SANDBOX_IMAGE, else the project's own
// Debian + Python image, which is built offline first if it is missing.
// With -activity, the sandbox keeps its activity record and each
// execute_bash result ends with a short summary of what the command ran
// and tried to reach (tools.WithActivitySummary). Standard output carries
// the protocol; logs go to standard error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/tools"
)

// version is reported to clients in the initialize handshake.
const version = "0.1.0"

const instructions = `The tools run in one Linux sandbox kept for this whole session: ` +
	`a container with no network, a non-root user and the working directory /workspace. ` +
	`Use execute_bash to run shell commands, terminal for interactive programs (type text, press keys, ` +
	`read the screen), str_replace_editor to view, create and edit files ` +
	`(absolute paths), and submit to give your final answer.`

func main() {
	image := flag.String("image", "", "image to run (default: $SANDBOX_IMAGE or the project's Python image)")
	activity := flag.Bool("activity", false, "record what each command does and summarize it in execute_bash's results")
	flag.Parse()
	log.SetOutput(os.Stderr) // standard output is the protocol
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("mcp: ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := serve(ctx, &session{image: *image, activity: *activity}, &mcp.StdioTransport{})
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

// serve runs the server on transport until the client goes away or ctx is
// done, then removes the sandbox. A done ctx is a normal end.
func serve(ctx context.Context, sess *session, transport mcp.Transport) error {
	server := mcp.NewServer(&mcp.Implementation{Name: "agentsandbox", Title: "Sandbox tools", Version: version},
		&mcp.ServerOptions{Instructions: instructions})
	for _, d := range tools.New(nil).Definitions() {
		server.AddTool(&mcp.Tool{Name: d.Name, Description: d.Description, InputSchema: d.Parameters},
			sess.handler(ctx, d.Name))
	}

	log.Printf("serving on stdio (pid %d)", os.Getpid())
	err := server.Run(ctx, transport)
	switch {
	case ctx.Err() != nil:
		log.Printf("signal received: shutting down")
		err = nil
	case err == nil:
		log.Printf("client went away: shutting down")
	default:
		log.Printf("session ended: %v", err)
	}
	if cerr := sess.close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// session holds the sandbox of the one client a stdio server has.
type session struct {
	image    string
	activity bool // -activity

	mu     sync.Mutex // held while the sandbox is made
	sb     *sandbox.Sandbox
	set    *tools.Set
	closed bool
}

// tools returns the session's tool set, making its sandbox first if this is
// the first call.
func (s *session) tools(ctx context.Context) (*tools.Set, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("the server is shutting down")
	}
	if s.set != nil {
		return s.set, nil
	}
	ref := s.image
	if ref == "" {
		var err error
		if ref, err = images.FromEnv(ctx, os.Stderr); err != nil {
			return nil, err
		}
	}
	sb, err := sandbox.New(ctx, sandbox.WithImage(ref), sandbox.WithActivity(s.activity))
	if err != nil {
		return nil, err
	}
	log.Printf("sandbox %.12s is up (image %s)", sb.ID(), ref)
	var opts []tools.Option
	if s.activity {
		opts = append(opts, tools.WithActivitySummary())
	}
	s.sb, s.set = sb, tools.New(sb, opts...)
	return s.set, nil
}

// close removes the sandbox, if one was made, and refuses later calls. A
// sandbox still being made is removed once it is up.
func (s *session) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.sb == nil {
		return nil
	}
	err := s.sb.Close()
	log.Printf("sandbox %.12s removed", s.sb.ID())
	if err != nil {
		return fmt.Errorf("closing the sandbox: %w", err)
	}
	return nil
}

// handler returns the MCP handler of the tool called name. The tool's
// answer, a model's mistakes included, is the text of the result; a failure
// of the sandbox or the engine is a result with IsError set. A call still
// running when stop is done is cancelled, so that a signal ends the server
// promptly.
func (s *session) handler(stop context.Context, name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(stop, cancel)()

		args := "{}"
		if req.Params != nil && len(req.Params.Arguments) > 0 {
			args = string(req.Params.Arguments)
		}
		set, err := s.tools(ctx)
		if err != nil {
			log.Printf("%s: no sandbox: %v", name, err)
			return errorResult("the sandbox could not be started: %v", err), nil
		}
		res, err := set.CallResult(ctx, name, args)
		out := res.Text
		if err != nil {
			log.Printf("%s: %v", name, err)
			if out != "" { // what ran until the failure
				return errorResult("%s\nthe sandbox failed: %v", out, err), nil
			}
			return errorResult("the sandbox failed: %v", err), nil
		}
		if name == tools.Submit {
			if answer, ok := set.Submitted(); ok {
				log.Printf("answer submitted: %q", answer)
			}
		}
		content := []mcp.Content{&mcp.TextContent{Text: out}}
		for _, img := range res.Images { // the python tool's figures
			content = append(content, &mcp.ImageContent{Data: img.Data, MIMEType: img.MIME})
		}
		return &mcp.CallToolResult{Content: content}, nil
	}
}

func errorResult(format string, a ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, a...)}},
		IsError: true,
	}
}
