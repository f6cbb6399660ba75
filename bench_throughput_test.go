package sandbox_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"golang.org/x/sync/errgroup"

	"github.com/agentsandbox/sandbox"
)

// BenchmarkExecThroughput measures saturated Exec throughput: 50 sandboxes
// of the Python (Debian) image each run Exec("echo hi") ten times in a row,
// all 50 at once, 500 commands an op. The floor is the machine's own: the
// same 500 `sh -c 'echo hi'` started by this process with os/exec, 50 at
// a time. Metrics: execs/s (the throughput), p50-ms and p99-ms (one
// command's latency), and for the library the CPU each Exec costs each
// process involved, from /proc/PID/stat: agent-ms (every sandbox's agent,
// not the commands it runs), lib-ms (this process), dockerd-ms, shim-ms
// (containerd-shim) and fuse-ms (fuse-overlayfs, where the engine uses
// it). Compare with benchstat -col /impl.
func BenchmarkExecThroughput(b *testing.B) {
	const sandboxes, each = 50, 10
	b.Run("impl=host", func(b *testing.B) {
		var lat []time.Duration
		for b.Loop() {
			lat = append(lat, throughputRound(b, sandboxes, each, func(context.Context, int) error {
				out, err := exec.Command("sh", "-c", "echo hi").Output()
				if err == nil && string(out) != "hi\n" {
					b.Fatalf("output %q", out)
				}
				return err
			})...)
		}
		reportThroughput(b, lat)
	})
	b.Run("impl=library", func(b *testing.B) {
		sbs := make([]*sandbox.Sandbox, sandboxes)
		var g errgroup.Group
		g.SetLimit(8)
		for i := range sbs {
			g.Go(func() error {
				sb, err := sandbox.New(b.Context(), sandbox.WithImage(pythonImage), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
				sbs[i] = sb
				return err
			})
		}
		err := g.Wait()
		defer closeAll(b, sbs)
		if err != nil {
			b.Fatal(err)
		}
		before := processCPU()
		var lat []time.Duration
		for b.Loop() {
			lat = append(lat, throughputRound(b, sandboxes, each, func(ctx context.Context, i int) error {
				r, err := sbs[i].Exec(ctx, "echo hi")
				if err == nil && (r.ExitCode != 0 || r.Stdout != "hi\n") {
					b.Fatalf("Exec: %+v", r)
				}
				return err
			})...)
		}
		b.StopTimer()
		used := cpuSince(before, processCPU())
		execs := float64(len(lat))
		for _, p := range []string{"agent", "lib", "dockerd", "shim", "fuse"} {
			b.ReportMetric(float64(used[p])/execs/float64(time.Millisecond), p+"-ms")
		}
		reportThroughput(b, lat)
	})
}

// throughputRound runs run(ctx, i) each times in a row for every i below
// n, all n at once, and returns every call's latency.
func throughputRound(b *testing.B, n, each int, run func(ctx context.Context, i int) error) []time.Duration {
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n*each)
	var g errgroup.Group
	for i := range n {
		g.Go(func() error {
			for range each {
				t0 := time.Now()
				if err := run(b.Context(), i); err != nil {
					return err
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	return lat
}

// reportThroughput reports commands per second and latency percentiles.
func reportThroughput(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "execs/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// procCPU is a process's name (see processCPU) and the CPU time it has
// used so far.
type procCPU struct {
	name string
	used time.Duration
}

// processCPU returns the CPU time (user + system) used so far by the
// processes an Exec goes through, by PID: every sandbox agent ("agent"),
// this process ("lib"), dockerd, the containerd shims ("shim") and
// fuse-overlayfs ("fuse"). A process's children's time is not counted.
func processCPU() map[int]procCPU {
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	out := map[int]procCPU{}
	self := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15.
		s := string(b)
		open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || close < open {
			continue
		}
		comm, f := s[open+1:close], strings.Fields(s[close+1:])
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		name := map[string]string{"agent": "agent", "dockerd": "dockerd", "containerd-shim": "shim", "fuse-overlayfs": "fuse"}[comm]
		if pid == self {
			name = "lib"
		}
		if name != "" {
			out[pid] = procCPU{name, time.Duration(ut+st) * tick}
		}
	}
	return out
}

// cpuSince sums by name the CPU time processes used between two
// processCPU snapshots, counting only processes in both (one that ended
// or started meanwhile, such as another test's sandbox, is left out).
func cpuSince(before, after map[int]procCPU) map[string]time.Duration {
	sum := map[string]time.Duration{}
	for pid, a := range after {
		if b, ok := before[pid]; ok && b.name == a.name {
			sum[a.name] += a.used - b.used
		}
	}
	return sum
}

// BenchmarkRelayEcho is the floor of the engine's relay, which every frame
// between the library and a sandbox's agent crosses (dockerd and the
// container's shim, both ways): a bare container whose main process is
// cat, attached as a sandbox's agent is, echoes 64 bytes (a frame's size
// for a short command) per op. A warm Exec is one such round trip (its
// request, then its answer in one batch) plus the command itself. Metrics:
// the round trip's time and the CPU dockerd and the shim spend on it.
func BenchmarkRelayEcho(b *testing.B) {
	cli := benchClient(b)
	ctx := b.Context()
	cc, hc := floorConfigOf(busyboxImage)
	cc.Cmd = []string{"cat"}
	cc.AttachStdin, cc.AttachStdout, cc.AttachStderr, cc.OpenStdin, cc.StdinOnce = true, true, true, true, true
	hc.LogConfig = container.LogConfig{Type: "none"}
	created, err := cli.ContainerCreate(ctx, cc, hc, nil, nil, "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { floorRemove(cli, created.ID) })
	h, err := cli.ContainerAttach(ctx, created.ID, container.AttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		b.Fatal(err)
	}
	msg := bytes.Repeat([]byte("x"), 63)
	msg = append(msg, '\n')
	hdr := make([]byte, 8)
	got := make([]byte, len(msg))
	echo := func() {
		if _, err := h.Conn.Write(msg); err != nil {
			b.Fatal(err)
		}
		// One multiplexed frame: 8-byte header, then the bytes.
		for n := 0; n < len(msg); {
			if _, err := io.ReadFull(h.Reader, hdr); err != nil {
				b.Fatal(err)
			}
			size := int(binary.BigEndian.Uint32(hdr[4:]))
			if _, err := io.ReadFull(h.Reader, got[n:n+size]); err != nil {
				b.Fatal(err)
			}
			n += size
		}
	}
	for range 10 {
		echo()
	}
	before := processCPU()
	for b.Loop() {
		echo()
	}
	used := cpuSince(before, processCPU())
	for _, p := range []string{"lib", "dockerd", "shim"} {
		b.ReportMetric(float64(used[p])/float64(b.N)/float64(time.Millisecond), p+"-ms")
	}
}

// BenchmarkCreateRate makes and closes sandboxes conc at a time — New,
// one Exec("true"), Close — beside the bare engine API doing the same with
// the same image (create, start, one exec, remove): sandboxes per second,
// and each one's time from New to the end of its Close (p50, p99). One op
// is one sandbox.
func BenchmarkCreateRate(b *testing.B) {
	for _, conc := range []int{8, 32} {
		b.Run(fmt.Sprintf("conc=%d/impl=floor", conc), func(b *testing.B) {
			cli := benchClient(b)
			createRate(b, conc, func(ctx context.Context) error {
				id, err := floorStart(ctx, cli)
				if err != nil {
					return err
				}
				if _, err := floorExec(ctx, cli, id); err != nil {
					floorRemove(cli, id)
					return err
				}
				return floorRemove(cli, id)
			})
		})
		b.Run(fmt.Sprintf("conc=%d/impl=library", conc), func(b *testing.B) {
			createRate(b, conc, func(ctx context.Context) error {
				sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
				if err != nil {
					return err
				}
				if r, err := sb.Exec(ctx, "true"); err != nil || r.ExitCode != 0 {
					sb.Close()
					return fmt.Errorf("Exec(true): %+v, %v", r, err)
				}
				return sb.Close()
			})
		})
	}
}

// createRate runs one b.N times, conc at a time, and reports the rate and
// the latency of each.
func createRate(b *testing.B, conc int, one func(ctx context.Context) error) {
	var mu sync.Mutex
	var lat []time.Duration
	var g errgroup.Group
	g.SetLimit(conc)
	b.ResetTimer()
	start := time.Now()
	for range b.N { // not b.Loop: its end would stop the timer before the last ones end
		g.Go(func() error {
			t0 := time.Now()
			err := one(b.Context())
			mu.Lock()
			lat = append(lat, time.Since(t0))
			mu.Unlock()
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(len(lat))/time.Since(start).Seconds(), "sandboxes/s")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Millisecond), "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/float64(time.Millisecond), "p99-ms")
}
