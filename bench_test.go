package sandbox_test

// Benchmarks of the library beside their floor: the same work done with bare
// Docker API calls in the same process and run, so that the ratio
// library ÷ floor can be quoted. Sub-benchmarks are named impl=floor,
// impl=library, ... so that benchstat can put them side by side:
//
//	go test -run '^$' -bench 'NewExecClose|ExecWarm|Files1MiB' -count 6 -benchtime 10x . > /tmp/bench.txt
//	benchstat -col /impl /tmp/bench.txt
//
// With -count, go test runs all counts of one sub-benchmark before the next,
// so on a busy machine a change of load lands on one side only. Running
// one short go test per benchmark in several rounds makes the floor and
// library blocks alternate every second or so instead:
//
//	go test -c -o /tmp/sandbox.bench .
//	for i in $(seq 10); do
//		/tmp/sandbox.bench -test.run '^$' -test.bench NewExecClose -test.benchtime 2x
//		/tmp/sandbox.bench -test.run '^$' -test.bench ExecWarm -test.benchtime 10x
//		/tmp/sandbox.bench -test.run '^$' -test.bench Files1MiB -test.benchtime 4x
//	done > /tmp/bench.txt
//
// Besides the wall-clock time, each reports cpu-ns/op: the CPU time this
// process (the client side) spent per operation, which hardly depends on
// the machine's load.
//
// Every floor object carries the library's labels for this process (kind
// "bench"), so the suite's leak check sees anything left behind, and is
// removed when its benchmark ends.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// cpuTime returns the CPU time (user + system) this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time this process spent per iteration since
// start: the client side's own cost, which unlike the wall-clock time hardly
// depends on how busy the engine and the machine are.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// benchClient returns a Docker client closed when the benchmark ends.
func benchClient(b *testing.B) *client.Client {
	b.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// floorConfigOf is a bare container of image img roughly as limited as a sandbox (memory
// without swap, pids, CPU, no network, no capabilities, an init), running
// sleep. Its root filesystem is writable and it has no volume, tmpfs,
// attach stream or agent.
func floorConfigOf(img string) (*container.Config, *container.HostConfig) {
	init := true
	pids := int64(256)
	cc := &container.Config{
		Image:  img,
		Cmd:    []string{"sleep", "3600"},
		User:   "1000:1000",
		Labels: owner.Labels("bench", nil),
	}
	hc := &container.HostConfig{
		Init:        &init,
		NetworkMode: "none",
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges:true"},
		LogConfig:   container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     512 << 20,
			MemorySwap: 512 << 20,
			NanoCPUs:   1e9,
			PidsLimit:  &pids,
		},
	}
	return cc, hc
}

// floorStart creates and starts a bare container and returns its ID.
func floorStart(ctx context.Context, cli *client.Client) (string, error) {
	return floorStartOf(ctx, cli, busyboxImage)
}

// floorStartOf is floorStart for another image.
func floorStartOf(ctx context.Context, cli *client.Client, img string) (string, error) {
	cc, hc := floorConfigOf(img)
	created, err := cli.ContainerCreate(ctx, cc, hc, nil, nil, "")
	if err != nil {
		return "", err
	}
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		floorRemove(cli, created.ID)
		return "", err
	}
	return created.ID, nil
}

// floorRemove force-removes a bare container.
func floorRemove(cli *client.Client, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
}

// warmFloor returns a started bare container removed when the benchmark
// ends.
func warmFloor(b *testing.B, cli *client.Client) string {
	b.Helper()
	return warmFloorOf(b, cli, busyboxImage)
}

// warmFloorOf is warmFloor for another image.
func warmFloorOf(b *testing.B, cli *client.Client, img string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := floorStartOf(ctx, cli, img)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := floorRemove(cli, id); err != nil {
			b.Errorf("remove floor container: %v", err)
		}
	})
	return id
}

// floorExec runs `true` in container id the way any Go program would:
// create, attach, drain both streams to EOF, then inspect for the exit code
// (again while the engine has not yet recorded it). It returns how many
// inspects that took.
func floorExec(ctx context.Context, cli *client.Client, id string) (int, error) {
	return floorExecCmd(ctx, cli, id, "true")
}

