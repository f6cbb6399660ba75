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
	"github.com/agentsandbox/sandbox/docker"
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
// root, no iptables), Open fails with ErrNetworkUnsupported; an allow-list
// needs no host rule and works, and so does the default sandbox (a driver
// configured never to install rules stands for the host without them).
func TestNetworkUnsupported(t *testing.T) {
	t.Parallel()
	d := docker.New(docker.Config{NoFirewall: true})
	t.Cleanup(func() { d.Close() }) // after the sandboxes' Close
	ctx := testCtx(t)
	_, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithDriver(d), sandbox.WithNetwork(sandbox.NetworkPolicy{Open: true}))
	if !errors.Is(err, sandbox.ErrNetworkUnsupported) || !strings.Contains(err.Error(), "NoFirewall") {
		t.Fatalf("New with Open where it cannot be set up: %v", err)
	}
	sb := newSandbox(t, sandbox.WithDriver(d), sandbox.WithNetwork(sandbox.AllowHosts()))
	if r := mustExec(t, sb, "echo $HTTP_PROXY"); !strings.HasPrefix(r.Stdout, "http://127.0.0.1:") {
		t.Errorf("allow-list sandbox without host rules: %q %q", r.Stdout, r.Stderr)
	}
	sb = newSandbox(t, sandbox.WithDriver(d))
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
// is a sized tmpfs: enforced, no error (a driver configured with
// TmpfsWorkdir stands for the host without them).
func TestDiskWithoutLoop(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	var mu sync.Mutex
	sb := newSandbox(t, tmpfsDriver(t), sandbox.WithLimits(sandbox.Limits{Disk: 16 << 20}),
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

// tmpfsDriver is WithDriver of a Docker driver that makes no loop
// devices, closed at the end of the test.
func tmpfsDriver(t *testing.T) sandbox.Option {
	d := docker.New(docker.Config{TmpfsWorkdir: true})
	t.Cleanup(func() { d.Close() })
	return sandbox.WithDriver(d)
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

// TestDiskTmpfsFitsMemory: a tmpfs working directory (no loop devices) is
// RAM counted towards Memory. The default Disk (1 GiB) is sized down to
// fit in the default Memory (512 MiB) beside /tmp, /dev/shm and the
// processes' reserve, with a record saying so; filling it fails with
// ENOSPC and the sandbox lives on. An explicit Disk that cannot fit is
// refused, naming what to change.
func TestDiskTmpfsFitsMemory(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	var mu sync.Mutex
	sb := newPython(t, tmpfsDriver(t), sandbox.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &log}, nil))))
	mu.Lock()
	logged := log.String()
	mu.Unlock()
	if !strings.Contains(logged, `"msg":"sandbox.limits"`) || !strings.Contains(logged, `"disk":223346688`) {
		t.Errorf("no sandbox.limits record of the disk sized down to 213 MiB (its inodes counted):\n%s", logged)
	}
	if r := mustExec(t, sb, `df -k . | awk 'NR==2 {print $2}'`); r.Stdout != "218112\n" {
		t.Errorf("working directory size %q KiB, want 218112", r.Stdout)
	}
	// Two files: one file stops at FileSize (256 MiB) first.
	r := mustExec(t, sb, "head -c 200M /dev/zero > a; head -c 200M /dev/zero > b; echo $?")
	if !strings.Contains(r.Stderr, "No space left") || r.Stdout != "1\n" {
		t.Errorf("400 MiB into the 213 MiB working directory: %+v; want ENOSPC", r)
	}
	assertAlive(t, sb)
	mustExec(t, sb, "rm a b")

	_, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), tmpfsDriver(t),
		sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20, Disk: 1 << 30}))
	if err == nil || !strings.Contains(err.Error(), "does not fit in Limits.Memory") || !strings.Contains(err.Error(), "raise Memory to at least") {
		t.Errorf("an explicit 1 GiB tmpfs disk in 256 MiB: %v; want a refusal naming what to change", err)
	}

	// Only Memory given, too small even for the default /tmp and /dev/shm:
	// all three defaults shrink (96 MiB past the reserve, 8/9 of it for
	// their sizes, split 2:1:1).
	small := newSandbox(t, tmpfsDriver(t), sandbox.WithLimits(sandbox.Limits{Memory: 128 << 20}))
	r = mustExec(t, small, `for d in . /tmp /dev/shm; do df -k $d | awk 'NR==2 {print $2}'; done`)
	if r.Stdout != "44032\n21504\n21504\n" {
		t.Errorf("working directory, /tmp and /dev/shm in KiB with Memory 128 MiB: %q, want 44032, 21504, 21504", r.Stdout)
	}
}
