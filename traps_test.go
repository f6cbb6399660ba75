package sandbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
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

// diskOf returns the "disk" attribute of the sandbox.create record in a
// JSON audit log.
func diskOf(t *testing.T, log []byte) string {
	t.Helper()
	for _, line := range bytes.Split(log, []byte("\n")) {
		var rec struct{ Msg, Disk string }
		if json.Unmarshal(line, &rec) == nil && rec.Msg == "sandbox.create" {
			return rec.Disk
		}
	}
	t.Fatalf("no sandbox.create record in %s", log)
	return ""
}

// checkDiskLimit writes past a 16 MiB disk limit and expects ENOSPC with
// the bytes written bounded by it.
func checkDiskLimit(t *testing.T, sb *sandbox.Sandbox) {
	t.Helper()
	r := mustExec(t, sb, `dd if=/dev/urandom of=fill bs=1048576 count=20 2>&1; echo "rc=$?"; wc -c < fill`)
	if !strings.Contains(r.Stdout, "No space left") || strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("writing 20 MiB into a 16 MiB disk: %q", r.Stdout)
	}
	var n int64
	fmt.Sscan(r.Stdout[strings.LastIndex(strings.TrimSpace(r.Stdout), "\n")+1:], &n)
	if n > 16<<20 || n < 8<<20 {
		t.Errorf("%d bytes written into a 16 MiB disk", n)
	}
}

// TestDiskLimitEveryUser: New with a disk limit works for whoever runs it
// — root gets an ext4 image on a loop device, a docker-group user a sized
// tmpfs — and the limit holds either way. .ci/run runs it as both.
func TestDiskLimitEveryUser(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	var mu sync.Mutex
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 16 << 20}),
		sandbox.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &log}, nil))))
	want := "ext4"
	if os.Geteuid() != 0 {
		want = "tmpfs"
	}
	mu.Lock()
	got := diskOf(t, log.Bytes())
	mu.Unlock()
	if got != want {
		t.Errorf("disk %q for uid %d, want %q", got, os.Geteuid(), want)
	}
	t.Logf("uid %d: the working directory is %s", os.Geteuid(), got)
	checkDiskLimit(t, sb)
}

// TestDiskWithoutLoop: where loop devices cannot be made, the disk limit
// is a sized tmpfs: enforced, no error. Not parallel: it swaps the check.
func TestDiskWithoutLoop(t *testing.T) {
	restore := sandbox.SetDiskSupported(func() error { return errors.New("no CAP_SYS_ADMIN (test)") })
	defer restore()
	var log bytes.Buffer
	var mu sync.Mutex
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 16 << 20}),
		sandbox.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &log}, nil))))
	mu.Lock()
	got := diskOf(t, log.Bytes())
	mu.Unlock()
	if got != "tmpfs" {
		t.Errorf("disk %q without loop devices, want tmpfs", got)
	}
	if r := mustExec(t, sb, `df -k . | awk 'NR==2 {print $2}'`); r.Stdout != "16384\n" {
		t.Errorf("working directory size %q KiB, want 16384", r.Stdout)
	}
	checkDiskLimit(t, sb)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
