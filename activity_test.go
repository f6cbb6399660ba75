package sandbox_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// TestActivityConnections: a connection to the sandbox's own loopback is
// recorded as allowed and direct, one out of a sandbox with no network
// (to a bridge of this machine's) as refused; requests through the egress
// proxy as what they asked the proxy for, with its decision — an allowed
// host (a server of the test's) with the bytes of its bodies, and a
// denied one with the reason.
func TestActivityConnections(t *testing.T) {
	t.Parallel()
	bridge := hostAddr(t) // this machine's own (the engine's bridge first)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, strings.Repeat("u", 5000))
	}))
	t.Cleanup(up.Close)
	upPort := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	sb := newPython(t, sandbox.WithActivity(true), sandbox.WithNetwork(sandbox.AllowHosts("api.test:"+upPort, "127.0.0.1/32")),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})))
	r := mustExec(t, sb, fmt.Sprintf(`python3 -c '
import os, socket, urllib.request
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
port = l.getsockname()[1]
socket.create_connection(("127.0.0.1", port)).close()
try:
    socket.create_connection(("%s", 9), timeout=5)
except OSError as e:
    print("refused", e.errno)
print(len(urllib.request.urlopen("http://api.test:%s/", data=b"x"*1000, timeout=20).read()))
try:
    urllib.request.urlopen("http://denied.test/", timeout=20)
except Exception as e:
    print("proxy", type(e).__name__)
print(os.getpid(), port)
'`, bridge, upPort))
	lines := strings.Fields(r.Stdout)
	if len(lines) < 3 || !strings.Contains(r.Stdout, "\n5000\n") {
		t.Fatalf("script: %+v", r)
	}
	pid, port := lines[len(lines)-2], lines[len(lines)-1]
	if r.Activity == nil {
		t.Fatal("no activity record")
	}
	var got []string
	for _, c := range r.Activity.Connections {
		got = append(got, fmt.Sprintf("%s %d %v %s %q pid %d, in %d out %d", c.Host, c.Port, c.Allowed, c.Via, c.Reason, c.PID, c.BytesIn, c.BytesOut))
		if c.Time.IsZero() {
			t.Errorf("connection without a time: %+v", c)
		}
	}
	want := []string{
		"127.0.0.1 " + port + ` true direct "" pid ` + pid + ", in 0 out 0",
		bridge + ` 9 false direct "" pid ` + pid + ", in 0 out 0",
		"api.test " + upPort + ` true proxy "" pid ` + pid + ", in 5000 out 1000", // the bodies
		`denied.test 80 false proxy "host not in the allow-list" pid ` + pid + ", in 0 out 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("connections:\n%s\nwant\n%s\n(stdout %q)", strings.Join(got, "\n"), strings.Join(want, "\n"), r.Stdout)
	}
}

// TestActivityGVisor: gVisor has no seccomp user notification; the agent
// keeps no record there, and says so (its exits, its greeting): a nil
// Activity for a command and for an interpreter run.
func TestActivityGVisor(t *testing.T) {
	testenv.NotOn(t, podmanGVisor, testenv.Podman...)
	t.Parallel()
	requireRunsc(t)
	sb := newSandbox(t, sandbox.WithRuntime("runsc"), sandbox.WithActivity(true))
	r := mustExec(t, sb, "/bin/true")
	if r.Activity != nil {
		t.Errorf("Activity under gVisor: %+v", r.Activity)
	}
	sh, err := sb.Interpreter(testCtx(t), "sh")
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if ex, err := sh.Run(testCtx(t), "/bin/true"); err != nil || ex.Activity != nil {
		t.Errorf("an interpreter run under gVisor: %+v, %v; want a nil Activity", ex, err)
	}
}

