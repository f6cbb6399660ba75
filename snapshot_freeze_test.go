package sandbox_test

// Snapshot's freeze of the source's processes: a file rewritten without
// pause is captured whole, a fork bomb or a snapshot cut short leaves no
// process stopped, a process its user stopped stays stopped; and sandboxes
// whose processes resist the freeze: a writer resumed without pause by a
// partner (SIGCONT), a process a POSIX timer resumes every millisecond.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// stillDirs is how many directories the writer keeps a generation file in;
// each also holds a share of the working directory's data, so the
// snapshot reads their generation files far apart.
const stillDirs = 16

// stillWriter rewrites the generation file of every directory d00..d15
// together: first every gen.tmp, then, in order, each renamed over gen; a
// line per generation (a tick) goes to /tmp/ticks. Any moment of it has
// the gen files non-increasing in directory order and at most one
// generation apart, and a gen.tmp (empty while being written) only where
// gen is one behind it. With an argument, the writer also reads its stdin
// with O_ASYNC and F_SETSIG(SIGCONT): every write the agent makes to it
// (input the library sends) resumes the writer, stopped or not.
const stillWriter = `
import fcntl, os, sys
if len(sys.argv) > 1:
    fcntl.fcntl(0, fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(0, 10, 18)  # F_SETSIG, SIGCONT
    fcntl.fcntl(0, fcntl.F_SETFL, os.O_NONBLOCK | os.O_ASYNC)
    fcntl.fcntl(0, 1031, 1 << 20)  # F_SETPIPE_SZ: room for what comes while it is stopped
dirs = sorted(d for d in os.listdir(".") if d.startswith("d"))
open("/tmp/writer.pid", "w").write(str(os.getpid()))
g = 0
while True:
    g += 1
    for d in dirs:
        with open(d + "/gen.tmp", "w") as f:
            f.write(str(g))
    for d in dirs:
        os.rename(d + "/gen.tmp", d + "/gen")
    with open("/tmp/ticks", "a") as f:
        f.write("%d\n" % g)
    while len(sys.argv) > 1:
        try:
            if not os.read(0, 1 << 16):
                sys.exit(0)
        except BlockingIOError:
            break
`

// stillSetup fills the working directory with mib MiB of random data
// across the directories and starts the writer, with resumed the one
// incoming connections resume.
func stillSetup(t *testing.T, sb *sandbox.Sandbox, mib int, resumed bool) (in *endless) {
	t.Helper()
	ctx := testCtx(t)
	per := mib << 20 / stillDirs
	snapRun(t, sb, fmt.Sprintf(`set -e; for i in $(seq -w 0 %d); do mkdir d$i; head -c %d /dev/urandom > d$i/data; echo 0 > d$i/gen; done`, stillDirs-1, per), 0)
	if err := sb.WriteFile(ctx, "writer.py", []byte(stillWriter), 0o644); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	args := []string{"python3", "writer.py"}
	w := sb.Command(wctx, args[0], args[1:]...)
	if resumed {
		w.Args = append(w.Args, "resumed")
		in = &endless{ctx: wctx}
		w.Stdin = in
	}
	var stderr strings.Builder
	w.Stderr = &stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		w.Wait()
		if s := stderr.String(); s != "" {
			t.Logf("writer's stderr: %s", s)
		}
	})
	waitExec(t, sb, `test -s /tmp/ticks && test -s /tmp/writer.pid`)
	return in
}

// endless is input without end, a byte at a time, until ctx ends; it
// counts its reads.
type endless struct {
	ctx   context.Context
	reads atomic.Int64
}

func (e *endless) Read(p []byte) (int, error) {
	if err := e.ctx.Err(); err != nil {
		return 0, io.EOF
	}
	e.reads.Add(1)
	// A byte at a time: input trickles in, so the pipe is never full and
	// every write of the agent's to it signals the writer.
	p[0] = 'x'
	return 1, nil
}

