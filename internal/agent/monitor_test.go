//go:build linux

package main

import (
	"encoding/json"

	"golang.org/x/sys/unix"

	"fmt"
	"github.com/agentsandbox/sandbox/internal/wire"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// monitorRun runs sh -c script under a new monitor and returns the events
// seen until the script and every process it left ended.
func monitorRun(t *testing.T, script string) []actEvent {
	t.Helper()
	var mu sync.Mutex
	var evs []actEvent
	m, err := newMonitor(func(ev actEvent) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.close)
	args := []string{"sh", "-c", script}
	var pid int
	m.fork("/bin/sh", args, 0, func() {
		pid, err = syscall.ForkExec("/bin/sh", args, &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}})
	})
	if err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	// The end of the script itself comes from its exit call or its pidfd;
	// wait until each process that executed a program has ended.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		open := map[int]int{}
		for _, ev := range evs {
			switch ev.kind {
			case actExec:
				if open[ev.pid] == 0 {
					open[ev.pid] = 1
				}
			case actExit:
				open[ev.pid] = 2
			}
		}
		n := 0
		for _, v := range open {
			if v == 1 {
				n++
			}
		}
		out := append([]actEvent(nil), evs...)
		mu.Unlock()
		if n == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d processes without an end after 30 s: %+v", n, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMonitorExecs: every program executed is a record with its
// arguments, the script's own sh too, and each ends with its status.
func TestMonitorExecs(t *testing.T) {
	evs := monitorRun(t, `for i in $(seq 50); do /bin/true "arg $i"; done; /bin/sh -c 'exit 3'; /bin/sh -c 'kill -9 $$'; exec /bin/echo -n`)
	var execs []actEvent
	ends := map[int]actEvent{}
	for _, ev := range evs {
		switch ev.kind {
		case actExec:
			execs = append(execs, ev)
		case actExit:
			ends[ev.pid] = ev
		}
	}
	if len(execs) != 55 {
		t.Fatalf("%d execs, want 55 (sh, seq, 50 × true, 2 × sh, echo): %v", len(execs), execs)
	}
	if execs[1].path != "/usr/bin/seq" && execs[1].path != "/bin/seq" {
		t.Errorf("second exec %+v, want seq", execs[1])
	}
	execs = append(execs[:1], execs[2:]...)
	if got := strings.Join(execs[0].args, " "); !strings.HasPrefix(got, "sh -c for i in") {
		t.Errorf("first exec %q", got)
	}
	for i := 1; i <= 50; i++ {
		ev := execs[i]
		if ev.path != "/bin/true" || len(ev.args) != 2 || ev.args[1] != fmt.Sprintf("arg %d", i) {
			t.Errorf("exec %d: %q %q", i, ev.path, ev.args)
		}
		if e, ok := ends[ev.pid]; !ok || e.code != 0 || e.signal != "" {
			t.Errorf("end of %v: %+v", ev.args, e)
		}
		if ev.ppid != execs[0].pid {
			t.Errorf("parent of %v: %d, want the script's %d", ev.args, ev.ppid, execs[0].pid)
		}
	}
	if e := ends[execs[51].pid]; e.code != 3 {
		t.Errorf("exit 3 ended with %+v", e)
	}
	if e := ends[execs[52].pid]; e.code != -1 || (e.signal != "SIGKILL" && e.signal != "") {
		t.Errorf("kill -9 ended with %+v", e)
	}
	// exec in the same PID: a new record.
	if execs[53].pid != execs[0].pid || execs[53].path != "/bin/echo" {
		t.Errorf("exec of the script itself: %+v (script %d)", execs[53], execs[0].pid)
	}
}

// TestMonitorConnect: a connection attempt is seen with the address asked,
// whether or not anything listens there.
func TestMonitorConnect(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this host")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	evs := monitorRun(t, fmt.Sprintf(`python3 -c '
import socket
socket.create_connection(("127.0.0.1", %d)).close()
s = socket.socket(socket.AF_INET6)
try:
    s.connect(("::1", 9))
except OSError:
    pass
'`, port))
	var got []string
	for _, ev := range evs {
		if ev.kind == actConnect {
			got = append(got, fmt.Sprintf("%s %s %d", ev.network, ev.addr, ev.port))
		}
	}
	want := []string{fmt.Sprintf("ip4 127.0.0.1 %d", port), "ip6 ::1 9"}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Errorf("connections %q, want %q", got, want)
	}
}