// TestActivityEvasion: the ways a program can start another one are all
// recorded — posix_spawn (a vfork), execveat by its raw system call, an
// exec from a second thread — and a fork that never executes is not; a
// process cannot slip out of the record by adding a seccomp filter of its
// own, being traced, or making a user namespace first.
func TestActivityEvasion(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithActivity(true))
	r := mustExec(t, sb, `python3 -c '
import ctypes, os, struct, threading
libc = ctypes.CDLL(None, use_errno=True)
pid = os.posix_spawn("/bin/true", ["/bin/true", "spawned"], os.environ)
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    argv = (ctypes.c_char_p * 3)(b"/bin/true", b"execveat", None)
    libc.syscall(322, -100, b"/bin/true", argv, None, 0)  # execveat(AT_FDCWD, ...)
    os._exit(9)
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    os._exit(0)  # a fork that never executes
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:
    t = threading.Thread(target=lambda: os.execv("/bin/true", ["/bin/true", "thread"]))
    t.start(); t.join()
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:  # a seccomp filter of its own (allow everything), on top
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    flt = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0x7fff0000), 8)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    if libc.prctl(22, 2, ctypes.byref(Fprog(1, ctypes.addressof(flt))), 0, 0) != 0:
        os._exit(20)
    os.execv("/bin/true", ["/bin/true", "own-filter"])
os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:  # traced by its parent (if ptrace is allowed at all)
    libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME
    os.execv("/bin/true", ["/bin/true", "traced"])
_, st = os.waitpid(pid, 0)
if os.WIFSTOPPED(st):
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    os.waitpid(pid, 0)
pid = os.fork()
if pid == 0:  # in a user namespace of its own (if it may make one)
    libc.unshare(0x10000000)  # CLONE_NEWUSER
    os.close(os.open("unshared-file", os.O_WRONLY | os.O_CREAT, 0o644))
    os.execv("/bin/true", ["/bin/true", "unshared"])
os.waitpid(pid, 0)
how = struct.pack("QQQ", os.O_WRONLY | os.O_CREAT, 0o600, 0)  # openat2: flags in memory
fd = libc.syscall(437, -100, b"openat2-file", how, len(how))
if fd < 0:
    print("openat2", ctypes.get_errno())
'`)
	if r.Activity == nil {
		t.Fatal("no activity record")
	}
	var got []string
	for _, p := range r.Activity.Processes {
		if len(p.Args) == 0 || p.Args[0] != "/bin/true" {
			continue // sh and python3
		}
		got = append(got, strings.Join(p.Args, " ")+fmt.Sprintf(" (exit %d)", p.ExitCode))
	}
	want := []string{"/bin/true spawned (exit 0)", "/bin/true execveat (exit 0)", "/bin/true thread (exit 0)",
		"/bin/true own-filter (exit 0)", "/bin/true traced (exit 0)", "/bin/true unshared (exit 0)"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("records after the script's own:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var files []string
	for _, f := range r.Activity.Files {
		if !strings.HasPrefix(f.Path, "/usr/") { // the interpreter's own attempts to cache bytecode
			files = append(files, fmt.Sprintf("%s %s %v", f.Op, path.Base(f.Path), f.Mode))
		}
	}
	if want := []string{"create unshared-file -rw-r--r--", "create openat2-file -rw-------"}; strings.Join(files, "; ") != strings.Join(want, "; ") {
		t.Errorf("files %q, want %q (stdout %q)", files, want, r.Stdout)
	}
}

// TestActivityPip: pip installing a local wheel (made in the sandbox,
// no network) is recorded with the files it wrote: the package's module
// and its metadata, each created, under the target directory.
func TestActivityPip(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithActivity(true))
	mustExec(t, sb, `python3 -c '
import zipfile
with zipfile.ZipFile("demo-1.0-py3-none-any.whl", "w") as z:
    z.writestr("demo/__init__.py", "ANSWER = 42\n")
    z.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    z.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("demo-1.0.dist-info/RECORD", "")
'`)
	r := mustExec(t, sb, `python3 -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check --target "$PWD/site" demo-1.0-py3-none-any.whl && PYTHONPATH=site python3 -c 'import demo; print(demo.ANSWER)'`)
	if !strings.HasSuffix(r.Stdout, "42\n") || r.Activity == nil {
		t.Fatalf("pip install: %+v", r)
	}
	created := map[string]bool{}
	for _, f := range r.Activity.Files {
		if f.Op == "create" && !f.Refused {
			created[f.Path] = true
		}
	}
	w := strings.TrimSuffix(mustExec(t, sb, "pwd").Stdout, "\n")
	for _, p := range []string{"site/demo/__init__.py", "site/demo-1.0.dist-info/METADATA", "site/demo-1.0.dist-info/RECORD", "site/demo-1.0.dist-info/INSTALLER"} {
		if !created[w+"/"+p] {
			t.Errorf("%s/%s not recorded as created; files recorded: %+v", w, p, r.Activity.Files)
		}
	}
	pip := false
	for _, p := range r.Activity.Processes {
		pip = pip || strings.Join(p.Args[:min(3, len(p.Args))], " ") == "python3 -m pip"
	}
	if !pip {
		t.Errorf("no record of python3 -m pip: %+v", r.Activity.Processes)
	}
}

// TestActivityInterpreter: each interpreter run has the record of what its
// code executed, and only that: a second run's record holds none of the
// first's, and the interpreter's own process is in neither.
func TestActivityInterpreter(t *testing.T) {
	t.Parallel()
	sb := newPython(t, sandbox.WithActivity(true))
	ctx := testCtx(t)
	py, err := sb.Interpreter(ctx, "python")
	if err != nil {
		t.Fatal(err)
	}
	defer py.Close()
	var got [2][]string
	for i, code := range []string{
		`import subprocess; subprocess.run(["/bin/true", "first"], check=True)`,
		`import subprocess; subprocess.run(["/bin/sh", "-c", "exit 4"]); subprocess.run(["/bin/echo", "second"], check=True)`,
	} {
		ex, err := py.Run(ctx, code)
		if err != nil || ex.Error != nil {
			t.Fatalf("run %d: %+v, %v", i, ex, err)
		}
		if ex.Activity == nil {
			t.Fatalf("run %d: no activity record", i)
		}
		for _, p := range ex.Activity.Processes {
			got[i] = append(got[i], fmt.Sprintf("%s exit %d ended %v", strings.Join(p.Args, " "), p.ExitCode, !p.End.IsZero()))
		}
	}
	want := [2][]string{{"/bin/true first exit 0 ended true"}, {"/bin/sh -c exit 4 exit 4 ended true", "/bin/echo second exit 0 ended true"}}
	for i := range got {
		if strings.Join(got[i], "; ") != strings.Join(want[i], "; ") {
			t.Errorf("run %d's processes: %q, want %q", i, got[i], want[i])
		}
	}
}

