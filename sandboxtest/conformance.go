package sandboxtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/driverof"
)

// Conformance runs the library's semantics as subtests against sandboxes
// made with opts, which choose the image and the engine — the way
// testing/fstest.TestFS checks a file system. A backend, an engine setup or
// an image a user relies on passes it, or the failing subtest says which
// promise does not hold there:
//
//   - lifecycle: New, Exec, an idempotent Close that leaves no engine
//     object of the sandbox, ErrClosed after it;
//   - exec: exit codes, stdout and stderr apart, stdin, bounded output;
//   - kill: a timed-out command's whole tree is gone — new sessions and
//     ignored signals included — while another command's process lives;
//   - files: names with newlines and invalid UTF-8, fs.ErrNotExist, a
//     planted link to /dev/zero refused as not regular, CopyOut never
//     writing outside its directory;
//   - limits: memory (an OOM kill the sandbox survives), processes, file
//     size, disk;
//   - open files and CPU limits seen from inside; a Lifetime that ends
//     the sandbox (ErrSandboxGone, nothing left after Close);
//   - owner death: a process holding a sandbox is killed, the sandbox ends
//     by itself (within a minute; an engine may keep the ended object, as
//     Kubernetes keeps a pod) and Prune removes the rest (the test binary is run again
//     as that process, with the same -test.run of the top-level test);
//   - hardening, seen from inside: a non-root user with no capabilities,
//     no_new_privs, a seccomp filter, a read-only root file system, no
//     engine socket, an agent the sandbox's root cannot kill;
//   - writable places, seen from inside as the sandbox user and as root:
//     exactly those of WritablePlaces, each bounded by a limit;
//   - network: none by default (loopback the only interface up, no route,
//     a host listener unreachable), an
//     allow-list through the proxy (allowed, refused, the host still
//     unreachable directly), a credential added outside the sandbox
//     (upstream sees it, the sandbox never does), Expose of a sandbox's
//     port;
//   - snapshot and fork: the working directory's files (8 MiB of them,
//     and two a process rewrites meanwhile, held from one moment), modes,
//     links and a file its user closed to themselves in two forks, each
//     its own; a process of the source stopped during the snapshot and
//     running after it; a snapshot of a fork (a chain); forks restored into a
//     Pool's sandboxes (WithPool);
//   - tty: commands on a pseudo-terminal (Cmd.TTY): a shell keeping its
//     state across inputs, the size and TERM, Resize seen by stty and as
//     SIGWINCH, C-c ending the foreground job with 130 and the prompt
//     back, job control, the input's end ending cat, output exact to the
//     last byte after the exit, invalid settings refused;
//   - sessions: a leased sandbox's command on a terminal running on after
//     its Sandbox detached, listed (Sessions) and attached from another
//     (Open, AttachCommand) with the output kept meanwhile, the drop said,
//     a resize, a takeover (ErrTakenOver) and the exit;
//   - terminal: a Terminal's shell keeping its state, stty following a
//     resize, vi editing a file through keys (if the image has a vi), top
//     drawing its header, C-c ending sleep 1000 with the prompt back, a
//     flood's last screen, and Close killing everything the terminal
//     started; a terminal of a leased sandbox outliving its process
//     (killed), attached by another: vi's screen redrawn, the shell's
//     state kept.
//   - watch: Sandbox.Watch's events, exact and in order (create, modify,
//     rename, remove), in a directory made after the watch began too; a
//     non-recursive watch leaving subdirectories' contents out; links to
//     /, /etc, /proc and /tmp never followed; the channel closed by the
//     context's end and by Close.
//
// The image needs a POSIX shell with busybox's or coreutils' tools (sh,
// head, tail, tr, wc, sleep, grep, ln) and, for the network subtests,
// busybox's nc and httpd or python3: images.Busybox and images.Python both
// do. The backend is the one opts select (sandbox.WithDriver,
// sandbox.WithHost, else sandbox.DefaultDriver): the engine checks
// (nothing left after Close, what a killed owner left) and Prune ask that
// driver, which must be a driver.Lister. What the backend says it lacks
// (driver.Caps) is not asked of it: on one without resource limits
// (NoResourceLimits) New with them must be refused with
// ErrLimitsUnsupported, the memory, processes, file size, open files and
// CPU subtests are skipped, and the others run with those limits
// removed. Each subtest
// runs in parallel with the others; the whole takes some 20 seconds on
// Docker.
func Conformance(t *testing.T, opts ...sandbox.Option) {
	t.Helper()
	c := conformance{opts: slices.Clip(opts)}
	d, closeFn, err := driverof.Of(opts)
	if err != nil {
		t.Fatalf("the options: %v", err)
	}
	if closeFn != nil {
		t.Cleanup(func() { closeFn() })
	}
	c.drv = d
	caps, err := d.Caps(ctxFor(t))
	if err != nil {
		t.Fatalf("the backend's Caps: %v", err)
	}
	c.noLimits = caps.NoResourceLimits
	if os.Getenv(ownerEnv) == "1" { // this process is the owner subtest's helper
		if c.noLimits {
			c.opts = append(c.opts, c.withLimits(sandbox.Limits{}))
		}
		c.ownerChild(t)
		return
	}
	if what := os.Getenv(leaseEnv); what != "" { // this process is the lease subtest's helper
		if c.noLimits {
			c.opts = append(c.opts, c.withLimits(sandbox.Limits{}))
		}
		c.leaseChild(t, what)
		return
	}
	t.Logf("backend %T: engine %v, working directory %v", d, caps.Engine, caps.Disk)
	// What a backend without resource limits lacks: their subtests skip,
	// the others run with the limits removed (as a user of such an engine
	// must), once New with them has been refused.
	noLimits := ""
	if c.noLimits {
		noLimits = fmt.Sprintf("the backend (%v) puts no resource limits in force (driver.Caps.NoResourceLimits)", caps.Engine)
		c.refusesResourceLimits(t)
		c.opts = append(c.opts, c.withLimits(sandbox.Limits{}))
	}
	for _, st := range []struct {
		name string
		f    func(*testing.T)
		skip string // why the backend cannot be asked this, or ""
	}{
		{"lifecycle", c.lifecycle, ""},
		{"exec", c.exec, ""},
		{"kill", c.kill, ""},
		{"files", c.files, ""},
		{"limits/memory", c.memory, noLimits},
		{"limits/pids", c.pids, noLimits},
		{"limits/filesize", c.fileSize, noLimits},
		{"limits/disk", c.disk, ""},
		{"limits/openfiles", c.openFiles, noLimits},
		{"limits/cpu", c.cpu, noLimits},
		{"limits/lifetime", c.lifetime, ""},
		{"owner", c.owner, ""},
		{"lease", c.lease, ""},
		{"hardening", c.hardening, ""},
		{"writable", c.writable, ""},
		{"network/none", c.networkNone, ""},
		{"network/allowlist", c.allowList, ""},
		{"network/credentials", c.credentials, ""},
		{"network/expose", c.expose, ""},
		{"snapshot", c.snapshot, ""},
		{"tty", c.tty, ""},
		{"sessions", c.sessions, ""},
		{"terminal", c.terminal, ""},
		{"terminal/attach", c.terminalAttach, ""},
		{"usage", c.usage, ""},
		{"watch", c.watch, ""},
		{"activity", c.activity, ""},
		{"activity/live", c.activityLive, ""},
		{"activity/files", c.activityFiles, ""},
		{"activity/proxy", c.activityProxy, ""},
	} {
		t.Run(st.name, func(t *testing.T) {
			if st.skip != "" {
				t.Skip(st.skip)
			}
			t.Parallel()
			st.f(t)
		})
	}
}

