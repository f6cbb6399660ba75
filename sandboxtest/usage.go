package sandboxtest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// usage: Usage follows what the sandbox does — processes it runs, memory
// it holds (a tmpfs file counts), a peak that stays, disk it fills, CPU it
// spends — and WatchUsage streams it until its context ends.
func (c conformance) usage(t *testing.T) {
	made := time.Now()
	sb := c.new(t, c.withLimits(sandbox.Limits{Disk: 64 << 20}))
	ctx := ctxFor(t)
	get := func() sandbox.Usage {
		t.Helper()
		u, err := sb.Usage(ctx)
		if err != nil {
			t.Fatalf("Usage: %v", err)
		}
		return u
	}
	idle := get()
	t.Logf("idle: %+v", idle)
	if idle.Processes != 0 {
		t.Errorf("Processes of an idle sandbox = %d, want 0 (the agent is not counted)", idle.Processes)
	}
	if idle.Memory <= 0 || idle.MemoryPeak < idle.Memory || idle.CPU <= 0 {
		t.Errorf("an idle sandbox's Usage: %+v", idle)
	}
	// The sandbox's own figures, not those of a cgroup it shares (rootless
	// Podman on cgroup v1 leaves it in its user's): a fresh sandbox has
	// used less CPU than its age on 64 CPUs, and less than 1 GiB.
	if idle.CPU > 64*time.Since(made) || idle.Memory > 1<<30 || idle.MemoryPeak > 1<<30 {
		t.Errorf("a fresh sandbox's Usage counts more than the sandbox: %+v (made %v ago)", idle, time.Since(made).Round(time.Millisecond))
	}

	// Processes: three sleepers (and their shell) while they run.
	bctx, kill := context.WithCancel(ctx)
	bg := sb.Command(bctx, "sh", "-c", "sleep 600 & sleep 600 & sleep 600 & wait")
	if err := bg.Start(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, time.Minute, func() (bool, string) {
		u := get()
		return u.Processes == 4, "Processes with a shell and three sleepers: " + strconv.Itoa(u.Processes)
	})
	kill() // the command's context ends: it is killed, every process of it
	bg.Wait()
	Eventually(t, time.Minute, func() (bool, string) {
		u := get()
		return u.Processes == 0, "Processes after the kill: " + strconv.Itoa(u.Processes)
	})

	// Memory: dd holding a buffer of 32 MiB, blocked on a pipe no one
	// reads (resident memory, so counted whether the figures are the
	// cgroup's or the processes'), then ended; the peak stays.
	mctx, endHolder := context.WithCancel(ctx)
	holder := sb.Command(mctx, "sh", "-c", `dd if=/dev/zero bs=32M count=1 2>/dev/null | sleep 600`)
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	var held sandbox.Usage
	Eventually(t, time.Minute, func() (bool, string) {
		held = get()
		return held.Memory >= idle.Memory+30<<20, "Memory with 32 MiB held: " + strconv.FormatInt(held.Memory, 10) + ", idle " + strconv.FormatInt(idle.Memory, 10)
	})
	endHolder()
	holder.Wait()
	var after sandbox.Usage
	Eventually(t, time.Minute, func() (bool, string) {
		after = get()
		return after.Memory <= held.Memory-24<<20, "Memory once the holder ended: " + strconv.FormatInt(after.Memory, 10) + ", held " + strconv.FormatInt(held.Memory, 10)
	})
	t.Logf("32 MiB held: %+v; ended: %+v", held, after)
	if after.MemoryPeak < held.Memory {
		t.Errorf("MemoryPeak once the holder ended = %d, below the %d seen", after.MemoryPeak, held.Memory)
	}

	// Disk: 16 MiB in the working directory.
	run(t, sb, "head -c 16777216 /dev/urandom > f && sync")
	if u := get(); u.DiskUsed < idle.DiskUsed+15<<20 {
		t.Errorf("DiskUsed after writing 16 MiB = %d, was %d", u.DiskUsed, idle.DiskUsed)
	}

	// CPU: a busy loop of a few hundred milliseconds.
	before := get().CPU
	run(t, sb, `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`)
	if u := get(); u.CPU < before+200*time.Millisecond {
		t.Errorf("CPU after a busy loop = %v, was %v", u.CPU, before)
	}

	// A command's own: the CPU time and peak memory of it and of what it
	// waited for (the shell's head and tr, and the shell holding 32 MiB).
	cmd := sb.Command(ctx, "sh", "-c", `x=$(head -c 33554432 /dev/zero | tr '\0' a); i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done`)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	ps := cmd.ProcessState
	t.Logf("a command: user %v, system %v, max RSS %d", ps.UserTime(), ps.SystemTime(), ps.MaxRSS())
	if ps.MaxRSS() < 32<<20 || ps.MaxRSS() > 256<<20 {
		t.Errorf("MaxRSS of a shell holding 32 MiB = %d", ps.MaxRSS())
	}
	if ps.UserTime() <= 0 || ps.SystemTime() <= 0 || ps.UserTime()+ps.SystemTime() > ps.Duration()*2 {
		t.Errorf("CPU of a command: user %v, system %v in %v", ps.UserTime(), ps.SystemTime(), ps.Duration())
	}

	// WatchUsage: readings at the interval, then the channel closes with
	// its context; an interval below the floor is refused.
	if _, err := sb.WatchUsage(ctx, time.Millisecond); err == nil {
		t.Error("WatchUsage every 1ms: no error")
	}
	wctx, stop := context.WithCancel(ctx)
	ch, err := sb.WatchUsage(wctx, sandbox.MinWatchEvery)
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for range 3 {
		u, ok := <-ch
		if !ok {
			t.Fatal("WatchUsage's channel closed early")
		}
		if !u.Time.After(last) {
			t.Errorf("readings not in order: %v after %v", u.Time, last)
		}
		last = u.Time
	}
	stop()
	for range ch { // closes
	}
	if _, err := sb.WatchUsage(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	sb.Close() // the stream of a closed sandbox ends too (the leak check sees its goroutine)
	if _, err := sb.Usage(ctx); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Usage of a closed sandbox: %v", err)
	}
}
