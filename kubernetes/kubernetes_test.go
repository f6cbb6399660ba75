package kubernetes_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newSandbox(t *testing.T, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return sandboxtest.New(t, onCluster(opts...)...)
}

// onCluster are the options of the tests' sandboxes: the cluster's driver
// (drv) and the busybox image, then more (a later WithDriver wins).
func onCluster(more ...sandbox.Option) []sandbox.Option {
	return append([]sandbox.Option{sandbox.WithDriver(drv), sandbox.WithImage(busyboxImage)}, more...)
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func pod(t *testing.T, sb *sandbox.Sandbox) *corev1.Pod {
	t.Helper()
	p, err := cs.CoreV1().Pods(drv.Namespace()).Get(ctxFor(t), sb.ID(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's pod %s: %v", sb.ID(), err)
	}
	return p
}

// Not one byte of a command's output, a file or the agent's frames lands
// in the pod's log; commands see no service-account token and no service
// variables; the pod is made as the package doc says.
func TestPodHardening(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := ctxFor(t)
	cmd := sb.Command(ctx, "sh", "-c", "head -c 4000000 /dev/zero | tr '\\0' x; head -c 1000000 /dev/zero | tr '\\0' y >&2")
	var n countWriter
	cmd.Stdout, cmd.Stderr = &n, &n
	if err := cmd.Run(); err != nil || n != 5000000 {
		t.Fatalf("5 MB of output: %d bytes, %v", n, err)
	}
	r, err := sb.Exec(ctx, "env; ls /var/run/secrets/kubernetes.io /run/secrets/kubernetes.io 2>&1; echo end")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r.Stdout, "KUBERNETES_") || strings.Contains(r.Stdout, "_SERVICE_HOST") {
		t.Errorf("service variables inside the sandbox:\n%s", r.Stdout)
	}
	if !strings.Contains(r.Stdout, "No such file") || strings.Contains(r.Stdout, "token") {
		t.Errorf("a service-account token directory inside the sandbox: %s", r.Stdout)
	}
	if err := sb.WriteFile(ctx, "f", []byte(strings.Repeat("secret-file ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ReadFile(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	logs, err := cs.CoreV1().Pods(drv.Namespace()).GetLogs(sb.ID(), &corev1.PodLogOptions{Container: "sandbox"}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(logs)
	logs.Close()
	if len(b) != 0 {
		t.Errorf("the pod log holds %d bytes: %.200q", len(b), b)
	}

	p := pod(t, sb)
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken ||
		p.Spec.EnableServiceLinks == nil || *p.Spec.EnableServiceLinks ||
		p.Spec.HostNetwork || p.Spec.HostPID || p.Spec.HostIPC || p.Spec.RestartPolicy != corev1.RestartPolicyNever ||
		p.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("pod spec: %+v", p.Spec)
	}
	c := p.Spec.Containers[0]
	sc := c.SecurityContext
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("the sandbox container's security context: %+v", sc)
	}
	for _, ic := range p.Spec.InitContainers {
		for _, c := range ic.SecurityContext.Capabilities.Add {
			if c != "NET_ADMIN" {
				t.Errorf("init container capability %s", c)
			}
		}
	}
	if p.Spec.SecurityContext.SeccompProfile == nil || p.Spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccomp profile: %+v", p.Spec.SecurityContext.SeccompProfile)
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		t.Errorf("no memory limit: %+v", c.Resources)
	}
	// No interface but loopback is up.
	r, err = sb.Exec(ctx, "cat /proc/net/route | wc -l; ip -o link 2>/dev/null | grep -v ' lo:' | grep -c ',UP' || true")
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(r.Stdout); len(f) == 0 || f[0] != "1" {
		t.Errorf("routes inside a sandbox with no network: %q (want the header line only)", r.Stdout)
	}
}

// WithRuntime names a RuntimeClass; one the cluster lacks is an error
// naming it (admission refuses the pod with a 403: no RBAC hint).
func TestRuntimeClass(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	const name = "agentsandbox-test-runc"
	_, err := cs.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: "runc"}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.NodeV1().RuntimeClasses().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	sb := newSandbox(t, sandbox.WithRuntime(name))
	if r, err := sb.Exec(ctx, "echo ok"); err != nil || r.Stdout != "ok\n" {
		t.Fatalf("Exec: %+v, %v", r, err)
	}
	if p := pod(t, sb); p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != name {
		t.Errorf("runtimeClassName %v, want %s", p.Spec.RuntimeClassName, name)
	}
	_, err = sandbox.New(ctx, onCluster(sandbox.WithRuntime("agentsandbox-no-such-class"))...)
	if err == nil || !strings.Contains(err.Error(), `no RuntimeClass "agentsandbox-no-such-class"`) || strings.Contains(err.Error(), "grant") {
		t.Errorf("New with a RuntimeClass the cluster lacks: %v, want it named and no RBAC hint", err)
	}
}

// An image no node has is ErrImageNotFound, and nothing is left.
func TestImageNotFound(t *testing.T) {
	t.Parallel()
	_, err := sandbox.New(ctxFor(t), sandbox.WithDriver(drv), sandbox.WithImage("agentsandbox.dev/no-such-image:1"))
	if !errors.Is(err, sandbox.ErrImageNotFound) {
		t.Errorf("New of a missing image: %v, want ErrImageNotFound", err)
	}
}

// The scheduler spreads sandboxes over both nodes.
func TestSpread(t *testing.T) {
	t.Parallel()
	nodes := map[string]int{}
	for range 6 {
		sb := newSandbox(t)
		nodes[pod(t, sb).Spec.NodeName]++
	}
	if len(nodes) < 2 {
		t.Errorf("6 sandboxes on nodes %v, want both nodes", nodes)
	}
	t.Logf("nodes: %v", nodes)
}
