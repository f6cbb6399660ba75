package kubernetes_test

import (
	"context"
	"fmt"
	"log"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/kubernetes"
)

// A sandbox on a cluster: the kubeconfig as kubectl reads it (or the
// in-cluster configuration), the sandboxes in namespace "default".
func ExampleNew() {
	ctx := context.Background()
	drv := kubernetes.New(kubernetes.Config{Namespace: "default"})
	defer drv.Close()
	sb, err := sandbox.New(ctx, sandbox.WithDriver(drv), sandbox.WithImage(busyboxImage))
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Close()
	r, err := sb.Exec(ctx, "echo hello from $(hostname | cut -c1-12)")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(r.Stdout)
	// Output: hello from agentsandbox
}
