package sandbox_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Lifecycle, errors, hardening, audit log and gVisor.

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func TestSandboxHardening(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)

	checks := []struct {
		name, script, want string
	}{
		// A user of its own: uid = gid, from 1,000,000,000 up.
		{"non-root", `u=$(id -u); [ "$(id -g)" = "$u" ] && [ "$u" -ge 1000000000 ] && [ "$u" -lt 1900000000 ] && echo own`, "own\n"},
		// Every capability set is empty, including the bounding set, so
		// nothing can be regained by exec'ing a setuid or file-cap binary.
		{"capabilities", "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | tr -s '\\t' ' '",
			"CapInh: 0000000000000000\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nCapAmb: 0000000000000000\n"},
		{"no-new-privileges", "grep '^NoNewPrivs:' /proc/self/status | tr -s '\\t' ' '", "NoNewPrivs: 1\n"},
		// 2 is SECCOMP_MODE_FILTER: Docker's default profile.
		{"seccomp", "grep '^Seccomp:' /proc/self/status | tr -s '\\t' ' '", "Seccomp: 2\n"},
		{"proc/sys read-only", "echo evil > /proc/sys/kernel/hostname || echo refused; cat /proc/sys/kernel/hostname", "refused\nsandbox\n"},
		{"no docker socket", "find / -path /proc -prune -o -path /sys -prune -o -name '*docker.sock' -print 2>/dev/null; ls /var/run/docker.sock /run/docker.sock 2>&1 >/dev/null | wc -l", "2\n"},
		{"loopback only", "ls /sys/class/net", "lo\n"},
		{"no host mounts", "grep -cE ' /(home|root|etc/docker|var/lib/docker)( |/)' /proc/mounts", "0\n"},
		{"workdir writable", "pwd; echo hi > f && cat f && stat -c '%u:%g' f . | grep -cx \"$(id -u):$(id -g)\" && echo $HOME", "/workspace\nhi\n2\n/workspace\n"},
		{"tmp writable", "echo hi > /tmp/f && cat /tmp/f", "hi\n"},
		{"root read-only", "touch /x 2>&1 || true; touch /bin/x 2>&1 || true", "touch: /x: Read-only file system\ntouch: /bin/x: Read-only file system\n"},
		{"no routes", "wc -l < /proc/net/route", "1\n"},
		// Docker's masked directories are empty.
		{"masked /sys/firmware", "ls -A /sys/firmware | wc -l", "0\n"},
	}
	for _, c := range checks {
		r := mustExec(t, sb, c.script)
		if r.Stdout != c.want {
			t.Errorf("%s: %q\nstdout %q, want %q\nstderr %q", c.name, c.script, r.Stdout, c.want, r.Stderr)
		}
	}
	// Docker's masked /proc files (those this kernel has: /proc/kcore is
	// not on every kernel) are /dev/null mounted over them: empty.
	r := execWant(t, sb, `for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug /proc/latency_stats; do
	if [ -e $f ]; then echo "$f $(wc -c < $f) $(grep -c " $f " /proc/mounts)"; fi
done`, 0)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("none of the masked /proc files exists: %q", r.Stdout)
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) != 3 || f[1] != "0" || f[2] != "1" {
			t.Errorf("masked path: %q, want it empty and mounted over", l)
		}
	}
}

// TestSandboxHostEnvNotInherited sets a variable in this process (so it
// cannot run in parallel) and checks that it does not reach the sandbox.
func TestSandboxHostEnvNotInherited(t *testing.T) {
	key := "AGENTSANDBOX_SECRET_" + strings.ToUpper(randomHex(4))
	val := randomHex(16)
	t.Setenv(key, val)
	sb := newSandbox(t, sandbox.WithEnv("VISIBLE=yes"))
	r := execWant(t, sb, "env", 0)
	if strings.Contains(r.Stdout, key) || strings.Contains(r.Stdout, val) {
		t.Errorf("the host's %s reached the sandbox:\n%s", key, r.Stdout)
	}
	if !strings.Contains(r.Stdout, "VISIBLE=yes\n") || !strings.Contains(r.Stdout, "HOME=/workspace\n") {
		t.Errorf("env inside lacks WithEnv or HOME:\n%s", r.Stdout)
	}
	// Nothing from the host: the host's HOME and PATH are not there either.
	if h := os.Getenv("HOME"); h != "" && h != "/workspace" && strings.Contains(r.Stdout, "HOME="+h+"\n") {
		t.Errorf("host HOME leaked:\n%s", r.Stdout)
	}
}

func TestSandboxOptionsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  sandbox.Option
		want string
	}{
		{"workdir under /proc", sandbox.WithWorkdir("/proc/x"), "/proc"},
		{"workdir /proc", sandbox.WithWorkdir("/proc"), "/proc"},
		{"workdir /sys", sandbox.WithWorkdir("/sys"), "/sys"},
		{"workdir /dev/shm", sandbox.WithWorkdir("/dev/shm"), "/dev"},
		{"workdir sneaking into /proc", sandbox.WithWorkdir("/work/../proc/1"), "/proc"},
		{"relative workdir", sandbox.WithWorkdir("relative"), "not an absolute path"},
		{"workdir /", sandbox.WithWorkdir("/"), `"/"`},
		{"user with a space", sandbox.WithUser("no body"), "is not"},
		{"empty group", sandbox.WithUser("1000:"), "is not"},
		// A name the image does not have: the agent says so at start.
		{"unknown user", sandbox.WithUser("nobody-here"), `user "nobody-here": not found in /etc/passwd`},
		{"env without =", sandbox.WithEnv("BAD"), `"BAD" is not KEY=value`},
		{"env empty key", sandbox.WithEnv("=x"), "not KEY=value"},
		{"reserved label", sandbox.WithLabels(map[string]string{owner.LabelOwner: "someone-else"}), "reserved"},
		{"empty image", sandbox.WithImage(""), "empty image"},
	} {
		sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), tc.opt)
		if err == nil {
			sb.Close()
			t.Errorf("%s: New succeeded", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "sandbox: ") {
			t.Errorf("%s: %v, want an error mentioning %s", tc.name, err, tc.want)
		}
	}
}

func TestSandboxOptionsApplied(t *testing.T) {
	testenv.NotOn(t, podmanInspect, testenv.Podman...)
	t.Parallel()
	cli := engineClient(t)
	tag := randomHex(8)
	sb := newSandbox(t,
		sandbox.WithEnv("FOO=bar baz", "EMPTY=", "LANG=C"),
		sandbox.WithLabels(map[string]string{"test.agentsandbox/case": tag}),
		sandbox.WithWorkdir("/home/agent/work"),
		sandbox.WithUser("2000:3000"),
	)
	r := execWant(t, sb, `echo "$FOO|${EMPTY-unset}|$LANG|$HOME"; id -u; id -g; pwd; echo x > f && stat -c %u:%g f`, 0)
	if r.Stdout != "bar baz||C|/home/agent/work\n2000\n3000\n/home/agent/work\n2000:3000\n" {
		t.Errorf("options inside: %q (stderr %q)", r.Stdout, r.Stderr)
	}
	// Files land in the workdir, owned by the user.
	if err := sb.WriteFile(testCtx(t), "g", []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := execWant(t, sb, "stat -c '%u:%g %a' /home/agent/work/g", 0); r.Stdout != "2000:3000 600\n" {
		t.Errorf("WriteFile's file: %q", r.Stdout)
	}

	info, err := cli.ContainerInspect(testCtx(t), sb.ID())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Labels["test.agentsandbox/case"] != tag {
		t.Errorf("labels %v lack test.agentsandbox/case=%s", info.Config.Labels, tag)
	}
	if info.Config.Labels[owner.LabelOwner] != owner.ID() || info.Config.Labels[owner.LabelManaged] != "true" {
		t.Errorf("library labels missing: %v", info.Config.Labels)
	}
	// The same hardening, seen from the engine.
	hc := info.HostConfig
	if !hc.ReadonlyRootfs || hc.NetworkMode != "none" || !slices.Contains(hc.CapDrop, "ALL") ||
		!slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || hc.Privileged || len(hc.Binds) != 0 {
		t.Errorf("host config: readonly=%v network=%s capdrop=%v secopt=%v privileged=%v binds=%v",
			hc.ReadonlyRootfs, hc.NetworkMode, hc.CapDrop, hc.SecurityOpt, hc.Privileged, hc.Binds)
	}
	for _, m := range info.Mounts {
		if m.Type == "bind" {
			t.Errorf("host bind mount %+v", m)
		}
	}
}

func TestSandboxEngineUnavailable(t *testing.T) {
	t.Parallel()
	const sock = "/nonexistent/docker.sock"
	start := time.Now()
	sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithHost("unix://"+sock))
	if err == nil {
		sb.Close()
		t.Fatal("New with a missing engine succeeded")
	}
	if !errors.Is(err, sandbox.ErrEngineUnavailable) || !strings.Contains(err.Error(), sock) {
		t.Errorf("New: %v, want ErrEngineUnavailable naming %s", err, sock)
	}
	if errors.Is(err, sandbox.ErrImageNotFound) || sb != nil {
		t.Errorf("New: %v, %v", sb, err)
	}
	// A hang guard, not a speed claim: a missing socket fails at once, so
	// only a retry loop or a stuck dial could take this long.
	d := time.Since(start)
	if d > testenv.HangGuard {
		t.Errorf("New took %v to fail", d)
	}
	t.Logf("New failed after %v", d)
}