type conformance struct {
	opts     []sandbox.Option
	drv      driver.Driver // the backend opts select
	noLimits bool          // the backend puts no resource limits in force
}

// withLimits is sandbox.WithLimits(l) for a subtest, with the resource
// limits l does not set removed where the backend puts none in force.
func (c conformance) withLimits(l sandbox.Limits) sandbox.Option {
	if c.noLimits {
		for _, f := range []*int64{&l.Memory, &l.PIDs, &l.FileSize, &l.OpenFiles} {
			if *f == 0 {
				*f = -1
			}
		}
		if l.CPUs == 0 {
			l.CPUs = -1
		}
	}
	return sandbox.WithLimits(l)
}

// refusesResourceLimits checks that New with c's options refuses the
// resource limits that a backend without them cannot put in force, unless
// the options removed them already.
func (c conformance) refusesResourceLimits(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, c.opts...)
	if err == nil {
		sb.Close()
	}
	if err != nil && !errors.Is(err, sandbox.ErrLimitsUnsupported) {
		t.Fatalf("New on a backend without resource limits: %v, want ErrLimitsUnsupported (or a sandbox, if the options removed them)", err)
	}
	t.Logf("New with the resource limits: %v", err)
}

// new makes a sandbox for a subtest, closed at its end.
func (c conformance) new(t *testing.T, more ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	return New(t, append(append([]sandbox.Option{}, c.opts...), more...)...)
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// run runs a script and fails the test if it cannot be run.
func run(t *testing.T, sb *sandbox.Sandbox, script string) *sandbox.Result {
	t.Helper()
	r, err := sb.Exec(ctxFor(t), script)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	return r
}

func (c conformance) lifecycle(t *testing.T) {
	ctx := ctxFor(t)
	sb, err := sandbox.New(ctx, c.opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	id := sb.ID()
	if r, err := sb.Exec(ctx, "echo ok"); err != nil || r.Stdout != "ok\n" || r.ExitCode != 0 {
		sb.Close()
		t.Fatalf("Exec(echo ok) = %+v, %v", r, err)
	}
	if !c.ownedHas(t, id) {
		t.Errorf("the engine lists no object of sandbox %s while it runs (is DOCKER_HOST the engine under test?)", id)
	}
	if err := sb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := sb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := sb.Exec(ctx, "true"); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec after Close: %v, want ErrClosed", err)
	}
	if c.ownedHas(t, id) {
		t.Errorf("the engine still lists sandbox %s after Close", id)
	}
}

// ownedHas reports whether the engine lists an object of this process
// with the given ID.
func (c conformance) ownedHas(t *testing.T, id string) bool {
	t.Helper()
	objs, err := Owned(ctxFor(t), 0, c.opts...)
	if err != nil {
		t.Fatalf("Owned: %v", err)
	}
	for _, o := range objs {
		if o.ID == id {
			return true
		}
	}
	return false
}

func (c conformance) exec(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	r := run(t, sb, "echo out; echo err >&2; exit 3")
	if r.Stdout != "out\n" || r.Stderr != "err\n" || r.ExitCode != 3 {
		t.Errorf("streams and exit code: %+v", r)
	}
	cmd := sb.Command(ctx, "sh", "-c", "tr a-z A-Z")
	cmd.Stdin = strings.NewReader("stdin\x00bytes\n")
	if out, err := cmd.Output(); err != nil || string(out) != "STDIN\x00BYTES\n" {
		t.Errorf("stdin through Cmd: %q, %v", out, err)
	}
	err := sb.Command(ctx, "sh", "-c", "exit 7").Run()
	var ee *sandbox.ExitError
	if !errors.As(err, &ee) || ee.Code != 7 {
		t.Errorf("Cmd exit 7: %v, want *ExitError with Code 7", err)
	}
	limit := sandbox.DefaultLimits().OutputBytes
	r = run(t, sb, fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", 3*limit))
	if !r.Truncated || int64(len(r.Stdout)) != limit || r.ExitCode != 0 {
		t.Errorf("output of 3×OutputBytes: %d bytes kept, Truncated %v, exit %d; want %d, true, 0", len(r.Stdout), r.Truncated, r.ExitCode, limit)
	}
}

func (c conformance) kill(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	bctx, stopBeside := context.WithCancel(ctx)
	beside := sb.Command(bctx, "sleep", "999")
	if err := beside.Start(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	r, err := sb.Exec(tctx, `(setsid sh -c 'sleep 1000 & sleep 1001' &) ; sh -c 'trap "" TERM INT HUP; sleep 1002' & sleep 1003`)
	if err != nil || !r.TimedOut {
		t.Fatalf("a command past its deadline: %+v, %v; want TimedOut", r, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Exec returned %v after its 2 s deadline", d)
	}
	ps := run(t, sb, psScript)
	for _, n := range []string{"sleep 1000", "sleep 1001", "sleep 1002", "sleep 1003"} {
		if strings.Contains(ps.Stdout, n) {
			t.Errorf("%q survived the kill:\n%s", n, ps.Stdout)
		}
	}
	if !strings.Contains(ps.Stdout, "sleep 999") {
		t.Errorf("the other command's process was killed too:\n%s", ps.Stdout)
	}
	stopBeside()
	beside.Wait()
}

// psScript prints every process's command line, one per line, with
// busybox's tools or coreutils'.
const psScript = `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done`

func (c conformance) files(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	for _, name := range []string{"new\nline", "bad\xffutf8", "sp ace", "dir/deep/f"} {
		data := []byte("data of " + name)
		if err := sb.MkdirAll(ctx, filepath.Dir(name), 0o755); err != nil {
			t.Fatalf("MkdirAll(%q): %v", filepath.Dir(name), err)
		}
		if err := sb.WriteFile(ctx, name, data, 0o640); err != nil {
			t.Errorf("WriteFile(%q): %v", name, err)
			continue
		}
		got, err := sb.ReadFile(ctx, name)
		if err != nil || string(got) != string(data) {
			t.Errorf("ReadFile(%q) = %q, %v", name, got, err)
		}
		fi, err := sb.Stat(ctx, name)
		if err != nil || fi.Mode().Perm() != 0o640 || fi.Size() != int64(len(data)) {
			t.Errorf("Stat(%q) = %v, %v", name, fi, err)
		}
	}
	if _, err := sb.ReadFile(ctx, "missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile(missing): %v, want fs.ErrNotExist", err)
	}
	run(t, sb, "ln -s /dev/zero zero && mkdir -p out && ln -s / out/root && ln -s ../../../../etc out/etc && echo hi > out/f")
	if _, err := sb.ReadFile(ctx, "zero"); !errors.Is(err, sandbox.ErrNotRegular) {
		t.Errorf("ReadFile of a link to /dev/zero: %v, want ErrNotRegular", err)
	}
	host := t.TempDir()
	if err := sb.CopyOut(ctx, "out", host); err != nil {
		t.Fatalf("CopyOut: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(host, "out", "f")); err != nil || string(b) != "hi\n" {
		t.Errorf("CopyOut's file: %q, %v", b, err)
	}
	filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink != 0 {
			if target, _ := filepath.EvalSymlinks(p); !strings.HasPrefix(target, host) {
				t.Errorf("CopyOut wrote %s, a link out of its directory (to %s)", p, target)
			}
		}
		return nil
	})
}

func (c conformance) memory(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{Memory: 96 << 20, Disk: 16 << 20, TmpSize: 8 << 20}))
	// dd fills a buffer of 200 MiB: more than Memory. One process
	// allocates: once it is killed nothing asks for memory any more.
	// (With a second one still allocating — a writer into a pipe — the
	// kernel can look for another victim before the first one's memory
	// is freed, and on Kubernetes, where the agent cannot go below a
	// Burstable pod's oom_score_adj of 999, pick the agent:
	// docs/kubernetes.md.)
	r := run(t, sb, "dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null")
	if r.ExitCode != 137 || !r.OOMKilled {
		t.Errorf("a command over the memory limit: exit %d, OOMKilled %v; want 137, true (stderr %q)", r.ExitCode, r.OOMKilled, r.Stderr)
	}
	if r := run(t, sb, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("the sandbox after an OOM kill: %+v", r)
	}
}