// TestActivityBound: a record is bounded by WithActivityLimit, events of
// every kind together, in order: 150 children make 302 events (the
// script's exec, an exec and an exit per child, the script's exit); with
// a bound of 100 the first 100 are kept (the script and 50 children, the
// last without its end), the other 202 counted, and the audit log says
// so. An out-of-range bound is refused.
func TestActivityBound(t *testing.T) {
	t.Parallel()
	h := &recorder{}
	sb := newSandbox(t, sandbox.WithActivity(true), sandbox.WithActivityLimit(100), sandbox.WithLogger(slog.New(h)))
	r := mustExec(t, sb, `i=0; while [ $i -lt 150 ]; do i=$((i+1)); /bin/true; done`)
	a := r.Activity
	if a == nil || len(a.Processes) != 51 || a.Dropped != 202 {
		n := -1
		if a != nil {
			n = len(a.Processes)
		}
		t.Fatalf("bounded record: %d processes, %+v; want 51 processes, 202 dropped", n, a)
	}
	if p := a.Processes[50]; p.Args[0] != "/bin/true" || !p.End.IsZero() {
		t.Errorf("the last kept child: %+v; want its exec without its end", p)
	}
	dropped := -1
	for _, rec := range h.all() {
		if a := attrs(rec); rec.Message == "sandbox.activity" && a["kind"].String() == "dropped" {
			dropped = int(a["dropped"].Int64())
		}
	}
	if dropped != 202 {
		t.Errorf("the audit log's dropped record says %d, want 202", dropped)
	}
	if _, err := sandbox.New(testCtx(t), sandbox.WithActivity(true), sandbox.WithLimits(sandbox.Limits{PIDs: 20})); err == nil || !strings.Contains(err.Error(), "activity record") {
		t.Errorf("the record with Limits.PIDs 20: %v, want refused (its monitor's threads)", err)
	}
	for _, n := range []int{0, -1, 1<<20 + 1} {
		if _, err := sandbox.New(testCtx(t), sandbox.WithActivityLimit(n)); err == nil || !strings.Contains(err.Error(), "WithActivityLimit") {
			t.Errorf("WithActivityLimit(%d): %v, want refused", n, err)
		}
	}
}

// TestActivityForkBomb: a fork bomb whose every process executes a
// program and creates a file, under a PIDs limit, until the command's
// ExecTimeout kills it: the record stays within its bound, in order, with
// the rest counted; the library's heap stays flat; the sandbox answers
// after, with no process of the bomb left.
func TestActivityForkBomb(t *testing.T) {
	t.Parallel()
	const bound = 100
	sb := newSandbox(t, sandbox.WithActivity(true), sandbox.WithActivityLimit(bound),
		sandbox.WithLimits(sandbox.Limits{PIDs: 64, CPUs: 0.5, ExecTimeout: 5 * time.Second}))
	mustExec(t, sb, `printf '%s\n' ': > /tmp/bomb.$$' 'sh /tmp/bomb.sh & sh /tmp/bomb.sh & wait' > /tmp/bomb.sh`)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	r, err := sb.Exec(testCtx(t), "sh /tmp/bomb.sh")
	if err != nil {
		t.Fatal(err)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	a := r.Activity
	if !r.TimedOut || a == nil {
		t.Fatalf("the bomb: %+v; want it killed at its ExecTimeout, with a record", r)
	}
	kept := len(a.Files) + len(a.Connections)
	for _, p := range a.Processes {
		kept++
		if !p.End.IsZero() && p.End.Before(p.Start) {
			t.Errorf("a record ends before it starts: %+v", p)
		}
	}
	if kept > bound || a.Dropped == 0 || len(a.Processes) < 10 || len(a.Files) < 10 {
		t.Errorf("record of %d processes, %d files (kept %d of at most %d), %d dropped; want it full, with programs and files, the rest counted",
			len(a.Processes), len(a.Files), kept, bound, a.Dropped)
	}
	t.Logf("record: %d processes, %d files, %d dropped; heap %d → %d KiB", len(a.Processes), len(a.Files), a.Dropped, before.HeapInuse>>10, after.HeapInuse>>10)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 32<<20 {
		t.Errorf("the library's heap grew by %d MiB over the bomb", grew>>20)
	}
	// Nothing of the bomb runs on; the sandbox answers.
	if r := mustExec(t, sb, `n=0; for d in /proc/[0-9]*; do read -r c < $d/comm 2>/dev/null && [ "$c" = sh ] && n=$((n+1)); done; echo $n`); r.Stdout != "1\n" {
		t.Errorf("shells running after the kill: %q, want 1 (this one)", r.Stdout)
	}
}
