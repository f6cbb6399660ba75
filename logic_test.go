package sandbox

// Unit tests of the package's own logic: no Docker engine is used (the
// engine is a fake behind engine.API, the agent a fake over an in-memory
// pipe), so `go test -run 'TestUnit' .` passes in milliseconds on a machine
// without one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// Options: defaults, merging of limits, and refusal of what cannot work.
func TestUnitOptions(t *testing.T) {
	t.Setenv("AGENTSANDBOX_PULL", "")
	c, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.image != DefaultImage || c.workdir != "/workspace" || c.user != "" || c.pull != PullMissing ||
		c.limits != DefaultLimits() || !c.network.none() || c.timeout != DefaultTimeout {
		t.Errorf("defaults: %+v", c)
	}

	// Zero fields keep the default, negative ones remove the limit, the
	// last WithLimits wins whole.
	c, err = newConfig([]Option{
		WithLimits(Limits{Memory: 1 << 30}),
		WithLimits(Limits{PIDs: 64, Disk: -1, ExecTimeout: -1}),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultLimits()
	want.PIDs, want.Disk, want.ExecTimeout = 64, -1, -1
	if c.limits != want {
		t.Errorf("merged limits %+v, want %+v", c.limits, want)
	}

	// Options that add, add.
	c, _ = newConfig([]Option{WithEnv("A=1"), WithEnv("B=2", "C="), WithLabels(map[string]string{"x": "1"}), WithLabels(map[string]string{"y": "2"})})
	if !slices.Equal(c.env, []string{"A=1", "B=2", "C="}) || len(c.labels) != 2 {
		t.Errorf("env %q labels %v", c.env, c.labels)
	}

	t.Setenv("AGENTSANDBOX_PULL", "Never")
	if c, _ := newConfig(nil); c.pull != PullNever {
		t.Error("AGENTSANDBOX_PULL=never did not make PullNever the default")
	}
	if c, _ := newConfig([]Option{WithPullPolicy(PullMissing)}); c.pull != PullMissing {
		t.Error("WithPullPolicy did not override the environment")
	}

	// One way to say "a network with nothing allowed".
	for _, p := range []NetworkPolicy{AllowHosts(), {Allow: []string{}}} {
		c, err := newConfig([]Option{WithNetwork(p)})
		if err != nil || c.network.none() || c.network.Allow == nil || len(c.network.Allow) != 0 {
			t.Errorf("WithNetwork(%#v): %v, policy %#v", p, err, c.network)
		}
	}
	if c, _ := newConfig([]Option{WithNetwork(NetworkPolicy{})}); !c.network.none() {
		t.Error("the zero policy is not \"no network\"")
	}

	bad := []struct {
		name string
		opt  Option
		say  string
	}{
		{"empty image", WithImage(""), "empty image"},
		{"pull policy", WithPullPolicy(7), "unknown policy"},
		{"env without =", WithEnv("NOVALUE"), "not KEY=value"},
		{"env with NUL", WithEnv("A=\x00"), "not KEY=value"},
		{"env empty key", WithEnv("=1"), "not KEY=value"},
		{"host env", WithEnv(append(os.Environ(), "X=1")...), "whole environment"},
		{"relative workdir", WithWorkdir("work"), "not an absolute path"},
		{"workdir /", WithWorkdir("/"), `"/"`},
		{"workdir in /proc", WithWorkdir("/proc/self"), "under /proc"},
		{"workdir /sys", WithWorkdir("/sys/../sys"), "under /sys"},
		{"workdir in /dev", WithWorkdir("/dev/shm"), "under /dev"},
		{"user with a space", WithUser("no body"), "is not"},
		{"empty gid", WithUser("1000:"), "is not"},
		{"uid (uid_t)-1", WithUser("4294967295"), "is not"},
		{"reserved label", WithLabels(map[string]string{"dev.agentsandbox.owner": "me"}), "reserved"},
		{"open and allow", WithNetwork(NetworkPolicy{Open: true, Allow: []string{"a.com"}}), "exclude"},
		{"credential host not allowed", WithNetwork(NetworkPolicy{Allow: []string{"a.com"}, Credentials: []Credential{{Host: "b.com", Header: "X", Value: "v"}}}), "not allowed"},
		{"credential header", WithNetwork(NetworkPolicy{Allow: []string{"a.com"}, Credentials: []Credential{{Host: "a.com", Header: "X: y", Value: "v"}}}), "bad header"},
		{"tmp unlimited", WithLimits(Limits{TmpSize: -1}), "TmpSize"},
		{"memory too small", WithLimits(Limits{Memory: 1 << 20}), "6 MiB"},
		{"pids too few", WithLimits(Limits{PIDs: 8}), "minimum 16"},
		{"lifetime too short", WithLimits(Limits{Lifetime: time.Millisecond}), "one second"},
	}
	for _, b := range bad {
		if _, err := newConfig([]Option{b.opt}); err == nil || !strings.Contains(err.Error(), b.say) {
			t.Errorf("%s: %v, want an error saying %q", b.name, err, b.say)
		}
	}
	if _, err := newConfig([]Option{WithWorkdir("/srv/../proc2"), WithUser("0"), WithUser("1000:50")}); err != nil {
		t.Errorf("good options refused: %v", err)
	}
}

// The one path rule: methods take names like a shell in the workdir;
// FS takes fs.FS names rooted at "/".
func TestUnitPathRule(t *testing.T) {
	s := &Sandbox{cfg: config{workdir: "/workspace"}}
	for name, want := range map[string]string{
		"x":                        "/workspace/x",
		"./a/../b":                 "/workspace/b",
		"../etc/passwd":            "/etc/passwd",
		"/tmp//y/":                 "/tmp/y",
		"/":                        "/",
		"":                         "/workspace",
		"dir with space/new\nline": "/workspace/dir with space/new\nline",
	} {
		if got := s.abs(name); got != want {
			t.Errorf("abs(%q) = %q, want %q", name, got, want)
		}
	}
	f := sandboxFS{s: s}
	for name, want := range map[string]string{".": "/", "etc/passwd": "/etc/passwd", "workspace/x": "/workspace/x"} {
		if got, err := f.path("open", name); err != nil || got != want {
			t.Errorf("FS path(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"/etc/passwd", "../x", "a/../b", "a/", "", "a//b"} {
		if _, err := f.path("open", name); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("FS path(%q): %v, want fs.ErrInvalid", name, err)
		}
	}
}

// fakeAgent plays a sandbox's agent over an in-memory pipe: every command
// it is asked to run prints its arguments and exits with status len(args)-1.
func fakeAgent(t *testing.T) *Sandbox {
	t.Helper()
	lib, ag := net.Pipe()
	conn := agentconn.Start(pipeStream{lib}, lib, 5*time.Second)
	w := wire.NewWriter(ag)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fr, err := wire.ReadFrame(ag)
			if err != nil {
				return
			}
			if fr.Kind != wire.Exec {
				continue
			}
			var req wire.ExecRequest
			json.Unmarshal(fr.Data, &req)
			w.WriteJSON(wire.Started, fr.Channel, wire.Start{PID: 7})
			w.Write(wire.Stdout, fr.Channel, []byte(strings.Join(req.Args, " ")+"\n"))
			w.Write(wire.Stdout, fr.Channel, nil)
			w.Write(wire.Stderr, fr.Channel, nil)
			w.WriteJSON(wire.Exited, fr.Channel, wire.Exit{Code: len(req.Args) - 1})
		}
	}()
	t.Cleanup(func() {
		ag.Close()
		lib.Close()
		<-conn.Done()
		<-done
	})
	cfg, err := newConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Sandbox{cfg: cfg, log: cfg.logger, agent: conn, id: "fake"}
}

type pipeStream struct{ net.Conn }

func (p pipeStream) CloseWrite() error { return p.Conn.Close() }

// Cmd follows os/exec's state machine.
func TestUnitCmdStates(t *testing.T) {
	ctx := context.Background()
	s := fakeAgent(t)

	var zero Cmd
	if err := zero.Run(); !errors.Is(err, errNoSandbox) {
		t.Errorf("Run of a Cmd not made by Command: %v", err)
	}
	//lint:ignore SA1012 a nil Context is what is tested
	if err := s.Command(nil, "true").Run(); err == nil || !strings.Contains(err.Error(), "nil Context") { //nolint:staticcheck
		t.Errorf("nil context: %v", err)
	}
	if err := s.Command(ctx, "").Start(); err == nil || !strings.Contains(err.Error(), "empty command") {
		t.Errorf("empty command: %v", err)
	}

	c := s.Command(ctx, "echo")
	if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Wait before Start: %v", err)
	}
	out, err := c.Output()
	if err != nil || string(out) != "echo\n" || c.ProcessState == nil || !c.ProcessState.Success() {
		t.Errorf("Output: %q, %v, %v", out, err, c.ProcessState)
	}
	if err := c.Start(); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Errorf("second Start: %v", err)
	}
	if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "already called") {
		t.Errorf("second Wait: %v", err)
	}
	if _, err := c.StdoutPipe(); err == nil {
		t.Error("StdoutPipe after Start")
	}
	if _, err := c.StdinPipe(); err == nil {
		t.Error("StdinPipe after Start")
	}

	c = s.Command(ctx, "false", "x", "y")
	var b strings.Builder
	c.Stdout = &b
	if _, err := c.Output(); err == nil || !strings.Contains(err.Error(), "Stdout already set") {
		t.Errorf("Output with Stdout set: %v", err)
	}
	err = c.Run()
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 2 || c.ProcessState.ExitCode() != 2 || b.String() != "false x y\n" {
		t.Errorf("Run: %v (exit %v), stdout %q", err, c.ProcessState, b.String())
	}

	c = s.Command(ctx, "true")
	c.Env = append(os.Environ(), "X=1")
	if err := c.Run(); err == nil || !strings.Contains(err.Error(), "whole environment") {
		t.Errorf("Cmd.Env with the host's environment: %v", err)
	}
	if err := c.Wait(); err == nil || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Wait after a refused Start: %v", err)
	}

	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if err := s.Command(ctx, "true").Run(); !errors.Is(err, ErrClosed) {
		t.Errorf("Run on a closed sandbox: %v", err)
	}
}