func (c conformance) pids(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{PIDs: 48}))
	ctx := ctxFor(t)
	bomb, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	r, err := sb.Exec(bomb, `i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done 2>/dev/null; `+psScript+` | grep -c "^sleep 60"`)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if n >= 200 || n > 48 {
		t.Errorf("%d of 200 processes started under a PIDs limit of 48", n)
	}
	if r := run(t, sb, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("the sandbox after the fork storm: %+v", r)
	}
}

func (c conformance) fileSize(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{FileSize: 1 << 20}))
	r := run(t, sb, "head -c 3000000 /dev/zero > big; echo $?; wc -c < big")
	lines := strings.Fields(r.Stdout)
	if len(lines) != 2 || lines[0] == "0" || lines[1] != strconv.Itoa(1<<20) {
		t.Errorf("a 3 MB write under a 1 MiB file size limit: %q %q; want a failure and 1048576 bytes", r.Stdout, r.Stderr)
	}
}

func (c conformance) disk(t *testing.T) {
	const disk = 32 << 20
	sb := c.new(t, c.withLimits(sandbox.Limits{Disk: disk}))
	r := run(t, sb, "head -c 100000000 /dev/zero > fill; echo $?; wc -c < fill; rm fill; echo ok > after")
	f := strings.Fields(r.Stdout)
	if len(f) != 2 || f[0] == "0" {
		t.Fatalf("100 MB written to a 32 MiB disk: %q %q; want a failure", r.Stdout, r.Stderr)
	}
	if n, _ := strconv.Atoi(f[1]); n > disk {
		t.Errorf("%d bytes landed on a %d-byte disk", n, disk)
	}
	if b, err := sb.ReadFile(ctxFor(t), "after"); err != nil || string(b) != "ok\n" {
		t.Errorf("the disk after it was full and emptied: %q, %v", b, err)
	}
}