func TestSandboxImageNotFound(t *testing.T) {
	t.Parallel()
	const img = "agentsandbox-test/missing:nope"
	sb, err := sandbox.New(testCtx(t), sandbox.WithImage(img))
	if err == nil {
		sb.Close()
		t.Fatal("New with a missing image succeeded")
	}
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), img) {
		t.Errorf("New: %v, want ErrImageNotFound naming %s", err, img)
	}
	if errors.Is(err, sandbox.ErrEngineUnavailable) {
		t.Errorf("New: %v also matches ErrEngineUnavailable", err)
	}
}

func TestSandboxRemovedBehindOurBack(t *testing.T) {
	t.Parallel()
	cli := engineClient(t)
	sb := newSandbox(t)
	vol := workdirVolume(t, cli, sb)
	if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cli.ContainerRemove(testCtx(t), sb.ID(), container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}

	for name, op := range map[string]func(context.Context) error{
		"Exec": func(ctx context.Context) error { _, err := sb.Exec(ctx, "echo hi"); return err },
		"WriteFile": func(ctx context.Context) error {
			return sb.WriteFile(ctx, "g", []byte("y"), 0o644)
		},
		"ReadFile": func(ctx context.Context) error { _, err := sb.ReadFile(ctx, "f"); return err },
		"Cmd.Run":  func(ctx context.Context) error { return sb.Command(ctx, "true").Run() },
	} {
		start := time.Now()
		err := op(testCtx(t))
		if !errors.Is(err, sandbox.ErrSandboxGone) {
			t.Errorf("%s on a removed sandbox: %v, want ErrSandboxGone", name, err)
		}
		// Hang guard only: how fast the engine answers depends on its load.
		d := time.Since(start)
		if d > testenv.HangGuard {
			t.Errorf("%s took %v to fail", name, d)
		}
		t.Logf("%s failed after %v", name, d)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("Close of a removed sandbox: %v", err)
	}
	waitContainerGone(t, cli, sb.ID(), testenv.HangGuard)
	assertVolumeGone(t, cli, vol)
	// Once closed, everything says so.
	if _, err := sb.Exec(testCtx(t), "true"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec after Close: %v, want ErrClosed", err)
	}
}