// stillCheck reads the generation files of a restored snapshot and
// reports whether they show one moment of the writer.
func stillCheck(t *testing.T, r *sandbox.Sandbox) (string, bool) {
	t.Helper()
	out := snapRun(t, r, `for d in d*/; do printf '%s %s\n' "$(cat ${d}gen)" "$(cat ${d}gen.tmp 2>/dev/null || echo -)"; done`, 0)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != stillDirs {
		return out, false
	}
	var gens []int
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 1 {
			f = append(f, "") // a gen.tmp being written
		}
		g, err := strconv.Atoi(f[0])
		if err != nil || len(f) != 2 {
			return out, false
		}
		if f[1] != "-" {
			if tmp, err := strconv.Atoi(f[1]); f[1] != "" && (err != nil || tmp != g+1) {
				return out, false
			}
		}
		gens = append(gens, g)
	}
	for i := 1; i < len(gens); i++ {
		if gens[i] > gens[i-1] || gens[0]-gens[i] > 1 {
			return out, false
		}
	}
	return out, true
}

// ticks returns how many ticks the writer has logged.
func ticks(t *testing.T, sb *sandbox.Sandbox) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(snapRun(t, sb, "wc -l < /tmp/ticks", 0)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// noneStopped checks that no process of sb is stopped (state T).
func noneStopped(t *testing.T, sb *sandbox.Sandbox, when string) {
	t.Helper()
	if got := snapRun(t, sb, `for s in /proc/[0-9]*/status; do grep -H '^State:.*T' $s; done 2>/dev/null; true`, 0); got != "" {
		t.Errorf("%s: processes stopped:\n%s", when, got)
	}
}

// stillMiB is the size of the working directory TestSnapshotStill
// snapshots: 32 MiB, or SANDBOX_TEST_STILL_MIB (the figure for 250 MiB).
func stillMiB(t *testing.T) int {
	if s := os.Getenv("SANDBOX_TEST_STILL_MIB"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < stillDirs {
			t.Fatalf("SANDBOX_TEST_STILL_MIB=%q", s)
		}
		return n
	}
	return 32
}

// TestSnapshotStill: while Snapshot reads the files no process of the
// sandbox runs, though a partner resumes the writer (SIGCONT) without
// pause and 100 sleeping processes make each scan of /proc longer: every
// snapshot holds one moment of the writer, none fails from its renames,
// and no process is left stopped.
func TestSnapshotStill(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	mib := stillMiB(t)
	src := newPython(t, sandbox.WithLimits(sandbox.Limits{PIDs: 512, Disk: int64(mib)<<20 + 256<<20,
		Memory: 2*(int64(mib)<<20+256<<20) + 256<<20})) // room for a tmpfs working directory too
	stillSetup(t, src, mib, false)
	for _, script := range []string{
		`for i in $(seq 100); do sleep 100000 & done; wait`,
		`w=$(cat /tmp/writer.pid); while kill -CONT $w; do :; done`,
	} {
		c := src.Command(ctx, "sh", "-c", script)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	waitExec(t, src, `test $(grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l) -ge 100`)
	base := ticks(t, src)
	t.Logf("for comparison, %d writer ticks between two calls with nothing between", ticks(t, src)-base)
	for i := range 4 {
		before := ticks(t, src)
		start := time.Now()
		sn, err := src.Snapshot(ctx)
		took := time.Since(start)
		during := ticks(t, src) - before
		if err != nil {
			t.Errorf("snapshot %d: %v", i, err)
			continue
		}
		t.Logf("snapshot %d of %d MiB: %v, %d writer ticks between the calls around it", i, sn.Size()>>20, took.Round(time.Millisecond), during)
		r := restore(t, sn)
		if out, ok := stillCheck(t, r); !ok {
			t.Errorf("snapshot %d holds the writer's files from different moments (gen, gen.tmp per directory):\n%s", i, out)
		}
		r.Close()
		sn.Remove(ctx)
	}
	noneStopped(t, src, "after the snapshots")
	n := ticks(t, src)
	waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %d", n))
}

// TestSnapshotUnstoppable: a process that something outside the sandbox
// resumes (here input the library sends without pause, each write of
// which the kernel turns into a SIGCONT to it) cannot be kept stopped. Snapshot then fails with ErrNotStopped
// naming it (or, if it happened to stay stopped, holds one moment of its
// files), resumes everything it stopped, and the sandbox goes on working.
func TestSnapshotUnstoppable(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newPython(t)
	in := stillSetup(t, src, 32, true)
	failed := 0
	for i := range 3 {
		start := time.Now()
		sn, err := src.Snapshot(ctx)
		took := time.Since(start)
		if err != nil {
			if !errors.Is(err, sandbox.ErrNotStopped) {
				t.Fatalf("snapshot %d: %v, want ErrNotStopped", i, err)
			}
			if !strings.Contains(err.Error(), "python3") {
				t.Errorf("snapshot %d: %v does not name the process", i, err)
			}
			failed++
			t.Logf("snapshot %d failed after %v: %v", i, took.Round(time.Millisecond), err)
		} else {
			t.Logf("snapshot %d got through in %v", i, took.Round(time.Millisecond))
			r := restore(t, sn)
			if out, ok := stillCheck(t, r); !ok {
				t.Errorf("snapshot %d holds the writer's files from different moments (gen, gen.tmp per directory):\n%s", i, out)
			}
			r.Close()
			sn.Remove(ctx)
		}
		noneStopped(t, src, fmt.Sprintf("after snapshot %d", i))
		n := ticks(t, src)
		waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %d", n))
	}
	t.Logf("%d of 3 snapshots failed with ErrNotStopped; %d reads of the writer's input", failed, in.reads.Load())
}

// TestSnapshotProcesses: Snapshot stops the sandbox's processes while it
// reads the files and resumes them afterwards: a file rewritten without
// pause is captured whole (one generation, never torn), a fork bomb does
// not keep the snapshot from finishing, a process its user stopped stays
// stopped, and files and directories the user closed to themselves are
// captured with their modes.
func TestSnapshotProcesses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newSandbox(t, sandbox.WithLimits(sandbox.Limits{PIDs: 64}))
	snapRun(t, src, "mkdir closed && echo inside > closed/f && chmod 000 closed/f closed", 0)

	// A process that stopped itself (the user's SIGSTOP).
	stopped := src.Command(ctx, "sh", "-c", `echo $$ > /tmp/stopped.pid; kill -STOP $$; echo resumed > /tmp/resumed`)
	if err := stopped.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, `test -s /tmp/stopped.pid && grep -q '^State:.*T' /proc/$(cat /tmp/stopped.pid)/status`)

	// A writer that rewrites f, 256 KiB of one letter, then the other.
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	writer := src.Command(wctx, "sh", "-c", `c=a; while :; do head -c 262144 /dev/zero | tr '\0' $c > f; if [ $c = a ]; then c=b; else c=a; fi; done`)
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	waitExec(t, src, "test -s f")
	for i := range 4 {
		sn := takeSnapshot(t, src)
		r := restore(t, sn)
		out := snapRun(t, r, `n=$(wc -c < f); a=$(tr -d a < f | wc -c); b=$(tr -d b < f | wc -c); echo "$n $a $b"`, 0)
		var n, notA, notB int
		fmt.Sscan(out, &n, &notA, &notB)
		if notA != 0 && notB != 0 {
			t.Errorf("snapshot %d: f of %d bytes is torn: %d bytes not 'a', %d not 'b'", i, n, notA, notB)
		}
		if i == 0 {
			if got := snapRun(t, r, `stat -c %a closed; chmod 700 closed; stat -c %a closed/f; chmod 600 closed/f; cat closed/f`, 0); got != "0\n0\ninside\n" {
				t.Errorf("the closed directory and file restored: %q", got)
			}
		}
	}
	// The source's own closed files keep their modes.
	if got := snapRun(t, src, "stat -c %a closed", 0); got != "0\n" {
		t.Errorf("the source's closed directory after the snapshots: mode %q", got)
	}
	// The writer was resumed: it still runs and still writes.
	snapRun(t, src, `s=$(stat -c %Y.%s f; md5sum < f); i=0; while [ "$(stat -c %Y.%s f; md5sum < f)" = "$s" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ $i -lt 200 ]`, 0)

	// A fork bomb (bounded by the PIDs limit) does not hold the snapshot
	// up; afterwards it is killed like any command.
	bctx, stopBomb := context.WithCancel(ctx)
	bomb := src.Command(bctx, "sh", "-c", `b() { echo x; b & b; }; b`)
	forking := make(chan struct{})
	bomb.Stdout = &firstWrite{c: forking}
	if err := bomb.Start(); err != nil {
		t.Fatal(err)
	}
	<-forking
	sn, err := src.Snapshot(ctx)
	if err != nil {
		t.Errorf("Snapshot during a fork bomb: %v", err)
	} else {
		sn.Remove(ctx)
	}
	stopBomb()
	bomb.Wait()
	stopWriter()
	writer.Wait()

	// Still stopped, never resumed by a snapshot.
	if got := snapRun(t, src, `grep '^State:' /proc/$(cat /tmp/stopped.pid)/status | cut -c8; test ! -e /tmp/resumed`, 0); got != "T\n" {
		t.Errorf("the user's stopped process after the snapshots: state %q", got)
	}
	snapRun(t, src, `kill -CONT $(cat /tmp/stopped.pid)`, 0)
	if err := stopped.Wait(); err != nil {
		t.Errorf("the stopped process, resumed: %v", err)
	}
}