func (c conformance) openFiles(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{OpenFiles: 200}))
	if r := run(t, sb, "ulimit -n; ulimit -Hn"); r.Stdout != "200\n200\n" {
		t.Errorf("open files limit seen inside: %q, want 200 soft and hard", r.Stdout)
	}
}

func (c conformance) cpu(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{CPUs: 0.5}))
	// cgroup v2's cpu.max, else v1's quota and period.
	r := run(t, sb, `cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo "$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us)"`)
	var quota, period float64
	if _, err := fmt.Sscan(r.Stdout, &quota, &period); err != nil || period <= 0 || quota/period != 0.5 {
		t.Errorf("CPU quota seen inside: %q %q, want half the period", r.Stdout, r.Stderr)
	}
}

func (c conformance) lifetime(t *testing.T) {
	sb := c.new(t, c.withLimits(sandbox.Limits{Lifetime: 2 * time.Second}))
	id := sb.ID()
	start := time.Now()
	var err error
	for time.Since(start) < time.Minute {
		if _, err = sb.Exec(ctxFor(t), "sleep 0.2"); err != nil {
			break
		}
	}
	if !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Fatalf("Exec %v after the start of a sandbox with a Lifetime of 2s: %v, want ErrSandboxGone", time.Since(start), err)
	}
	t.Logf("gone %v after its start", time.Since(start).Round(time.Millisecond))
	if err := sb.Close(); err != nil {
		t.Errorf("Close after the Lifetime: %v", err)
	}
	if c.ownedHas(t, id) {
		t.Errorf("the engine still lists sandbox %s after its Lifetime and Close", id)
	}
}

