package docker_test

import (
	"context"
	"fmt"
	"log"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/docker"
)

// One driver for a Podman engine, shared by every sandbox made on it.
func ExampleNew() {
	ctx := context.Background()
	d := docker.New(docker.Config{Host: "unix:///run/podman/podman.sock"})
	defer d.Close() // after the sandboxes

	sb, err := sandbox.New(ctx, sandbox.WithDriver(d), sandbox.WithImage("python:3.12-slim"))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()
	r, err := sb.Exec(ctx, "python3 -c 'print(6*7)'")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r.Stdout)
}
