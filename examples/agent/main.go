// Command agent solves a task with a language model that works in a
// sandbox through three tools: execute_bash, str_replace_editor and
// submit (see package tools). It talks to any OpenAI-compatible
// chat-completions endpoint: OpenAI, or a local server such as vLLM,
// llama.cpp or Ollama.
//
//	go run ./agent [flags] TASK...
//
//	export OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=qwen2.5-coder:14b
//	go run ./agent -out plots 'Plot y = sin(x) for x in [0, 2π] into sine.png'
//
// Flags:
//
//	-base-url URL   endpoint (default $OPENAI_BASE_URL, else OpenAI's)
//	-model NAME     model (default $OPENAI_MODEL)
//	-key KEY        API key (default $OPENAI_API_KEY)
//	-max-steps N    model requests at most (default 30)
//	-out DIR        host directory for the files the agent leaves in /workspace (default agent-out)
//	-image REF      sandbox image (default $SANDBOX_IMAGE, else the project's Python image, built offline if missing)
//
// Each step is printed: the model's text, its tool calls and their results,
// abbreviated. At the end the files of the sandbox's /workspace are copied
// to -out and the answer is printed. The exit status is 0 when the model
// submitted an answer, 2 when it stopped without one, 1 on failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"

	"github.com/agentsandbox/sandbox/images"
)

func main() {
	var cfg Config
	flag.StringVar(&cfg.BaseURL, "base-url", "", "OpenAI-compatible endpoint (default $OPENAI_BASE_URL, else OpenAI's)")
	flag.StringVar(&cfg.Model, "model", "", "model name (default $OPENAI_MODEL)")
	flag.StringVar(&cfg.APIKey, "key", "", "API key (default $OPENAI_API_KEY)")
	flag.IntVar(&cfg.MaxSteps, "max-steps", 30, "model requests at most")
	flag.StringVar(&cfg.Out, "out", "agent-out", "host directory for the files left in /workspace")
	flag.StringVar(&cfg.Image, "image", "", "sandbox image (default $SANDBOX_IMAGE, else the project's Python image)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] TASK...\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(0)
	task := strings.Join(flag.Args(), " ")
	if strings.TrimSpace(task) == "" {
		flag.Usage()
		os.Exit(1)
	}
	// Environment defaults are read here rather than shown as flag
	// defaults, so that -help never prints the key.
	for _, v := range []struct {
		dst *string
		env string
	}{{&cfg.BaseURL, "OPENAI_BASE_URL"}, {&cfg.Model, "OPENAI_MODEL"}, {&cfg.APIKey, "OPENAI_API_KEY"}} {
		if *v.dst == "" {
			*v.dst = os.Getenv(v.env)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if cfg.Image == "" {
		var err error
		if cfg.Image, err = images.FromEnv(ctx, os.Stderr); err != nil {
			log.Fatal(err)
		}
	}
	out, err := Run(ctx, cfg, task, os.Stdout)
	if err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
	if !out.Submitted {
		stop()
		os.Exit(2)
	}
}