// ownerEnv makes Conformance, in a process the owner subtest starts, make
// a sandbox, print its ID and wait to be killed.
const ownerEnv = "AGENTSANDBOX_CONFORMANCE_OWNER"

func (c conformance) ownerChild(t *testing.T) {
	sb, err := sandbox.New(ctxFor(t), c.opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	fmt.Printf("\nagentsandbox-owner-sandbox %s\n", sb.ID())
	time.Sleep(5 * time.Minute) // until the parent kills this process
	sb.Close()
	t.Fatal("the owner subtest did not kill its helper process")
}

// owner: a process holding a sandbox is killed (SIGKILL, no Close); the
// sandbox ends by itself, and Prune removes what is left.
func (c conformance) owner(t *testing.T) {
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), ownerEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ids := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "agentsandbox-owner-sandbox "); ok {
				ids <- id
			}
		}
		close(ids)
		io.Copy(io.Discard, out)
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(3 * time.Minute):
	}
	if id == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the helper process made no sandbox: %s", stderr.String())
	}
	pid := cmd.Process.Pid
	cmd.Process.Kill()
	cmd.Wait()
	ctx := ctxFor(t)
	deadline := time.Now().Add(time.Minute)
	for {
		objs, err := Owned(ctx, pid, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(objs, func(o Object) bool { return o.ID == id && !ended(o.State) }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still running a minute after its owner was killed: %v", id, objs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := c.drv.Prune(ctx); err != nil {
		t.Errorf("Prune: %v", err)
	}
	if objs, err := Owned(ctx, pid, c.opts...); err != nil || len(objs) != 0 {
		t.Errorf("objects of the killed owner after Prune: %v, %v", objs, err)
	}
}

// ended reports an engine object's state as that of an instance that has
// stopped: a Kubernetes pod stays, Succeeded, until it is deleted.
func ended(state string) bool {
	return state == "exited" || state == "dead" || state == "succeeded" || state == "failed"
}

func (c conformance) hardening(t *testing.T) {
	sb := c.new(t)
	r := run(t, sb, `grep -E '^(Uid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status`)
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		k, v, _ := strings.Cut(line, ":")
		fields[k] = strings.Join(strings.Fields(v), " ")
	}
	if uid := strings.Fields(fields["Uid"]); len(uid) == 0 || uid[0] == "0" {
		t.Errorf("commands run as uid %q, want a non-root user", fields["Uid"])
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if fields[k] != "0000000000000000" {
			t.Errorf("%s = %q, want no capabilities", k, fields[k])
		}
	}
	if fields["NoNewPrivs"] != "1" || fields["Seccomp"] != "2" {
		t.Errorf("NoNewPrivs %q, Seccomp %q; want 1 and 2 (a filter)", fields["NoNewPrivs"], fields["Seccomp"])
	}
	r = run(t, sb, "touch /probe 2>/dev/null && echo writable; ls /var/run/docker.sock /run/docker.sock /run/podman/podman.sock 2>/dev/null; echo done")
	if r.Stdout != "done\n" {
		t.Errorf("root file system writable or an engine socket present: %q", r.Stdout)
	}
	root := sb.Command(ctxFor(t), "sh", "-c", "kill -9 1; kill -TERM 1; kill -SEGV 1; kill -9 -1; echo sent")
	root.User = "0:0"
	out, _ := root.CombinedOutput()
	if r := run(t, sb, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("after root in the sandbox signalled PID 1 and every process it may (%q): %+v", out, r)
	}
}

