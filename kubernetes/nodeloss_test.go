package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// A node cut off the network: its sandboxes fail with ErrUnresponsive or
// ErrSandboxGone within the library's bound (sandbox.DefaultTimeout), the
// other node's sandboxes keep working, Close deletes every pod, and once
// the link is back the node is Ready again. Not parallel: it takes a node
// away from the other tests.
func TestNodeLost(t *testing.T) {
	ctx := ctxFor(t)
	byNode := map[string][]*sandbox.Sandbox{}
	for i := 0; i < 12 && (len(byNode) < 2 || len(byNode[nodeNames[0]]) == 0 || len(byNode[nodeNames[1]]) == 0); i++ {
		sb := newSandbox(t)
		n := pod(t, sb).Spec.NodeName
		byNode[n] = append(byNode[n], sb)
	}
	lost, kept := nodeNames[1], nodeNames[0]
	if len(byNode[lost]) == 0 || len(byNode[kept]) == 0 {
		t.Fatalf("sandboxes by node: %v; want some on both", byNode)
	}
	if err := clusterSh("cut", lost); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := clusterSh("heal", lost); err != nil {
				t.Error(err)
			}
		}
	}
	defer heal()

	start := time.Now()
	for _, sb := range byNode[lost] {
		r, err := sb.Exec(ctx, "echo hi")
		if !errors.Is(err, sandbox.ErrUnresponsive) && !errors.Is(err, sandbox.ErrSandboxGone) {
			t.Errorf("Exec in a sandbox on the lost node: %+v, %v; want ErrUnresponsive or ErrSandboxGone", r, err)
		}
		t.Logf("on the lost node, after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	for _, sb := range byNode[kept] {
		if r, err := sb.Exec(ctx, "echo hi"); err != nil || r.Stdout != "hi\n" {
			t.Errorf("Exec in a sandbox on the other node: %+v, %v", r, err)
		}
	}
	for _, sbs := range byNode {
		for _, sb := range sbs {
			sb.Close()
		}
	}
	objs, err := drv.Owned(ctx, 0)
	if err != nil || len(objs) != 0 {
		t.Errorf("pods left after Close with a node lost: %v, %v", objs, err)
	}
	heal()
	sandboxtest.Eventually(t, 2*time.Minute, func() (bool, string) {
		n, err := cs.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("node %s after its link came back: %v", lost, err)
		}
		return nodeReady(n.Status.Conditions), fmt.Sprintf("node %s not Ready after its link came back: %+v", lost, n.Status.Conditions)
	})
	// The healed node runs sandboxes again.
	sb, err := sandbox.New(context.Background(), onCluster(sandbox.WithLabels(map[string]string{"test": "healed"}))...)
	if err != nil {
		t.Fatal(err)
	}
	sb.Close()
}