func TestSandboxClose(t *testing.T) {
	t.Parallel()
	cli := engineClient(t)
	var nilSandbox *sandbox.Sandbox
	if err := nilSandbox.Close(); err != nil {
		t.Errorf("Close on a nil *Sandbox: %v", err)
	}

	sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	vol := workdirVolume(t, cli, sb)
	id := sb.ID()
	if len(id) != 64 {
		t.Errorf("ID %q is not a container ID", id)
	}
	// A command still running at Close is killed with the sandbox.
	c := sb.Command(context.Background(), "sleep", "300")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 0; i < 3; i++ {
		if err := sb.Close(); err != nil {
			t.Errorf("Close #%d: %v", i+1, err)
		}
	}
	if err := c.Wait(); err == nil {
		t.Error("Wait of a command killed by Close returned nil")
	}
	// Hang guard only (the test would block in Wait without it anyway).
	d := time.Since(start)
	if d > testenv.HangGuard {
		t.Errorf("Close and Wait took %v", d)
	}
	t.Logf("Close and Wait of a running command took %v", d)
	if sb.ID() != id {
		t.Errorf("ID changed after Close")
	}
	// Nothing is left: no container with the ID, no volume.
	_, err = cli.ContainerInspect(testCtx(t), id)
	if !engine.IsNotFound(err) {
		t.Errorf("container after Close: %v", err)
	}
	cs, err := cli.ContainerList(testCtx(t), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("id", id))})
	if err != nil || len(cs) != 0 {
		t.Errorf("containers with the ID after Close: %d, %v", len(cs), err)
	}
	assertVolumeGone(t, cli, vol)

	for name, err := range map[string]error{
		"Exec":      func() error { _, err := sb.Exec(testCtx(t), "true"); return err }(),
		"WriteFile": sb.WriteFile(testCtx(t), "f", nil, 0o644),
		"ReadFile":  func() error { _, err := sb.ReadFile(testCtx(t), "f"); return err }(),
		"Start":     sb.Command(testCtx(t), "true").Start(),
	} {
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestSandboxConcurrentSandboxes(t *testing.T) {
	t.Parallel()
	const n = 8
	cli := engineClient(t)
	tag := randomHex(8)
	label := "test.agentsandbox/concurrent=" + tag
	sbs := make([]*sandbox.Sandbox, n)
	vols := make([]string, n)
	g, ctx := errgroup.WithContext(testCtx(t))
	for i := range n {
		g.Go(func() error {
			sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage),
				sandbox.WithLabels(map[string]string{"test.agentsandbox/concurrent": tag}))
			if err != nil {
				return err
			}
			sbs[i] = sb
			info, err := cli.ContainerInspect(ctx, sb.ID())
			if err != nil {
				return err
			}
			for _, m := range info.Mounts {
				if m.Destination == "/workspace" {
					vols[i] = m.Name
				}
			}
			r, err := sb.Exec(ctx, fmt.Sprintf("echo %d > n && cat n && hostname", i))
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("%d\nsandbox\n", i); r.Stdout != want || r.ExitCode != 0 {
				return fmt.Errorf("sandbox %d: %+v", i, r)
			}
			return nil
		})
	}
	err := g.Wait()
	f := filters.NewArgs(filters.Arg("label", label))
	cs, lerr := cli.ContainerList(testCtx(t), container.ListOptions{All: true, Filters: f})
	if err == nil && (lerr != nil || len(cs) != n) {
		t.Errorf("%d containers labelled %s while running, %v; want %d", len(cs), label, lerr, n)
	}
	var cg errgroup.Group
	for _, sb := range sbs {
		cg.Go(sb.Close) // nil-safe for the ones New failed to make
	}
	if cerr := cg.Wait(); cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	cs, err = cli.ContainerList(testCtx(t), container.ListOptions{All: true, Filters: f})
	if err != nil || len(cs) != 0 {
		t.Errorf("after Close: %d containers labelled %s, %v", len(cs), label, err)
	}
	for _, v := range vols {
		assertVolumeGone(t, cli, v)
	}
}

// recorder is a slog.Handler that keeps every record.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recorder) WithGroup(string) slog.Handler      { return h }

func (h *recorder) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.records)
}

func attrs(r slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.Resolve(); return true })
	return m
}