// hostListener listens on an address of this machine the sandbox must not
// reach (not loopback) and counts connections.
func hostListener(t *testing.T) (addr string, n *atomic.Int32) {
	t.Helper()
	ip := ""
	ifcs, _ := net.Interfaces()
	for _, ifc := range ifcs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if in, ok := a.(*net.IPNet); ok && in.IP.To4() != nil && ip == "" {
				ip = in.IP.String()
			}
		}
	}
	if ip == "" {
		t.Fatal("this machine has no address but loopback")
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	n = new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), n
}

// get sends a GET for url from inside the sandbox, over a plain TCP
// connection (busybox's nc, else python3: no name lookup inside, which
// busybox's static build cannot do) to the proxy of $HTTP_PROXY when proxy
// is set, else to the URL's own address, and returns the response's
// status and body ("error: ..." and 0 when there is none).
func get(t *testing.T, sb *sandbox.Sandbox, rawURL string, proxy bool) (int, string) {
	t.Helper()
	_, code, body := getResult(t, sb, rawURL, proxy)
	return code, body
}

// getResult is get with the Result of the command that made the request.
func getResult(t *testing.T, sb *sandbox.Sandbox, rawURL string, proxy bool) (*sandbox.Result, int, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	target, line := u.Host, "GET "+u.RequestURI()+" HTTP/1.0"
	if proxy {
		target, line = "$proxy", "GET "+rawURL+" HTTP/1.0"
	}
	script := fmt.Sprintf(`proxy=${HTTP_PROXY#http://}; target=%s; host=${target%%:*}; port=${target##*:}
req() { printf '%s\r\nHost: %s\r\nConnection: close\r\n\r\n'; }
if command -v nc >/dev/null; then
	# nc's input stays open until it is done: a half-closed request is
	# one the client gave up on, for Go's HTTP servers.
	f=/tmp/.get.$$; mkfifo $f; { req; read x < $f; } | { nc -w 10 "$host" "$port"; echo > $f; }; rm -f $f
else req | python3 -c '
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(sys.stdin.buffer.read())
while True:
    b = s.recv(65536)
    if not b: break
    sys.stdout.buffer.write(b)
' "$host" "$port"; fi`, target, line, u.Host)
	r := run(t, sb, script)
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(r.Stdout)), nil)
	if err != nil {
		return r, 0, fmt.Sprintf("error: %v (%q)", err, r.Stderr)
	}
	body, _ := io.ReadAll(resp.Body)
	return r, resp.StatusCode, string(body)
}

func (c conformance) networkNone(t *testing.T) {
	sb := c.new(t)
	// Loopback alone, or other interfaces down (a pod's, which the
	// Kubernetes backend takes down): no route out either way.
	r := run(t, sb, `for i in /sys/class/net/*; do n=${i##*/}; [ "$n" = lo ] || echo "$n $(cat $i/operstate)"; done; echo routes $(($(wc -l < /proc/net/route) - 1))`)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if lines[len(lines)-1] != "routes 0" {
		t.Errorf("a sandbox with no network has IPv4 routes: %q %q", r.Stdout, r.Stderr)
	}
	for _, l := range lines[:len(lines)-1] {
		if !strings.HasSuffix(l, " down") {
			t.Errorf("a sandbox with no network has an interface up: %q", l)
		}
	}
	addr, n := hostListener(t)
	if code, body := get(t, sb, "http://"+addr+"/", false); code != 0 {
		t.Errorf("the sandbox reached host listener %s: %d %q", addr, code, body)
	}
	if n.Load() != 0 {
		t.Errorf("the host listener at %s accepted %d connections from the sandbox", addr, n.Load())
	}
}

// upstream serves HTTP on this machine's loopback until the test ends,
// answering "upstream" after seen (if set) has the request.
func upstream(t *testing.T, seen func(*http.Request)) net.Listener {
	t.Helper()
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen != nil {
			seen(r)
		}
		io.WriteString(w, "upstream")
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(l)
	t.Cleanup(func() { up.Close() })
	return l
}