// TestSnapshotCancel: a snapshot whose context ends while the files are
// read fails with the context's error, and leaves no process of the
// source stopped. The deadline grows until a snapshot gets through.
func TestSnapshotCancel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	src := newSandbox(t)
	snapRun(t, src, "head -c 67108864 /dev/urandom > big", 0)
	tctx, stopTicker := context.WithCancel(ctx)
	defer stopTicker()
	ticker := src.Command(tctx, "sh", "-c", "while :; do echo tick >> /tmp/ticks; sleep 0.01; done")
	if err := ticker.Start(); err != nil {
		t.Fatal(err)
	}
	defer ticker.Wait()
	defer stopTicker()
	waitExec(t, src, "test -s /tmp/ticks")
	cancelled := 0
	for d := time.Millisecond; ; d *= 2 {
		sctx, cancel := context.WithTimeout(ctx, d)
		sn, err := src.Snapshot(sctx)
		cancel()
		if err == nil {
			sn.Remove(ctx)
			break
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Snapshot with a deadline of %v: %v; want context.DeadlineExceeded", d, err)
		}
		cancelled++
		// Nothing is left stopped: no process in state T, and the ticker
		// ticks on.
		n := snapRun(t, src, "wc -l < /tmp/ticks", 0)
		if got := snapRun(t, src, `grep -l '^State:.*T' /proc/[0-9]*/status 2>/dev/null | wc -l`, 0); got != "0\n" {
			t.Fatalf("after a Snapshot cut at %v: %s processes stopped", d, strings.TrimSpace(got))
		}
		waitExec(t, src, fmt.Sprintf("test $(wc -l < /tmp/ticks) -gt %s", strings.TrimSpace(n)))
		if d > time.Minute {
			t.Fatal("no snapshot got through")
		}
	}
	if cancelled == 0 {
		t.Error("no snapshot was cut short")
	}
	t.Logf("%d snapshots cut short before one got through", cancelled)
}

// firstWrite closes c at its first write.
type firstWrite struct {
	c    chan struct{}
	once sync.Once
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.c) })
	return len(p), nil
}