// A tmpfs working directory must fit in Memory beside /tmp, /dev/shm and
// the processes' reserve: the default size shrinks to fit, an explicit one
// that does not fit is refused with the numbers to change.
func TestUnitTmpfsDisk(t *testing.T) {
	const M = 1 << 20
	def := DefaultLimits()
	small := Limits{Memory: 128 * M, Disk: 1024 * M, TmpSize: 64 * M}
	for _, c := range []struct {
		l         Limits
		diskSet   bool
		tmpSet    bool
		disk, tmp int64
		err       string
	}{
		{def, false, false, 213 * M, 64 * M, ""},                    // (512 - 128 reserve)·8/9 (inodes) - 2×64
		{def, true, false, 0, 0, "lower Disk to at most 213.3 MiB"}, // 1 GiB asked for
		{Limits{Memory: 2048 * M, Disk: 1024 * M, TmpSize: 64 * M}, true, true, 1024 * M, 64 * M, ""},
		{Limits{Memory: 128 * M, Disk: 16 * M, TmpSize: 32 * M}, true, true, 16 * M, 32 * M, ""},
		{small, false, false, 43 * M, 21 * M, ""},                                                     // both defaults: 96 MiB split 2:1:1
		{small, false, true, 0, 0, "raise Memory to at least"},                                        // TmpSize given: kept, so no room
		{small, true, false, 0, 0, "raise Memory to at least"},                                        // Disk given: kept
		{Limits{Memory: 32 * M, Disk: 1024 * M, TmpSize: 64 * M}, false, false, 0, 0, "raise Memory"}, // nothing left past the reserve
		{Limits{Memory: -1, Disk: 1024 * M, TmpSize: 64 * M}, true, true, 1024 * M, 64 * M, ""},
	} {
		got, err := tmpfsDisk(c.l, c.diskSet, c.tmpSet)
		if (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) ||
			(err == nil && (got.Disk != c.disk || got.TmpSize != c.tmp)) {
			t.Errorf("tmpfsDisk(memory %d MiB, disk %d MiB, tmp %d MiB, set %v %v) = disk %d MiB, tmp %d MiB, %v; want %d MiB, %d MiB, %q",
				c.l.Memory/M, c.l.Disk/M, c.l.TmpSize/M, c.diskSet, c.tmpSet, got.Disk/M, got.TmpSize/M, err, c.disk/M, c.tmp/M, c.err)
		}
		if err == nil && c.l.Memory > 0 && driver.TmpfsMemory(got.Disk)+2*driver.TmpfsMemory(got.TmpSize)+tmpfsReserve(c.l.Memory) > c.l.Memory {
			t.Errorf("memory %d MiB: %d MiB of disk and 2×%d MiB of tmp (and their inodes) leave less than the reserve", c.l.Memory/M, got.Disk/M, got.TmpSize/M)
		}
	}
	// The advice holds: at the Memory it names, the Disk fits.
	l := small
	_, err := tmpfsDisk(l, true, true)
	var need int64
	fmt.Sscanf(err.Error()[strings.Index(err.Error(), "at least ")+len("at least "):], "%d", &need)
	l.Memory = need * M
	if _, err := tmpfsDisk(l, true, true); err != nil {
		t.Errorf("with the Memory the error named (%d MiB): %v", need, err)
	}
}