func (c conformance) allowList(t *testing.T) {
	l := upstream(t, nil)
	sb := c.new(t, sandbox.WithNetwork(sandbox.AllowHosts("127.0.0.1/32")))
	if code, body := get(t, sb, "http://"+l.Addr().String()+"/", true); code != 200 || body != "upstream" {
		t.Errorf("an allowed address through the proxy: %d %q, want 200 upstream", code, body)
	}
	if code, body := get(t, sb, "http://denied.invalid/", true); code != 403 {
		t.Errorf("a host not on the allow-list: %d %q, want 403", code, body)
	}
	addr, n := hostListener(t)
	if code, body := get(t, sb, "http://"+addr+"/", false); code != 0 {
		t.Errorf("the allow-listed sandbox reached host listener %s directly: %d %q", addr, code, body)
	}
	if n.Load() != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n.Load())
	}
}

func (c conformance) credentials(t *testing.T) {
	const secret = "conformance-secret-4711"
	var seen atomic.Value
	l := upstream(t, func(r *http.Request) { seen.Store(r.Header.Get("X-Api-Key")) })
	sb := c.new(t, sandbox.WithNetwork(sandbox.NetworkPolicy{
		Allow:       []string{"127.0.0.1/32"},
		Credentials: []sandbox.Credential{{Host: "127.0.0.1", Header: "X-Api-Key", Value: secret, AllowHTTP: true}},
	}))
	if code, body := get(t, sb, "http://"+l.Addr().String()+"/", true); code != 200 || body != "upstream" {
		t.Errorf("a request to the credential's host: %d %q, want 200 upstream", code, body)
	}
	if got, _ := seen.Load().(string); got != secret {
		t.Errorf("the upstream got X-Api-Key %q, want the credential", got)
	}
	// Nowhere in the sandbox: not in the environment of a command or of
	// the agent, not in a file it can read.
	r := run(t, sb, `cat /proc/self/environ /proc/1/environ 2>/dev/null | tr '\0' '\n'; grep -rl `+secret+` /tmp /etc "$HOME" 2>/dev/null; echo done`)
	if strings.Contains(r.Stdout, secret) {
		t.Errorf("the credential is visible inside the sandbox: %q", r.Stdout)
	}
}