// floorExecCmd is floorExec for any command.
func floorExecCmd(ctx context.Context, cli *client.Client, id string, cmd ...string) (int, error) {
	created, err := cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		User: "1000:1000", AttachStdout: true, AttachStderr: true, Cmd: cmd,
	})
	if err != nil {
		return 0, err
	}
	h, err := cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return 0, err
	}
	_, err = stdcopy.StdCopy(io.Discard, io.Discard, h.Reader)
	h.Close()
	if err != nil {
		return 0, err
	}
	for n := 1; ; n++ {
		info, err := cli.ContainerExecInspect(ctx, created.ID)
		if err != nil {
			return n, err
		}
		if !info.Running {
			if info.ExitCode != 0 {
				return n, fmt.Errorf("floor exec: exit code %d", info.ExitCode)
			}
			return n, nil
		}
	}
}

// mustTrue runs `true` through Exec and fails the benchmark unless it exits
// 0.
func mustTrue(b *testing.B, ctx context.Context, sb *sandbox.Sandbox) {
	r, err := sb.Exec(ctx, "true")
	if err != nil {
		b.Fatal(err)
	}
	if r.ExitCode != 0 {
		b.Fatalf("exit code %d, stderr %q", r.ExitCode, r.Stderr)
	}
}

// BenchmarkNewExecClose measures a sandbox's whole life: New, one Exec of
// `true`, Close. The floor creates, starts, execs in and removes a bare
// container. impl=library-nodisk is the library without the loop-mounted
// ext4 working directory (Limits.Disk < 0: a plain volume), to show what
// the disk limit costs.
func BenchmarkNewExecClose(b *testing.B) {
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			id, err := floorStart(ctx, cli)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := floorExec(ctx, cli, id); err != nil {
				floorRemove(cli, id)
				b.Fatal(err)
			}
			if err := floorRemove(cli, id); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	lib := func(opts ...sandbox.Option) func(b *testing.B) {
		return func(b *testing.B) {
			ctx := b.Context()
			opts := append([]sandbox.Option{sandbox.WithImage(busyboxImage)}, opts...)
			cpu := cpuTime()
			for b.Loop() {
				sb, err := sandbox.New(ctx, opts...)
				if err != nil {
					b.Fatal(err)
				}
				mustTrue(b, ctx, sb)
				if err := sb.Close(); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		}
	}
	b.Run("impl=library", lib())
	b.Run("impl=library-nodisk", lib(sandbox.WithLimits(sandbox.Limits{Disk: -1})))
	// Pool.Get and the first Exec, timed; the Close (and the pool's refill
	// in the background) are not: what an episode waits for.
	b.Run("impl=library-pool-get-exec", func(b *testing.B) {
		ctx := b.Context()
		pool, err := sandbox.NewPool(ctx, 4, sandbox.WithImage(busyboxImage))
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		for range 4 { // let it fill once before timing
			sb, err := pool.Get(ctx)
			if err != nil {
				b.Fatal(err)
			}
			sb.Close()
		}
		waitPool(b, pool, 4)
		cpu := cpuTime()
		b.ResetTimer()
		for b.Loop() {
			sb, err := pool.Get(ctx)
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, sb)
			b.StopTimer()
			sb.Close()
			waitPool(b, pool, 4)
			b.StartTimer()
		}
		reportCPU(b, cpu)
	})
}