// What the agent finds in force against what was asked: a limit missing or
// looser is refused, naming it; one it cannot tell about passes.
func TestUnitCheckSeen(t *testing.T) {
	l := DefaultLimits()
	exact := wire.Seen{CPUs: l.CPUs, Memory: l.Memory, PIDs: l.PIDs, FileSize: l.FileSize, OpenFiles: l.OpenFiles}
	if err := checkSeen(l, exact); err != nil {
		t.Errorf("limits in force as asked: %v", err)
	}
	if err := checkSeen(l, wire.Seen{CPUs: -1, Memory: -1, PIDs: -1, FileSize: -1, OpenFiles: -1}); err != nil {
		t.Errorf("nothing known: %v", err)
	}
	rootless := wire.Seen{CPUs: 0, Memory: 0, PIDs: 0, FileSize: 0, OpenFiles: 1024}
	err := checkSeen(l, rootless)
	if !errors.Is(err, ErrLimitsUnsupported) {
		t.Fatalf("no cgroup limits: %v, want ErrLimitsUnsupported", err)
	}
	for _, want := range []string{"Memory 512 MiB (in force: none)", "PIDs 256 (in force: none)", "FileSize 256 MiB (in force: none)", "CPUs 1 (in force: none)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v: does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "OpenFiles") {
		t.Errorf("%v: names OpenFiles, which is in force", err)
	}
	looser := exact
	looser.Memory = 2 * l.Memory
	if err := checkSeen(l, looser); err == nil || !strings.Contains(err.Error(), "Memory 512 MiB (in force: 1024 MiB)") {
		t.Errorf("a looser memory limit: %v", err)
	}
	removed := Limits{CPUs: -1, Memory: -1, PIDs: -1, FileSize: -1, OpenFiles: -1}
	if err := checkSeen(removed, rootless); err != nil {
		t.Errorf("limits removed by the caller: %v", err)
	}
}

