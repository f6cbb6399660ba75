package sandbox_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// TestHostEnvRefused: Env adds to the sandbox's environment, so the os/exec
// idiom append(os.Environ(), ...) would copy the host's variables into the
// sandbox; it is refused, with a message saying why. Not parallel: it sets
// an environment variable.
func TestHostEnvRefused(t *testing.T) {
	t.Setenv("AGENTSANDBOX_TEST_SECRET", "hunter2") // the environment holds at least this
	sb := newSandbox(t)
	ctx := testCtx(t)
	c := sb.Command(ctx, "env")
	c.Env = append(os.Environ(), "X=1")
	out, err := c.Output()
	if err == nil || !strings.Contains(err.Error(), "os.Environ()") || strings.Contains(string(out), "hunter2") {
		t.Errorf("Cmd.Env = append(os.Environ(), ...): %q, %v; want a refusal", out, err)
	}
	c = sb.Command(ctx, "sh", "-c", "echo $X")
	c.Env = []string{"X=1", "AGENTSANDBOX_TEST_SECRET=given on purpose"}
	if out, err := c.Output(); err != nil || string(out) != "1\n" {
		t.Errorf("a normal Env: %q, %v", out, err)
	}
	if _, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithEnv(os.Environ()...)); err == nil || !strings.Contains(err.Error(), "WithEnv") {
		t.Errorf("WithEnv(os.Environ()...): %v; want a refusal", err)
	}
}

// TestNetworkUnsupported: where firewall rules cannot be installed (no
// root, no iptables), a network policy fails with ErrNetworkUnsupported,
// and the default sandbox (no network) still works. Not parallel: it swaps
// the library's check.
func TestNetworkUnsupported(t *testing.T) {
	restore := sandbox.SetFirewallSupported(func() error { return errors.New("network policies need root (test)") })
	defer restore()
	ctx := testCtx(t)
	_, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithNetwork(sandbox.AllowHosts()))
	if !errors.Is(err, sandbox.ErrNetworkUnsupported) || !strings.Contains(err.Error(), "need root") {
		t.Fatalf("New with a network policy where none can be set up: %v", err)
	}
	sb := newSandbox(t)
	if r := mustExec(t, sb, "echo ok"); r.Stdout != "ok\n" {
		t.Errorf("default sandbox: %q", r.Stdout)
	}
}