// TestActRecBounds: a record keeps at most max events and budget bytes,
// counts the rest, and keeps nothing once taken.
func TestActRecBounds(t *testing.T) {
	r := &actRec{max: 3, budget: 1 << 20}
	for i := range 5 {
		r.add(wire.Act{Kind: "exec", PID: i})
	}
	big := &actRec{max: 100, budget: 1000}
	big.add(wire.Act{Kind: "exec", Args: []string{strings.Repeat("x", 2000)}})
	big.add(wire.Act{Kind: "exec", Args: []string{"y"}})
	evs, dropped := r.take()
	if len(evs) != 3 || dropped != 2 || evs[2].PID != 2 {
		t.Errorf("max 3 of 5: %v, dropped %d", evs, dropped)
	}
	r.add(wire.Act{Kind: "exec"})
	if evs, _ := r.take(); len(evs) != 0 {
		t.Errorf("after take: %v", evs)
	}
	if evs, dropped := big.take(); len(evs) != 1 || dropped != 1 || evs[0].Args[0] != "y" {
		t.Errorf("budget: %v, dropped %d", evs, dropped)
	}
}

// TestActRecLive: each event kept is offered at once (live); what was
// sent is not sent again with the exit, and every event goes exactly once,
// in order.
func TestActRecLive(t *testing.T) {
	r := &actRec{max: 4, budget: 1 << 20}
	var sent []int
	r.live = func() {
		for _, ev := range r.unsent() {
			sent = append(sent, ev.PID)
		}
	}
	r.add(wire.Act{Kind: "exec", PID: 1})
	r.add(wire.Act{Kind: "exec", PID: 2})
	live := r.live
	r.live = nil // detached: events wait
	r.add(wire.Act{Kind: "exec", PID: 3})
	r.live = live
	r.add(wire.Act{Kind: "exec", PID: 4})
	r.add(wire.Act{Kind: "exec", PID: 5}) // over max: dropped, nothing offered
	if want := []int{1, 2, 3, 4}; !slices.Equal(sent, want) {
		t.Errorf("sent live %v, want %v", sent, want)
	}
	if evs, dropped := r.take(); len(evs) != 0 || dropped != 1 {
		t.Errorf("with the exit: %v, dropped %d; want nothing more, 1 dropped", evs, dropped)
	}
	r.live = func() { t.Error("an event offered after the exit") }
	r.add(wire.Act{Kind: "exec", PID: 6})
}

// TestActivityBatches: every event arrives, in order, in frames no larger
// than wire.MaxData.
func TestActivityBatches(t *testing.T) {
	var evs []wire.Act
	for i := range 3000 {
		evs = append(evs, wire.Act{Kind: "exec", PID: i, Args: []string{strings.Repeat("a", 100)}})
	}
	var got []wire.Act
	bs := activityBatches(evs)
	for _, b := range bs {
		if len(b) > wire.MaxData {
			t.Fatalf("batch of %d bytes", len(b))
		}
		var part []wire.Act
		if err := json.Unmarshal(b, &part); err != nil {
			t.Fatal(err)
		}
		got = append(got, part...)
	}
	if len(bs) < 2 || len(got) != len(evs) || got[2999].PID != 2999 {
		t.Errorf("%d batches, %d events", len(bs), len(got))
	}
}

// TestMonitorFilterShape: each architecture's block jumps to its own
// notify and allow, and the program ends in allow.
func TestMonitorFilterShape(t *testing.T) {
	prog := monitorFilter()
	if len(prog) > 255 || prog[len(prog)-1].K != unix.SECCOMP_RET_ALLOW {
		t.Fatalf("program of %d instructions", len(prog))
	}
	// Run the program, as the kernel would, on every monitored call and
	// on a few others.
	run := func(arch uint32, nr int32, flags uint32) uint32 {
		var acc uint32
		for pc := 0; pc < len(prog); pc++ {
			in := prog[pc]
			switch in.Code {
			case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS: // seccomp_data: nr at 0, arch at 4, args from 16
				switch {
				case in.K == 0:
					acc = uint32(nr)
				case in.K == 4:
					acc = arch
				case in.K >= 16 && in.K%8 == 0:
					acc = flags // every argument, for the test
				default:
					t.Fatalf("instruction %d loads %d", pc, in.K)
				}
			case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
				if acc == in.K {
					pc += int(in.Jt)
				} else {
					pc += int(in.Jf)
				}
			case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
				if acc&in.K != 0 {
					pc += int(in.Jt)
				} else {
					pc += int(in.Jf)
				}
			case unix.BPF_RET | unix.BPF_K:
				return in.K
			default:
				t.Fatalf("instruction %d: %+v", pc, in)
			}
		}
		t.Fatal("ran off the program")
		return 0
	}
	for _, c := range monitorCalls {
		if got := run(c.arch, c.nr, unix.O_WRONLY); got != unix.SECCOMP_RET_USER_NOTIF {
			t.Errorf("%+v: %#x, want notify", c, got)
		}
		// An open that asks for no write passes; every other call stops.
		want := uint32(unix.SECCOMP_RET_USER_NOTIF)
		if c.file != nil && c.file.flags >= 0 {
			want = unix.SECCOMP_RET_ALLOW
			for _, f := range []uint32{unix.O_RDWR, unix.O_CREAT, unix.O_TRUNC, unix.O_CREAT | unix.O_CLOEXEC} {
				if got := run(c.arch, c.nr, f); got != unix.SECCOMP_RET_USER_NOTIF {
					t.Errorf("%+v flags %#o: %#x, want notify", c, f, got)
				}
			}
		}
		if got := run(c.arch, c.nr, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECTORY); got != want {
			t.Errorf("%+v reading: %#x, want %#x", c, got, want)
		}
	}
	for _, nr := range []int32{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_CLONE, unix.SYS_SOCKET} {
		if got := run(nativeArch, nr, unix.O_WRONLY); got != unix.SECCOMP_RET_ALLOW {
			t.Errorf("native %d: %#x, want allow", nr, got)
		}
	}
}