// fakeDriver records the Spec it is given and fails Create with err.
type fakeDriver struct {
	caps  driver.Caps
	err   error
	specs []driver.Spec
}

func (f *fakeDriver) Caps(context.Context) (driver.Caps, error) { return f.caps, nil }
func (f *fakeDriver) Create(_ context.Context, spec *driver.Spec) (driver.Instance, error) {
	f.specs = append(f.specs, *spec)
	return nil, f.err
}
func (f *fakeDriver) Prune(context.Context) (int, error) { return 0, nil }
func (f *fakeDriver) Close() error                       { return nil }

// New maps its options onto the backend-neutral Spec, fits the limits to a
// backend whose working directory is memory, and passes the backend's
// errors on as they are, so that they match the package's sentinels.
func TestUnitDriverSpec(t *testing.T) {
	ctx := context.Background()
	fd := &fakeDriver{caps: driver.Caps{Disk: driver.DiskExt4}, err: fmt.Errorf("no engine here: %w", driver.ErrUnavailable)}
	_, err := New(ctx, WithDriver(fd), WithImage("img:1"), WithEnv("A=1"), WithUser("1000:1000"), WithRuntime("runsc"),
		WithLabels(map[string]string{"team": "x"}), WithLimits(Limits{CPUs: 2, Lifetime: 90 * time.Second}),
		WithNetwork(AllowHosts("example.org")))
	if !errors.Is(err, ErrEngineUnavailable) || len(fd.specs) != 1 {
		t.Fatalf("New through a failing driver: %v (%d creates)", err, len(fd.specs))
	}
	sp := fd.specs[0]
	d := DefaultLimits()
	want := driver.Resources{CPUs: 2, Memory: d.Memory, PIDs: d.PIDs, Disk: d.Disk, TmpSize: d.TmpSize,
		FileSize: d.FileSize, OpenFiles: d.OpenFiles, Lifetime: 90 * time.Second}
	if sp.Image != "img:1" || sp.Workdir != "/workspace" || sp.Runtime != "runsc" ||
		sp.Labels["team"] != "x" || sp.Network != driver.NetworkNone || sp.Resources != want || sp.Timeout != DefaultTimeout {
		t.Errorf("spec %+v", sp)
	}
	if a := sp.Agent; a.Lifetime != 90*time.Second || a.User != "1000:1000" || a.RelayPort <= 0 || a.Drawn {
		t.Errorf("agent arguments %+v", a)
	}
	env := strings.Join(sp.Env, " ")
	if !strings.Contains(env, "HOME=/workspace") || !strings.Contains(env, "A=1") || !strings.Contains(env, "HTTP_PROXY=http://127.0.0.1:") {
		t.Errorf("environment %q", env)
	}

	// Open is the backend's; the default user is drawn.
	fd.specs = nil
	New(ctx, WithDriver(fd), WithNetwork(NetworkPolicy{Open: true}))
	if sp := fd.specs[0]; sp.Network != driver.NetworkOpen || !sp.Agent.Drawn ||
		strings.Contains(strings.Join(sp.Env, " "), "HTTP_PROXY") {
		t.Errorf("Open: %+v", sp)
	}

	// A memory working directory: the default Disk shrinks to fit Memory.
	fd = &fakeDriver{caps: driver.Caps{Disk: driver.DiskMemory}, err: errors.New("stop")}
	New(ctx, WithDriver(fd), WithLimits(Limits{Memory: 256 << 20}))
	if r := fd.specs[0].Resources; r.Disk+2*r.TmpSize > 256<<20-64<<20 || r.Disk <= 0 {
		t.Errorf("tmpfs disk %d and /tmp %d in 256 MiB of memory", r.Disk, r.TmpSize)
	}
	if _, err := New(ctx, WithDriver(fd), WithLimits(Limits{Memory: 256 << 20, Disk: 1 << 30})); err == nil ||
		!strings.Contains(err.Error(), "does not fit") || len(fd.specs) != 1 {
		t.Errorf("an explicit Disk that cannot fit: %v (%d creates)", err, len(fd.specs))
	}
	if _, err := New(ctx, WithDriver(nil)); err == nil {
		t.Error("WithDriver(nil) accepted")
	}
}

