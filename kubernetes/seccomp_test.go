package kubernetes_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/kubernetes"
)

// The library's seccomp profile, installed on the development cluster's
// nodes, is the pod's profile when Config.SeccompProfile names it; one
// no node has fails New with a clear error.
func TestSeccompLocalhost(t *testing.T) {
	t.Parallel()
	profile, err := kubernetes.SeccompProfile(runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodeNames {
		dir := filepath.Join(devDir, "nodes", n, "kubelet", "seccomp")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "agentsandbox.json"), profile, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := kubernetes.New(kubernetes.Config{SeccompProfile: "agentsandbox.json"})
	defer d.Close()
	sb := newSandbox(t, sandbox.WithDriver(d))
	r, err := sb.Exec(ctxFor(t), "grep ^Seccomp: /proc/self/status; echo ok")
	if err != nil || !strings.Contains(r.Stdout, "Seccomp:\t2") || !strings.HasSuffix(r.Stdout, "ok\n") {
		t.Errorf("a command under the library's profile: %+v, %v", r, err)
	}
	if sp := pod(t, sb).Spec.SecurityContext.SeccompProfile; sp.Type != corev1.SeccompProfileTypeLocalhost {
		t.Errorf("seccomp profile %+v", sp)
	}

	missing := kubernetes.New(kubernetes.Config{SeccompProfile: "agentsandbox-no-such-profile.json"})
	defer missing.Close()
	_, err = sandbox.New(ctxFor(t), sandbox.WithDriver(missing), sandbox.WithImage(busyboxImage))
	if err == nil || !strings.Contains(err.Error(), "agentsandbox-no-such-profile.json") {
		t.Errorf("New with a profile no node has: %v", err)
	}
}
