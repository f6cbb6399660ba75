package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/kubernetes"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// The tests run against the cluster that cluster/cluster.sh starts (or the
// one KUBECONFIG names, whose nodes must reach the images below): its
// kubeconfig unless KUBECONFIG is set. The images are built on the local
// Docker engine and loaded into the nodes by `cluster.sh load`.
const devKubeconfig = "/var/lib/agentsandbox-k8s/admin.kubeconfig"

// loadedEnv tells a test binary run again by a test (the conformance
// suite's owner subtest) that the images are loaded already.
const loadedEnv = "AGENTSANDBOX_K8S_LOADED"

var (
	busyboxImage string
	drv          *kubernetes.Driver
	cs           *k8s.Clientset // the test's own client, for asking the cluster
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes tests:", err)
		os.Exit(1)
	}
	os.Exit(sandboxtest.Main(m))
}

func setup() error {
	if os.Getenv("KUBECONFIG") == "" {
		if _, err := os.Stat(devKubeconfig); err != nil {
			return fmt.Errorf("no cluster: set KUBECONFIG, or start the development cluster with kubernetes/cluster/cluster.sh up (%v)", err)
		}
		os.Setenv("KUBECONFIG", devKubeconfig)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var err error
	if busyboxImage, err = images.Ensure(ctx, images.Busybox, os.Stderr); err != nil {
		return err
	}
	if os.Getenv(loadedEnv) == "" {
		if err := loadImages(ctx, busyboxImage); err != nil {
			return err
		}
		os.Setenv(loadedEnv, "1")
	}
	drv = kubernetes.New(kubernetes.Config{})
	sandbox.DefaultDriver = drv
	cs, err = drv.Clientset()
	return err
}

// loadImages puts the agent's image and the test images into the nodes.
func loadImages(ctx context.Context, imgs ...string) error {
	var archive bytes.Buffer
	if err := kubernetes.WriteAgentImage(&archive, runtime.GOARCH); err != nil {
		return err
	}
	load := exec.CommandContext(ctx, "docker", "load")
	load.Stdin = &archive
	if out, err := load.CombinedOutput(); err != nil {
		return fmt.Errorf("docker load of the agent image: %v: %s", err, out)
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{"cluster/cluster.sh", "load", kubernetes.AgentImage()}, imgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cluster.sh load: %v: %s", err, out)
	}
	return nil
}

// The conformance suite on the cluster.
func TestConformance(t *testing.T) {
	sandboxtest.Conformance(t, sandbox.WithImage(busyboxImage))
}