// TestMonitorFiles: the changes a script makes to files are recorded in
// order, one event each, with the name as asked made absolute, the old
// name of a rename and the target of a link; reads and failing calls are
// not recorded, nor /dev/null.
func TestMonitorFiles(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	evs := monitorRun(t, "cd '"+dir+`' && umask 027 && echo a > f && echo b >> f && cat f > /dev/null && cat < f &&
		mv f g && ln -s g l && ln g h && mkdir d && rmdir d && rm g h l && (echo x > nodir/x) 2>/dev/null;
		(mkdir sub && cd sub && echo z > "new
line" && rm -r ../sub) && : > "$PWD/abs" && mv abs "`+dir+`/abs2"`)
	var got []string
	for _, ev := range evs {
		if ev.kind == actFile {
			f := ev.file
			s := fmt.Sprintf("%s %s size %d mode %o", f.op, strings.TrimPrefix(f.path, dir+"/"), f.size, f.mode)
			if f.from != "" {
				s += " from " + strings.TrimPrefix(f.from, dir+"/")
			}
			if f.refused {
				s += " refused"
			}
			got = append(got, s)
		}
	}
	want := []string{
		"create f size 0 mode 100640",
		"modify f size 2 mode 100640",
		"rename g size 4 mode 100640 from f",
		"create l size 0 mode 120777 from g",
		"create h size 4 mode 100640 from g",
		"create d size 0 mode 40750",
		"remove d size " + itoa(int(dirSize(t, dir))) + " mode 40750",
		"remove g size 4 mode 100640",
		"remove h size 4 mode 100640",
		"remove l size 1 mode 120777",
		"create sub size 0 mode 40750",
		"create sub/new\\nline size 0 mode 100640",
		"remove sub/new\\nline size 2 mode 100640",
		"remove sub size " + itoa(int(dirSize(t, dir))) + " mode 40750",
		"create abs size 0 mode 100640",
		"rename abs2 size 0 mode 100640 from abs",
	}
	for i := range got {
		got[i] = strings.ReplaceAll(got[i], "\n", "\\n")
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("file events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// dirSize is the size stat gives an empty directory in dir's file system.
func dirSize(t *testing.T, dir string) int64 {
	d, err := os.MkdirTemp(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(d)
	fi, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// BenchmarkMonitorFiles measures a file change under the monitor beside
// the same without it: a shell loop creating files (ns/file: the loop's
// time per file; monitor-cpu-ns/file: the monitor's CPU per file).
func BenchmarkMonitorFiles(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("monitor=%v", on), func(b *testing.B) {
			dir := b.TempDir()
			const per = 1000
			script := fmt.Sprintf("cd %s && i=0; while [ $i -lt %d ]; do : > f$i; i=$((i+1)); done", dir, per)
			var m *monitor
			if on {
				var err error
				if m, err = newMonitor(func(actEvent) {}); err != nil {
					b.Fatal(err)
				}
				defer m.close()
			}
			start, cpu := time.Now(), cpuSelf()
			for b.Loop() {
				args := []string{"sh", "-c", script}
				var pid int
				var err error
				run := func() { pid, err = syscall.ForkExec("/bin/sh", args, &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}) }
				if m != nil {
					m.fork("/bin/sh", args, 0, run)
				} else {
					run()
				}
				if err != nil {
					b.Fatal(err)
				}
				var ws syscall.WaitStatus
				syscall.Wait4(pid, &ws, 0, nil)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*per), "ns/file")
			b.ReportMetric(float64(cpuSelf()-cpu)/float64(b.N*per), "monitor-cpu-ns/file")
		})
	}
}
