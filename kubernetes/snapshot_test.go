package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// run runs script in sb and fails the test unless it exits 0.
func run(t *testing.T, sb *sandbox.Sandbox, script string) string {
	t.Helper()
	r, err := sb.Exec(ctxFor(t), script)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("Exec(%q): %+v, %v", script, r, err)
	}
	return r.Stdout
}

// stoppedScript lists the processes of the sandbox in state T.
const stoppedScript = `for s in /proc/[0-9]*/status; do grep -H '^State:.*T' $s; done 2>/dev/null; true`

// TestSnapshotLarge: on Kubernetes, the archive of a snapshot goes through
// the exec'd relay, which the freeze must not stop (it stopped it, and a
// workdir of 1 MiB, more than the socket buffers hold, then hung the
// sandbox for good). A snapshot of 64 MiB with processes running works,
// holds one moment of a pair of files rewritten meanwhile, and leaves
// nothing stopped; snapshots cut by their context leave nothing stopped
// and the sandbox working.
func TestSnapshotLarge(t *testing.T) {
	t.Parallel()
	// The writers below run for the whole test, which on a loaded machine
	// outlasts the default ExecTimeout (60 s; it once took 154 s in CI and
	// the ticker's kill looked like a sandbox left stopped).
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 160 << 20, ExecTimeout: 10 * time.Minute}))
	ctx := ctxFor(t)
	run(t, sb, `mkdir big && for i in 1 2 3 4 5 6 7 8; do head -c 8388608 /dev/urandom > big/$i; done`)
	sums := run(t, sb, "md5sum big/*")
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, script := range []string{
		`while :; do echo tick >> /tmp/ticks; sleep 0.01; done`,
		`g=0; while :; do g=$((g+1)); echo $g > pa.tmp; echo $g > pb.tmp; mv pa.tmp pa; mv pb.tmp pb; done`,
	} {
		c := sb.Command(wctx, "sh", "-c", script)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Wait()
	}
	defer stop()
	run(t, sb, `i=0; while ! [ -s pb ] || ! [ -s /tmp/ticks ]; do [ $i -lt 500 ] || exit 1; sleep 0.02; i=$((i+1)); done`)

	start := time.Now()
	sn, err := sb.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot of 64 MiB: %v", err)
	}
	defer sn.Remove(context.Background())
	t.Logf("a snapshot of %d MiB in %v", sn.Size()>>20, time.Since(start).Round(time.Millisecond))
	if got := run(t, sb, stoppedScript); got != "" {
		t.Errorf("after the snapshot, processes stopped:\n%s", got)
	}
	r, err := sn.New(ctx)
	if err != nil {
		t.Fatalf("restoring: %v", err)
	}
	defer r.Close()
	if got := run(t, r, "md5sum big/*"); got != sums {
		t.Errorf("the files restored:\n%s\nwant\n%s", got, sums)
	}
	if got := run(t, r, `echo $(( $(cat pa) - $(cat pb) ))`); got != "0\n" && got != "1\n" {
		t.Errorf("pa - pb = %q: the snapshot holds them from different moments", got)
	}

	// Cut short: nothing stays stopped, the sandbox goes on.
	cut := 0
	for d := 5 * time.Millisecond; d < time.Minute; d *= 2 {
		sctx, cancel := context.WithTimeout(ctx, d)
		sn, err := sb.Snapshot(sctx)
		cancel()
		if err == nil {
			sn.Remove(ctx)
			break
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Snapshot with a deadline of %v: %v; want context.DeadlineExceeded", d, err)
		}
		cut++
		if got := run(t, sb, stoppedScript); got != "" {
			t.Fatalf("after a snapshot cut at %v, processes stopped:\n%s", d, got)
		}
		n := strings.TrimSpace(run(t, sb, "wc -l < /tmp/ticks"))
		run(t, sb, fmt.Sprintf(`i=0; while [ $(wc -l < /tmp/ticks) -le %s ]; do [ $i -lt 500 ] || exit 1; sleep 0.02; i=$((i+1)); done`, n))
	}
	if cut == 0 {
		t.Error("no snapshot was cut short")
	}
	t.Logf("%d snapshots cut short", cut)
}