func TestSandboxAuditLog(t *testing.T) {
	t.Parallel()
	h := &recorder{}
	ctx := testCtx(t)
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLogger(slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	r, err := sb.Exec(ctx, "echo hi; exit 3")
	if err != nil || r.ExitCode != 3 || r.Stdout != "hi\n" {
		t.Fatalf("Exec: %+v, %v", r, err)
	}
	if err := sb.WriteFile(ctx, "data.txt", []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := sb.ReadFile(ctx, "data.txt"); err != nil || string(b) != "12345" {
		t.Fatalf("ReadFile: %q, %v", b, err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	sb.Close() // idempotent: no second record

	recs := h.all()
	// Where the working directory is memory (a docker-group user's
	// tmpfs), New first says it made the default disk fit Memory.
	if testenv.Caps(t).Disk.InMemory() {
		if len(recs) == 0 || recs[0].Message != "sandbox.limits" {
			t.Errorf("a working directory in memory: no sandbox.limits record first")
		} else {
			recs = recs[1:]
		}
	}
	// The activity record is off by default: no sandbox.activity records.
	var msgs []string
	for _, r := range recs {
		msgs = append(msgs, r.Message)
	}
	want := []string{"sandbox.create", "sandbox.exec", "sandbox.file.write", "sandbox.file.read", "sandbox.close"}
	if !slices.Equal(msgs, want) {
		t.Fatalf("audit records %q, want %q", msgs, want)
	}
	for _, r := range recs {
		a := attrs(r)
		if a["sandbox"].String() != sb.ID() {
			t.Errorf("%s: sandbox attr %v, want %s", r.Message, a["sandbox"], sb.ID())
		}
		if _, ok := a["error"]; ok {
			t.Errorf("%s: error attr %v", r.Message, a["error"])
		}
		switch r.Message {
		case "sandbox.create":
			if a["image"].String() != busyboxImage || !regexp.MustCompile(`^\d{10}:\d{10}$`).MatchString(a["user"].String()) {
				t.Errorf("create attrs %v", a)
			}
		case "sandbox.exec":
			args, _ := a["args"].Any().([]string)
			if !slices.Equal(args, []string{"/bin/sh", "-c", "echo hi; exit 3"}) {
				t.Errorf("exec args %v", a["args"])
			}
			if a["exit_code"].Int64() != 3 || a["stdout_bytes"].Int64() != 3 || a["stderr_bytes"].Int64() != 0 {
				t.Errorf("exec attrs %v", a)
			}
			if d := a["duration"]; d.Kind() != slog.KindDuration || d.Duration() <= 0 {
				t.Errorf("exec duration %v", d)
			}
		case "sandbox.file.write", "sandbox.file.read":
			if a["bytes"].Int64() != 5 || a["path"].String() != "/workspace/data.txt" {
				t.Errorf("%s attrs %v", r.Message, a)
			}
		}
		if r.Level != slog.LevelInfo {
			t.Errorf("%s at level %v", r.Message, r.Level)
		}
	}
}

// requireRunsc skips (fails in CI) a test when the engine has no runsc;
// on Podman, whose compatible API ignores the runtime (New refuses it:
// TestRuntimeRefusedOnPodman), the test does not apply.
func requireRunsc(t *testing.T) {
	t.Helper()
	testenv.NotOn(t, podmanGVisor, testenv.Podman...)
	info, err := engineClient(t).Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := info.Runtimes["runsc"]; !ok {
		testenv.SkipOrFail(t, "the engine has no runsc runtime (gVisor); .ci/run registers it")
	}
}

// On Podman, whose Docker-compatible API ignores the runtime asked for, a
// sandbox asked to run under gVisor is refused rather than run under runc.
func TestRuntimeRefusedOnPodman(t *testing.T) {
	if k := testenv.Caps(t).Engine; k != driver.EnginePodman && k != driver.EnginePodmanRootless {
		t.Skipf("not applicable on %v: Docker runs the runtime asked for (TestSandboxGVisor)", k)
	}
	t.Parallel()
	sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithRuntime("runsc"))
	if err == nil {
		sb.Close()
		t.Fatal("New WithRuntime(runsc) on Podman succeeded; the sandbox runs under runc")
	}
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "runsc") {
		t.Errorf("New WithRuntime(runsc) on Podman: %v; want ErrUnsupported naming the runtime", err)
	}
}

func TestSandboxGVisor(t *testing.T) {
	testenv.NotOn(t, podmanGVisor, testenv.Podman...)
	t.Parallel()
	requireRunsc(t)
	cli := engineClient(t)
	sb := newSandbox(t, sandbox.WithRuntime("runsc"))
	ci, err := cli.ContainerInspect(testCtx(t), sb.ID())
	if err != nil || ci.HostConfig.Runtime != "runsc" {
		t.Fatalf("runtime %q, %v", ci.HostConfig.Runtime, err)
	}

	// gVisor's kernel introduces itself.
	r := execWant(t, sb, "dmesg", 0)
	if !strings.Contains(r.Stdout, "Starting gVisor") {
		t.Errorf("dmesg under runsc: %q", r.Stdout)
	}
	if r := execWant(t, sb, "id -u; cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net", 0); strings.HasPrefix(r.Stdout, "0\n") || !strings.HasSuffix(r.Stdout, "lo\n") {
		t.Errorf("user and network under runsc: %q", r.Stdout)
	}

	// Exec, including a kill on timeout.
	if r := execWant(t, sb, "echo hi; echo err >&2; exit 4", 4); r.Stdout != "hi\n" || r.Stderr != "err\n" {
		t.Errorf("exec under runsc: %+v", r)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	r, err = sb.Exec(ctx, "sleep 300 & sleep 301; echo not reached")
	if err != nil || !r.TimedOut || r.ExitCode != 137 || r.Stdout != "" {
		t.Fatalf("timeout under runsc: %+v, %v", r, err)
	}
	t.Logf("kill under runsc: Exec returned after %v with a 1s deadline", r.Duration)
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		out := execWant(t, sb, "ps -o args", 0).Stdout
		return !strings.Contains(out, "sleep 30"), "sleeps survived the kill under runsc:\n" + out
	})

	// Files round-trip through the engine's archive API.
	data := []byte("gvisor\x00bytes\n")
	if err := sb.WriteFile(testCtx(t), "f.bin", data, 0o640); err != nil {
		t.Fatal(err)
	}
	got, err := sb.ReadFile(testCtx(t), "f.bin")
	if err != nil || string(got) != string(data) {
		t.Errorf("ReadFile under runsc: %q, %v", got, err)
	}
	if r := execWant(t, sb, "stat -c '%s %a %u' f.bin | sed \"s/ $(id -u)\\$/ me/\"; echo made > g", 0); r.Stdout != fmt.Sprintf("%d 640 me\n", len(data)) {
		t.Errorf("file under runsc: %q", r.Stdout)
	}
	if got, err := sb.ReadFile(testCtx(t), "g"); err != nil || string(got) != "made\n" {
		t.Errorf("ReadFile of a file made inside: %q, %v", got, err)
	}
}

// TestSandboxOwnUser: each sandbox runs as a user of its own, so limits the
// kernel counts per user are not shared: one sandbox holding every inotify
// instance its user may have (128) leaves another's inotify_init working.
// The tools agents use work without a passwd entry for that user: id,
// HOME, python, pip install --user, git.
func TestSandboxOwnUser(t *testing.T) {
	t.Parallel()
	a, b := newPython(t), newPython(t)
	ua, ub := mustExec(t, a, "id -u").Stdout, mustExec(t, b, "id -u").Stdout
	if ua == ub {
		t.Fatalf("two sandboxes share uid %s", ua)
	}
	const inotify = `python3 -c '
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init()
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
if sys.argv[1] == "hold":
    time.sleep(120)
' `
	hold := a.Command(testCtx(t), "sh", "-c", inotify+"hold")
	out, err := hold.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "128 24") { // EMFILE
		t.Fatalf("sandbox a took %q inotify instances; want 128, then EMFILE", line)
	}
	if r := mustExec(t, b, inotify+"count"); r.Stdout != "128 24\n" {
		t.Errorf("sandbox b beside a holding all of its user's: %q %q; want 128 of its own", r.Stdout, r.Stderr)
	}
	mustExec(t, a, "pkill -f inotify_init; true")
	hold.Wait()

	const tools = `set -e
id
echo "HOME=$HOME"
python3 -c 'import pathlib; print(pathlib.Path.home())'
mkdir -p pkg/hello && echo 'print("hello from pkg")' > pkg/hello/__init__.py
printf 'from setuptools import setup\nsetup(name="hello", version="1", packages=["hello"])\n' > pkg/setup.py
python3 -m pip install -q --user --break-system-packages --no-index --no-build-isolation ./pkg 2>&1 | grep -v WARNING || true
cd "$HOME" && python3 -c 'import hello'
ls -d .local/lib/python3*/site-packages/hello
git init -q repo && cd repo && git -c user.name=a -c user.email=a@example.invalid commit -q --allow-empty -m first && git log --format=%s`
	r := mustExec(t, a, tools)
	u := strings.TrimSpace(ua)
	for _, want := range []string{"uid=" + u + " gid=" + u, "HOME=/workspace\n/workspace\n", "hello from pkg\n", "site-packages/hello\n", "first\n"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("tools as a user without a passwd entry: exit %d, stdout %q, stderr %q; want %q", r.ExitCode, r.Stdout, r.Stderr, want)
		}
	}
}