// A pool's sandbox serves a restore only with the settings the restored
// sandbox would have; the first difference is named.
func TestUnitPoolSettings(t *testing.T) {
	base, err := newConfig([]Option{WithImage("img:1"), WithEnv("A=1"), WithLabels(map[string]string{"k": "v"})})
	if err != nil {
		t.Fatal(err)
	}
	fd := &fakeDriver{}
	for _, tc := range []struct {
		change func(c *config)
		want   string
	}{
		{func(c *config) {}, ""},
		{func(c *config) { c.take = (&Pool{}).take; c.logger = nil; c.snapshot = "sha256:x" }, ""}, // not settings of the sandbox
		{func(c *config) { c.base = "img:2" }, "image"},
		{func(c *config) { c.limits.Memory++ }, "limits"},
		{func(c *config) { c.user = "1000:1000" }, "user"},
		{func(c *config) { c.workdir = "/home" }, "working directory"},
		{func(c *config) { c.env = append(c.env, "B=2") }, "environment"},
		{func(c *config) { c.runtime = "runsc" }, "runtime"},
		{func(c *config) { c.labels = map[string]string{"k": "w"} }, "labels"},
		{func(c *config) { c.network = AllowHosts("example.org") }, "network policy"},
		{func(c *config) { c.driver = fd }, "backend"},
		{func(c *config) { c.host = "tcp://127.0.0.1:1" }, "backend"},
	} {
		want := base
		want.base = "img:1"
		want.env = slices.Clone(base.env)
		tc.change(&want)
		sb := &Sandbox{cfg: base, base: "img:1"}
		if got := sb.differsFrom(&want); got != tc.want {
			t.Errorf("differsFrom = %q, want %q", got, tc.want)
		}
	}
}

