package tools_test

import (
	"context"
	"fmt"
	"log"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/tools"
)

// exampleSandbox starts the sandbox the examples run in. In a program it
// would be sandbox.New(ctx, sandbox.WithImage("python:3.12-slim")).
func exampleSandbox(ctx context.Context) *sandbox.Sandbox {
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
	if err != nil {
		log.Fatal(err)
	}
	return sb
}

// A tool loop hands each call of the model to Call and sends the text back.
func ExampleSet_Call() {
	ctx := context.Background()
	sb := exampleSandbox(ctx)
	defer sb.Close()
	set := tools.New(sb)

	// The calls a model might make, with their JSON arguments.
	for _, c := range []struct{ name, args string }{
		{tools.Editor, `{"command": "create", "path": "/workspace/hello.sh", "file_text": "echo hello $1\n"}`},
		{tools.ExecuteBash, `{"command": "sh hello.sh world; sh hello.sh >&2; exit 3"}`},
		{tools.Editor, `{"command": "str_replace", "path": "/workspace/hello.sh", "old_str": "hello", "new_str": "goodbye"}`},
		{tools.Editor, `{"command": "view", "path": "hello.sh"}`},
	} {
		text, err := set.Call(ctx, c.name, c.args)
		if err != nil {
			log.Fatal(err) // the sandbox failed: end the episode
		}
		fmt.Printf("%s\n---\n", text)
	}
	// Output:
	// File created successfully at: /workspace/hello.sh (1 line).
	// ---
	// exit code: 3
	// [stdout]
	// hello world
	// [stderr]
	// hello
	//
	// ---
	// The file /workspace/hello.sh has been edited. Here's the result of running `cat -n` on a snippet of /workspace/hello.sh:
	//      1	echo goodbye $1
	// Review the changes and make sure they are as expected. Edit the file again if necessary.
	// ---
	// Error: The path hello.sh is not an absolute path; it must start with `/`. Maybe you meant /workspace/hello.sh?
	// ---
}

// The episode ends when the model calls submit.
func ExampleSet_Submitted() {
	ctx := context.Background()
	sb := exampleSandbox(ctx)
	defer sb.Close()
	set := tools.New(sb)

	text, err := set.Call(ctx, tools.Submit, `{"answer": "The sum is 55."}`)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(text)
	if answer, ok := set.Submitted(); ok {
		fmt.Println("answer:", answer)
	}
	// Output:
	// Answer recorded. The task is finished; no more tool calls are needed.
	// answer: The sum is 55.
}

// The definitions go into the model's request in the shape of its API.
func ExampleSet_OpenAITools() {
	set := tools.New(nil) // the definitions need no sandbox
	for _, tool := range set.OpenAITools() {
		fn := tool["function"].(map[string]any)
		params := fn["parameters"].(map[string]any)
		fmt.Println(fn["name"], params["required"])
	}
	// Output:
	// execute_bash [command]
	// terminal []
	// python [code]
	// str_replace_editor [command path]
	// submit [answer]
}