// TestSeccompProfile: the library's own seccomp profile is in force under
// runc: the system calls it removes from Docker's default fail with EPERM
// from inside, and so do those that need capabilities the sandbox lacks;
// ordinary ones work. Under gVisor the same sandbox works (the profile is
// given, and threads, the interpreter, file operations run: see
// TestSandboxGVisor, TestInterpreterGVisor); gVisor's own kernel answers
// the calls, and the host kernel's io_uring and userfaultfd stay out of
// reach: they fail.
func TestSeccompProfile(t *testing.T) {
	t.Parallel()
	// x86_64 numbers: each call gets harmless arguments.
	const probe = `python3 -c '
import ctypes, errno, threading
libc = ctypes.CDLL(None, use_errno=True)
t = threading.Thread(target=lambda: None); t.start(); t.join()
for name, nr in [("getpid", 39), ("io_uring_setup", 425), ("io_uring_enter", 426), ("io_uring_register", 427),
                 ("userfaultfd", 323), ("modify_ldt", 154), ("remap_file_pages", 216), ("unshare", 272), ("bpf", 321)]:
    ctypes.set_errno(0)
    r = libc.syscall(nr, 0, 0, 0, 0, 0)
    print(name, "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
'`
	t.Run("runc", func(t *testing.T) {
		t.Parallel()
		sb := newPython(t)
		want := "getpid ok\nio_uring_setup EPERM\nio_uring_enter EPERM\nio_uring_register EPERM\nuserfaultfd EPERM\nmodify_ldt EPERM\nremap_file_pages EPERM\nunshare EPERM\nbpf EPERM\n"
		if r := mustExec(t, sb, probe); r.Stdout != want {
			t.Errorf("system calls from inside: %q %q\nwant %q", r.Stdout, r.Stderr, want)
		}
	})
	t.Run("runsc", func(t *testing.T) {
		t.Parallel()
		requireRunsc(t)
		sb := newPython(t, sandbox.WithRuntime("runsc"))
		r := mustExec(t, sb, probe)
		if !strings.HasPrefix(r.Stdout, "getpid ok\n") {
			t.Fatalf("under gVisor: %q %q", r.Stdout, r.Stderr)
		}
		for _, name := range []string{"io_uring_setup", "io_uring_register", "userfaultfd"} {
			if strings.Contains(r.Stdout, name+" ok") {
				t.Errorf("%s succeeded under gVisor: %q", name, r.Stdout)
			}
		}
	})
}