// BenchmarkExecWarm measures one command, `true`, in a running sandbox:
// Exec (sh -c behind the pid wrapper, output captured), Command.Run, and
// the floor's bare exec create/attach/drain/inspect.
func BenchmarkExecWarm(b *testing.B) {
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		id := warmFloor(b, cli)
		ctx := b.Context()
		inspects := 0
		cpu := cpuTime()
		for b.Loop() {
			n, err := floorExec(ctx, cli, id)
			if err != nil {
				b.Fatal(err)
			}
			inspects += n
		}
		reportCPU(b, cpu)
		b.ReportMetric(float64(inspects)/float64(b.N), "inspects/op")
	})
	b.Run("impl=library", func(b *testing.B) {
		sb := newSandbox(b)
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			mustTrue(b, ctx, sb)
		}
		reportCPU(b, cpu)
	})
	// The same with the activity record: its cost is the difference.
	b.Run("impl=library-activity", func(b *testing.B) {
		sb := newSandbox(b, sandbox.WithActivity(true))
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			mustTrue(b, ctx, sb)
		}
		reportCPU(b, cpu)
	})
	b.Run("impl=library-cmd", func(b *testing.B) {
		sb := newSandbox(b)
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			if err := sb.Command(ctx, "true").Run(); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	// The command's own cost, the floor under any way of running it:
	// sh -c true started by a shell loop inside the sandbox (ns/op is per
	// command; an op runs 50).
	for _, on := range []bool{true, false} {
		name := "impl=inside-activity"
		if !on {
			name = "impl=inside"
		}
		b.Run(name, func(b *testing.B) { benchInside(b, sandbox.WithActivity(on)) })
	}
}

// BenchmarkActivityFiles measures what the activity record adds to a
// file change: a shell loop inside the sandbox creating files (ns/op is
// per file), with and without the record (the floor).
func BenchmarkActivityFiles(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("activity=%v", on), func(b *testing.B) {
			sb := newSandbox(b, sandbox.WithActivity(on))
			ctx := b.Context()
			const per = 500
			var took time.Duration
			for b.Loop() {
				r, err := sb.Exec(ctx, fmt.Sprintf("mkdir d && cd d && i=0; while [ $i -lt %d ]; do : > f$i; i=$((i+1)); done", per))
				if err != nil || r.ExitCode != 0 {
					b.Fatal(r, err)
				}
				if on && (r.Activity == nil || len(r.Activity.Files) != per+1) {
					b.Fatalf("%d file changes recorded, want %d", len(r.Activity.Files), per+1)
				}
				took += r.Duration
				if _, err := sb.Exec(ctx, "rm -r d"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*per), "ns/op")
		})
	}
}

// benchInside is BenchmarkExecWarm's impl=inside: sh -c true started by a
// shell loop inside the sandbox (ns/op is per command).
func benchInside(b *testing.B, opts ...sandbox.Option) {
	sb := newSandbox(b, opts...)
	ctx := b.Context()
	const per = 50
	var took time.Duration
	for b.Loop() {
		r, err := sb.Exec(ctx, fmt.Sprintf("i=0; while [ $i -lt %d ]; do sh -c true; i=$((i+1)); done", per))
		if err != nil || r.ExitCode != 0 {
			b.Fatal(r, err)
		}
		took += r.Duration
	}
	b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*per), "ns/op")
}

// BenchmarkFiles1MiB measures writing a 1 MiB file and reading it back.
// The library writes into its working directory (the ext4 volume); the
// floor copies a tar holding the file into /tmp of a bare container with a
// writable root filesystem and copies it out again. Both check the bytes.
func BenchmarkFiles1MiB(b *testing.B) {
	data := make([]byte, 1<<20)
	rand.Read(data)
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		id := warmFloor(b, cli)
		ctx := b.Context()
		b.SetBytes(2 * int64(len(data)))
		cpu := cpuTime()
		for b.Loop() {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			if err := tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeReg, Name: "bench.bin", Size: int64(len(data)), Mode: 0o644,
				Uid: 1000, Gid: 1000, ModTime: time.Now(),
			}); err != nil {
				b.Fatal(err)
			}
			tw.Write(data)
			if err := tw.Close(); err != nil {
				b.Fatal(err)
			}
			if err := cli.CopyToContainer(ctx, id, "/tmp", &buf, container.CopyToContainerOptions{}); err != nil {
				b.Fatal(err)
			}
			rc, _, err := cli.CopyFromContainer(ctx, id, "/tmp/bench.bin")
			if err != nil {
				b.Fatal(err)
			}
			tr := tar.NewReader(rc)
			if _, err := tr.Next(); err != nil {
				b.Fatal(err)
			}
			got, err := io.ReadAll(tr)
			rc.Close()
			if err != nil {
				b.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				b.Fatalf("read back %d bytes, not the %d written", len(got), len(data))
			}
		}
		reportCPU(b, cpu)
	})
	b.Run("impl=library", func(b *testing.B) {
		sb := newSandbox(b)
		ctx := b.Context()
		b.SetBytes(2 * int64(len(data)))
		cpu := cpuTime()
		for b.Loop() {
			if err := sb.WriteFile(ctx, "bench.bin", data, 0o644); err != nil {
				b.Fatal(err)
			}
			got, err := sb.ReadFile(ctx, "bench.bin")
			if err != nil {
				b.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				b.Fatalf("read back %d bytes, not the %d written", len(got), len(data))
			}
		}
		reportCPU(b, cpu)
	})
}