func (c conformance) snapshot(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	run(t, sb, `mkdir -p d/e && printf one > d/a && chmod 640 d/a && ln -s a d/link && ln d/a d/hard && printf two > 'new
line' && printf shut > closed && chmod 000 closed`)
	// Several MiB: more than the buffers between the agent and the library
	// hold, so the snapshot is sent while the sandbox's processes are
	// stopped (on Kubernetes, the relay carrying it must not be).
	run(t, sb, `mkdir big && for i in 1 2 3 4 5 6 7 8; do head -c 1048576 /dev/urandom > big/$i; done`)
	sums := run(t, sb, "md5sum big/*").Stdout
	// A process that runs through the snapshot: stopped while the files
	// are read, running again after; and one that rewrites two files,
	// which the snapshot holds from one moment.
	tctx, stop := context.WithCancel(ctx)
	defer stop()
	ticker := sb.Command(tctx, "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.02; done")
	if err := ticker.Start(); err != nil {
		t.Fatal(err)
	}
	defer ticker.Wait()
	writer := sb.Command(tctx, "sh", "-c", `g=0; while :; do g=$((g+1)); echo $g > pa.tmp; echo $g > pb.tmp; mv pa.tmp pa; mv pb.tmp pb; done`)
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	defer writer.Wait()
	defer stop()
	if r := run(t, sb, `i=0; while ! [ -s pb ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; echo $i`); r.Stdout == "500\n" {
		t.Fatal("the writer did not start")
	}
	sn, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	defer func() {
		if err := sn.Remove(ctxFor(t)); err != nil {
			t.Errorf("Remove: %v", err)
		}
	}()
	n := strings.TrimSpace(run(t, sb, "wc -l < /tmp/ticks").Stdout)
	if r := run(t, sb, `i=0; while [ $(wc -l < /tmp/ticks) -le `+n+` ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done; echo $i`); r.Stdout == "500\n" {
		t.Errorf("the source's process did not run on after the snapshot")
	}
	run(t, sb, "printf changed > d/a") // after the snapshot: not in it
	forks, err := sn.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("Fork(2): %v", err)
	}
	for _, f := range forks {
		t.Cleanup(func() { f.Close() })
	}
	const files = `printf '%s %s %s %s %s %s\n' "$(cat d/a)" "$(stat -c %a d/a)" "$(readlink d/link)" "$(cat d/hard)" "$(cat 'new
line')" "$(stat -c %a closed)"`
	const want = "one 640 a one two 0\n"
	for i, f := range forks {
		if got := run(t, f, files).Stdout; got != want {
			t.Errorf("fork %d: %q, want %q", i, got, want)
		}
		if got := run(t, f, "md5sum big/*").Stdout; got != sums {
			t.Errorf("fork %d: the big files restored:\n%s\nwant\n%s", i, got, sums)
		}
		// pa is renamed first: one moment has pa one ahead of pb at most.
		if got := run(t, f, `echo $(( $(cat pa) - $(cat pb) ))`).Stdout; got != "0\n" && got != "1\n" {
			t.Errorf("fork %d: pa - pb = %q: the snapshot holds them from different moments", i, got)
		}
	}
	run(t, forks[0], "rm d/a")
	if r := run(t, forks[1], "cat d/a"); r.Stdout != "one" {
		t.Errorf("a file removed in one fork is gone in the other: %+v", r)
	}
	if r := run(t, sb, "cat d/a"); r.Stdout != "changed" {
		t.Errorf("the source after the snapshot: %q", r.Stdout)
	}

	// A chain: a snapshot of a fork, restored into sandboxes of a pool
	// made with the source's options.
	run(t, forks[1], "printf three > d/a")
	sn2, err := forks[1].Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot of a fork: %v", err)
	}
	defer sn2.Remove(ctxFor(t))
	pool, err := sandbox.NewPool(ctx, 2, c.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pooled, err := sn2.Fork(ctx, 2, sandbox.WithPool(pool))
	if err != nil {
		t.Fatalf("Fork(2) into a pool's sandboxes: %v", err)
	}
	for i, f := range pooled {
		t.Cleanup(func() { f.Close() })
		if got, want := run(t, f, files).Stdout, "three 640 a three two 0\n"; got != want {
			t.Errorf("pooled fork %d of the chain: %q, want %q", i, got, want)
		}
	}
}

func (c conformance) expose(t *testing.T) {
	sb := c.new(t)
	ctx := ctxFor(t)
	if err := sb.MkdirAll(ctx, "www", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "www/index.html", []byte("served from the sandbox"), 0o644); err != nil {
		t.Fatal(err)
	}
	srvCtx, stop := context.WithCancel(ctx)
	defer stop()
	srv := sb.Command(srvCtx, "sh", "-c", `cd www && if command -v python3 >/dev/null; then exec python3 -m http.server 8000 --bind 127.0.0.1; else exec httpd -f -p 127.0.0.1:8000 -h .; fi`)
	var srvErr strings.Builder
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Wait()
	defer stop()
	// Port 8000 is 1F40; state 0A is LISTEN.
	if r := run(t, sb, `i=0; while [ $i -lt 200 ]; do grep -q ':1F40 00000000:0000 0A' /proc/net/tcp && break; sleep 0.05; i=$((i+1)); done; echo $i`); r.Stdout == "200\n" {
		t.Fatalf("the server did not listen: %s", srvErr.String())
	}
	u, err := sb.Expose(ctx, 8000)
	if err != nil {
		t.Fatalf("Expose: %v", err)
	}
	// A loopback address of the sandbox's own (127.0.0.1 where the host
	// routes nothing else of 127.0.0.0/8).
	if !regexp.MustCompile(`^http://127\.\d+\.\d+\.\d+:\d+$`).MatchString(u) {
		t.Errorf("Expose URL %q", u)
	}
	hc := &http.Client{Timeout: 20 * time.Second}
	resp, err := hc.Get(u + "/index.html")
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "served from the sandbox" {
		t.Errorf("GET through Expose: %s %q", resp.Status, body)
	}
	u2, err := sb.Expose(ctx, 8001)
	if err != nil {
		t.Fatal(err)
	}
	if h1, h2 := strings.Split(u, ":")[1], strings.Split(u2, ":")[1]; h1 != h2 {
		t.Errorf("one sandbox's Expose URLs %s and %s have different hosts", u, u2)
	}
	resp, err = hc.Get(u2 + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", u2, err)
	}
	io.Copy(io.Discard, bufio.NewReader(resp.Body))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("GET of an exposed port nothing listens on: %s, want 502", resp.Status)
	}
}
