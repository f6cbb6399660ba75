package kubernetes_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/kubernetes"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// The tests run against the cluster KUBECONFIG names or, without it, the
// development cluster of cluster/cluster.sh (as root): one that runs is
// used and left running; otherwise the tests start it and stop it at the
// end. The images are built on the local Docker engine and loaded into the
// nodes by `cluster.sh load`.
const (
	devDir        = "/var/lib/agentsandbox-k8s" // cluster.sh's AGENTSANDBOX_K8S_DIR
	devKubeconfig = devDir + "/admin.kubeconfig"
)

// loadedEnv tells a test binary run again by a test (the conformance
// suite's owner subtest) that the images are loaded already.
const loadedEnv = "AGENTSANDBOX_K8S_LOADED"

var (
	busyboxImage string
	drv          *kubernetes.Driver
	cs           *k8s.Clientset // the backend's client, for asking the cluster
	nodeNames    []string       // the cluster's nodes, sorted
)

func TestMain(m *testing.M) {
	started, err := setup()
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes tests:", err)
	} else {
		code = sandboxtest.Main(m, sandbox.WithDriver(drv))
	}
	if started {
		if err := clusterSh("down"); err != nil {
			fmt.Fprintln(os.Stderr, "kubernetes tests: stopping the cluster:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup finds or starts the cluster, builds and loads the images, and
// makes the backend (drv). started says it started the cluster.
func setup() (started bool, err error) {
	dev := os.Getenv("KUBECONFIG") == ""
	if dev {
		if clusterSh("status") != nil {
			fmt.Fprintln(os.Stderr, "kubernetes tests: starting the development cluster (cluster/cluster.sh up)")
			if err := clusterSh("up"); err != nil {
				return false, err
			}
			started = true
		}
		os.Setenv("KUBECONFIG", devKubeconfig)
	}
	return started, setupOn(dev)
}

// clusterSh runs cluster/cluster.sh with args, its output to stderr.
func clusterSh(args ...string) error {
	cmd := exec.Command("bash", append([]string{"cluster/cluster.sh"}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cluster.sh %v: %w", args, err)
	}
	return nil
}

// setupOn builds the images and, on the development cluster, loads them
// into its nodes (another cluster's nodes must have them: the agent's
// image, kubernetes.AgentImage(), and busybox's, images.Busybox).
func setupOn(dev bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var err error
	if busyboxImage, err = images.Ensure(ctx, images.Busybox, os.Stderr); err != nil {
		return err
	}
	if dev && os.Getenv(loadedEnv) == "" {
		if err := loadImages(ctx, busyboxImage); err != nil {
			return err
		}
		os.Setenv(loadedEnv, "1")
	}
	drv = kubernetes.New(kubernetes.Config{})
	if cs, err = drv.Clientset(); err != nil {
		return err
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		nodeNames = append(nodeNames, n.Name)
	}
	slices.Sort(nodeNames)
	if len(nodeNames) < 2 {
		return fmt.Errorf("the cluster has nodes %v: the tests need two", nodeNames)
	}
	return nil
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
	return clusterSh(append([]string{"load", kubernetes.AgentImage()}, imgs...)...)
}

// The conformance suite on the cluster.
func TestConformance(t *testing.T) {
	sandboxtest.Conformance(t, onCluster()...)
}

func nodeReady(conds []corev1.NodeCondition) bool {
	for _, c := range conds {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