// benchPayload is what the snapshot benchmarks' sources hold: 64 KiB.
var benchPayload = bytes.Repeat([]byte("snapshot benchmark payload\n"), 64<<10/27)

// closeAll closes sandboxes concurrently (outside the timed part).
func closeAll(b *testing.B, sbs []*sandbox.Sandbox) {
	b.Helper()
	errs := make(chan error, len(sbs))
	for _, sb := range sbs {
		go func() { errs <- sb.Close() }()
	}
	for range sbs {
		if err := <-errs; err != nil {
			b.Error(err)
		}
	}
}

// benchSnapshot returns a snapshot of a busybox sandbox holding
// benchPayload, removed (after the source is closed) when the benchmark
// ends.
func benchSnapshot(b *testing.B) *sandbox.Snapshot {
	b.Helper()
	sb := newSandbox(b)
	if err := sb.WriteFile(b.Context(), "payload", benchPayload, 0o644); err != nil {
		b.Fatal(err)
	}
	sn, err := sb.Snapshot(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := sn.Remove(context.Background()); err != nil {
			b.Error(err)
		}
	})
	return sn
}

// BenchmarkSnapshot measures taking a snapshot of a running sandbox whose
// working directory holds 64 KiB. The floor is a bare docker commit
// (paused, like docker commit's default) of a running container holding
// the same file in its writable layer. The images are removed outside the
// timed part.
func BenchmarkSnapshot(b *testing.B) {
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		id := warmFloor(b, cli)
		ctx := b.Context()
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "payload", Size: int64(len(benchPayload)), Mode: 0o644, Uid: 1000, Gid: 1000})
		tw.Write(benchPayload)
		tw.Close()
		if err := cli.CopyToContainer(ctx, id, "/tmp", &buf, container.CopyToContainerOptions{}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			img, err := cli.ContainerCommit(ctx, id, container.CommitOptions{Pause: true})
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if _, err := cli.ImageRemove(ctx, img.ID, image.RemoveOptions{}); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	for _, image := range []bool{false, true} {
		name := "impl=library"
		if image {
			name = "impl=library-image" // and its image on the engine (Snapshot.Image)
		}
		b.Run(name, func(b *testing.B) {
			sb := newSandbox(b)
			ctx := b.Context()
			if err := sb.WriteFile(ctx, "payload", benchPayload, 0o644); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				sn, err := sb.Snapshot(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if image {
					if _, err := sn.Image(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if err := sn.Remove(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// benchPool returns a pool of n busybox sandboxes (the settings of
// benchSnapshot's source), full, closed when the benchmark ends.
func benchPool(b *testing.B, n int, opts ...sandbox.Option) *sandbox.Pool {
	b.Helper()
	p, err := sandbox.NewPool(b.Context(), n, append([]sandbox.Option{sandbox.WithImage(busyboxImage)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	waitPool(b, p, n)
	return p
}

// waitPool waits until p holds n ready sandboxes (outside the timed part:
// a warm pool is the premise of what is measured).
func waitPool(b *testing.B, p *sandbox.Pool, n int) {
	b.Helper()
	sandboxtest.Eventually(b, 5*time.Minute, func() (bool, string) {
		st := p.Stats()
		return st.Ready >= n, fmt.Sprintf("the pool did not fill: %+v", st)
	})
}

// BenchmarkFork8 measures starting eight sandboxes: Fork(8) of a snapshot
// (at most 8 at a time, each restoring 64 KiB), eight sandbox.New of the
// busybox image one after the other, and the floor, eight bare containers
// created and started one after the other. Closing is not timed. The
// ratio library-fork8 ÷ library-new8 is what Fork's concurrency buys.
func BenchmarkFork8(b *testing.B) {
	const n = 8
	b.Run("impl=floor-new8", func(b *testing.B) {
		cli := benchClient(b)
		ctx := b.Context()
		for b.Loop() {
			ids := make([]string, 0, n)
			for range n {
				id, err := floorStart(ctx, cli)
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, id)
			}
			b.StopTimer()
			for _, id := range ids {
				if err := floorRemove(cli, id); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
		}
	})
	b.Run("impl=library-new8", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			sbs := make([]*sandbox.Sandbox, 0, n)
			for range n {
				sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
				if err != nil {
					closeAll(b, sbs)
					b.Fatal(err)
				}
				sbs = append(sbs, sb)
			}
			b.StopTimer()
			closeAll(b, sbs)
			b.StartTimer()
		}
	})
	b.Run("impl=library-fork8", func(b *testing.B) {
		sn := benchSnapshot(b)
		ctx := b.Context()
		for b.Loop() {
			sbs, err := sn.Fork(ctx, n)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			closeAll(b, sbs)
			b.StartTimer()
		}
	})
	b.Run("impl=library-fork8-pool", func(b *testing.B) {
		sn := benchSnapshot(b)
		pool := benchPool(b, n)
		ctx := b.Context()
		for b.Loop() {
			sbs, err := sn.Fork(ctx, n, sandbox.WithPool(pool))
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			closeAll(b, sbs)
			waitPool(b, pool, n)
			b.StartTimer()
		}
	})
}

// BenchmarkRestoreExec measures a sandbox's first command: restoring one
// from a snapshot (64 KiB in its working directory) and running `true`,
// against sandbox.New and `true`, and the floor's bare create, start and
// exec. Closing is not timed.
func BenchmarkRestoreExec(b *testing.B) {
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		ctx := b.Context()
		for b.Loop() {
			id, err := floorStart(ctx, cli)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := floorExec(ctx, cli, id); err != nil {
				floorRemove(cli, id)
				b.Fatal(err)
			}
			b.StopTimer()
			if err := floorRemove(cli, id); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
	b.Run("impl=library-new", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, sb)
			b.StopTimer()
			closeAll(b, []*sandbox.Sandbox{sb})
			b.StartTimer()
		}
	})
	b.Run("impl=library-restore", func(b *testing.B) {
		sn := benchSnapshot(b)
		ctx := b.Context()
		for b.Loop() {
			sb, err := sn.New(ctx)
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, sb)
			b.StopTimer()
			closeAll(b, []*sandbox.Sandbox{sb})
			b.StartTimer()
		}
	})
	b.Run("impl=library-restore-pool", func(b *testing.B) {
		sn := benchSnapshot(b)
		pool := benchPool(b, 1)
		ctx := b.Context()
		for b.Loop() {
			sb, err := sn.New(ctx, sandbox.WithPool(pool))
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, sb)
			b.StopTimer()
			closeAll(b, []*sandbox.Sandbox{sb})
			waitPool(b, pool, 1)
			b.StartTimer()
		}
	})
}

// BenchmarkSnapshotSize measures how snapshots grow with the working
// directory (one file of random bytes, 1, 16 and 256 MiB), in MB/s of
// the file: taking a snapshot, restoring it into a warm pool's sandbox,
// and the floor, cat of the same file through a command's output stream
// (what any copy out of the sandbox through its agent costs).
func BenchmarkSnapshotSize(b *testing.B) {
	for _, mib := range []int{1, 16, 256} {
		size := int64(mib) << 20
		limits := sandbox.WithLimits(sandbox.Limits{Disk: 4 * size})
		source := func(b *testing.B) *sandbox.Sandbox {
			sb := newSandbox(b, limits)
			cmd := fmt.Sprintf("head -c %d /dev/urandom > payload", size)
			if r, err := sb.Exec(b.Context(), cmd); err != nil || r.ExitCode != 0 {
				b.Fatalf("%s: %v %+v", cmd, err, r)
			}
			return sb
		}
		b.Run(fmt.Sprintf("size=%dMiB/impl=floor-cat", mib), func(b *testing.B) {
			sb := source(b)
			ctx := b.Context()
			b.SetBytes(size)
			for b.Loop() {
				var n countBytes
				cmd := sb.Command(ctx, "cat", "payload")
				cmd.Stdout = &n
				if err := cmd.Run(); err != nil || int64(n) != size {
					b.Fatalf("cat: %v, %d bytes", err, n)
				}
			}
		})
		b.Run(fmt.Sprintf("size=%dMiB/impl=library-snapshot", mib), func(b *testing.B) {
			sb := source(b)
			ctx := b.Context()
			b.SetBytes(size)
			for b.Loop() {
				sn, err := sb.Snapshot(ctx)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sn.Remove(ctx)
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("size=%dMiB/impl=library-restore-pool", mib), func(b *testing.B) {
			sb := source(b)
			ctx := b.Context()
			sn, err := sb.Snapshot(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { sn.Remove(context.Background()) })
			pool := benchPool(b, 1, limits)
			b.SetBytes(size)
			for b.Loop() {
				r, err := sn.New(ctx, sandbox.WithPool(pool))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				closeAll(b, []*sandbox.Sandbox{r})
				waitPool(b, pool, 1)
				b.StartTimer()
			}
		})
	}
}

// countBytes counts what is written to it.
type countBytes int64

func (c *countBytes) Write(p []byte) (int, error) {
	*c += countBytes(len(p))
	return len(p), nil
}

// BenchmarkPythonRun measures one round trip of Python code: "1+1" and its
// value. The floor is what one-shot execution costs: docker exec of
// python3 -c in a bare container of the same image; impl=library-exec is
// the library's Exec of the same; impl=library-interpreter is Run on a
// warm Interpreter, which keeps its process (and imports) between runs.
func BenchmarkPythonRun(b *testing.B) {
	b.Run("impl=floor", func(b *testing.B) {
		cli := benchClient(b)
		id := warmFloorOf(b, cli, pythonImage)
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			if _, err := floorExecCmd(ctx, cli, id, "python3", "-c", "print(1+1)"); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	b.Run("impl=library-exec", func(b *testing.B) {
		sb := newPython(b)
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			r, err := sb.Exec(ctx, "python3 -c 'print(1+1)'")
			if err != nil || r.Stdout != "2\n" {
				b.Fatalf("%v %+v", err, r)
			}
		}
		reportCPU(b, cpu)
	})
	b.Run("impl=library-interpreter", func(b *testing.B) {
		sb := newPython(b)
		ctx := b.Context()
		py, err := sb.Interpreter(ctx, "python")
		if err != nil {
			b.Fatal(err)
		}
		defer py.Close()
		cpu := cpuTime()
		for b.Loop() {
			ex, err := py.Run(ctx, "1+1")
			if err != nil || len(ex.Outputs) != 1 || string(ex.Outputs[0].Data) != "2" {
				b.Fatalf("%v %+v", err, ex)
			}
		}
		reportCPU(b, cpu)
	})
}

// BenchmarkInterpreterStart measures starting a Python interpreter (the
// driver ready for its first run) and closing it, beside starting python3
// once with Exec.
func BenchmarkInterpreterStart(b *testing.B) {
	sb := newPython(b)
	b.Run("impl=library-exec", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			if r, err := sb.Exec(ctx, "python3 -c pass"); err != nil || r.ExitCode != 0 {
				b.Fatalf("%v %+v", err, r)
			}
		}
	})
	b.Run("impl=library-interpreter", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			py, err := sb.Interpreter(ctx, "python")
			if err != nil {
				b.Fatal(err)
			}
			py.Close()
		}
	})
}