// The activity record joins the egress proxy's decisions to the connects
// to the proxy they came on: by process, connection by connection, each
// connect replaced by the decisions on its connection (several on a
// kept-alive one); a connect with no decision stays as the monitor saw
// it; decisions whose connect the record dropped are counted dropped;
// another command's decisions stay for it.
func TestUnitActivityProxyJoin(t *testing.T) {
	s := &Sandbox{proxy: &proxy{relayPort: 30000}}
	c1, c2, c3 := &net.TCPConn{}, &net.TCPConn{}, &net.TCPConn{}
	decide := func(cmd string, pid int, conn net.Conn, host string, allowed bool) {
		s.proxied.add(cmd, proxiedDecision{pid: pid, conn: conn, c: Connection{Host: host, Port: 443, Allowed: allowed, Via: "proxy", PID: pid}})
	}
	decide("a", 10, c1, "one.test", true)
	decide("b", 10, c3, "other.test", true) // another command's
	decide("a", 11, c2, "two.test", false)
	decide("a", 10, c1, "one-again.test", true) // the same connection, kept alive
	decide("a", 12, &net.TCPConn{}, "lost.test", true)
	relay := func(pid int) wire.Act { return wire.Act{Kind: "connect", PID: pid, Addr: "127.0.0.1", Port: 30000} }
	acts := []wire.Act{
		relay(11),
		{Kind: "connect", PID: 10, Addr: "127.0.0.1", Port: 8080}, // direct, loopback
		relay(10),
		relay(10), // a second connection of 10's: no decision on it
	}
	a := s.activityOf("a", acts, wire.Exit{Dropped: 1}, 0, time.Now())
	var got []string
	for _, c := range a.Connections {
		got = append(got, fmt.Sprintf("%d %s:%d %v %s", c.PID, c.Host, c.Port, c.Allowed, c.Via))
	}
	want := []string{
		"11 two.test:443 false proxy", "10 127.0.0.1:8080 true direct",
		"10 one.test:443 true proxy", "10 one-again.test:443 true proxy",
		"10 127.0.0.1:30000 true proxy",
	}
	if !slices.Equal(got, want) {
		t.Errorf("connections:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if a.Dropped != 2 { // the agent's 1 and lost.test's decision
		t.Errorf("Dropped = %d, want 2", a.Dropped)
	}
	if b := s.proxied.take("b"); b.left() != 1 {
		t.Errorf("command b's decisions: %d left, want 1", b.left())
	}
	if again := s.activityOf("a", nil, wire.Exit{}, 0, time.Now()); again.Dropped != 0 || len(again.Connections) != 0 {
		t.Errorf("decisions taken twice: %+v", again)
	}
	// At most maxProxiedCmds commands are held: the oldest goes first.
	for i := range maxProxiedCmds + 1 {
		decide(fmt.Sprint("cmd", i), 1, c1, "x.test", true)
	}
	if first, last := s.proxied.take("cmd0").left(), s.proxied.take(fmt.Sprint("cmd", maxProxiedCmds)).left(); first != 0 || last != 1 {
		t.Errorf("over the bound: the oldest command holds %d decisions (want 0), the newest %d (want 1)", first, last)
	}
}
