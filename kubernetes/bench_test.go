package kubernetes_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Benchmarks, each beside its floor in the same run:
//
//	go test -run '^$' -bench . -benchtime 5x -count 5 ./ | benchstat -
//
// NewExec: sandbox.New + Exec("true") + Close, beside BarePodAttach: a bare
// client-go pod (busybox sh, stdin) created, watched to Running, attached,
// one command echoed back, deleted. ExecTrue: Exec("true") in a running
// sandbox, beside BareExec: pods/exec of true in a running pod. PoolGet:
// Pool.Get + Exec("true") from a warm pool of b.N sandboxes. CreateRate:
// NewExec and BarePodAttach 8 and 32 at a time.

func BenchmarkNewExec(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		sb, err := sandbox.New(ctx, onCluster()...)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, "true"); err != nil {
			b.Fatal(err)
		}
		sb.Close()
	}
}

func BenchmarkBarePodAttach(b *testing.B) {
	ctx := context.Background()
	for b.Loop() {
		if err := barePodAttach(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// barePodAttach is the floor of New + first Exec: what client-go alone
// does to run one command through a fresh pod's attach stream.
func barePodAttach(ctx context.Context) error {
	var rb [6]byte
	rand.Read(rb[:])
	name := "bench-bare-" + hex.EncodeToString(rb[:])
	ns := drv.Namespace()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "c", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh"}, Stdin: true, StdinOnce: true}},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	defer cs.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: created.ResourceVersion})
	if err != nil {
		return err
	}
	for ev := range w.ResultChan() {
		if pod, ok := ev.Object.(*corev1.Pod); ok && len(pod.Status.ContainerStatuses) > 0 && pod.Status.ContainerStatuses[0].State.Running != nil {
			break
		}
	}
	w.Stop()
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "c", Stdin: true, Stdout: true}, scheme.ParameterCodec)
	ex, err := drv.Executor(req.URL().String())
	if err != nil {
		return err
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW})
		outW.Close()
	}()
	go io.WriteString(inW, "echo ok\n")
	line, err := bufio.NewReader(outR).ReadString('\n')
	inW.Close()
	<-done
	if line != "ok\n" {
		return fmt.Errorf("bare attach: %q, %v", line, err)
	}
	return nil
}

func BenchmarkExecTrue(b *testing.B) {
	ctx := context.Background()
	sb := sandboxtest.New(b, onCluster()...)
	for b.Loop() {
		if r, err := sb.Exec(ctx, "true"); err != nil || r.ExitCode != 0 {
			b.Fatal(r, err)
		}
	}
}

func BenchmarkBareExec(b *testing.B) {
	ctx := context.Background()
	sb := sandboxtest.New(b, onCluster()...)
	for b.Loop() {
		req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(drv.Namespace()).Name(sb.ID()).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "sandbox", Command: []string{"true"}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ex, err := drv.Executor(req.URL().String())
		if err != nil {
			b.Fatal(err)
		}
		if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPoolGet(b *testing.B) {
	ctx := context.Background()
	n := b.N
	pool, err := sandbox.NewPool(ctx, n, onCluster()...)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	// Let the pool fill: each Get below then takes a warm sandbox.
	var held []*sandbox.Sandbox
	for range n {
		sb, err := pool.Get(ctx)
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, sb)
	}
	for _, sb := range held {
		sb.Close()
	}
	sandboxtest.Eventually(b, 5*time.Minute, func() (bool, string) {
		st := pool.Stats()
		return st.Ready >= n, fmt.Sprintf("the pool did not refill: %+v", st)
	})
	b.ResetTimer()
	for range n {
		sb, err := pool.Get(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sb.Exec(ctx, "true"); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		sb.Close()
		b.StartTimer()
	}
}

// BenchmarkCreateRate makes, uses once and closes sandboxes conc at a
// time (New, Exec("true"), Close) beside barePodAttach doing the same
// with client-go: sandboxes per second, p50 and p99 of each. One op is
// one sandbox.
func BenchmarkCreateRate(b *testing.B) {
	for _, conc := range []int{8, 32} {
		b.Run(fmt.Sprintf("conc=%d/impl=bare-pod", conc), func(b *testing.B) {
			createRate(b, conc, barePodAttach)
		})
		b.Run(fmt.Sprintf("conc=%d/impl=library", conc), func(b *testing.B) {
			createRate(b, conc, func(ctx context.Context) error {
				sb, err := sandbox.New(ctx, onCluster()...)
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
			err := one(context.Background())
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

// A hundred sandboxes at once across both nodes: every one runs its
// command, none fails, both nodes get some, and none is left.
func TestHundred(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var mu sync.Mutex
	nodes := map[string]int{}
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(25)
	for i := range 100 {
		g.Go(func() error {
			sb, err := sandbox.New(ctx, onCluster(sandbox.WithLimits(sandbox.Limits{Memory: 64 << 20, CPUs: 0.25}))...)
			if err != nil {
				return fmt.Errorf("sandbox %d: %w", i, err)
			}
			defer sb.Close()
			r, err := sb.Exec(ctx, fmt.Sprintf("echo %d", i))
			if err != nil || r.Stdout != fmt.Sprintf("%d\n", i) {
				return fmt.Errorf("sandbox %d: %+v, %v", i, r, err)
			}
			p, err := cs.CoreV1().Pods(drv.Namespace()).Get(ctx, sb.ID(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			mu.Lock()
			nodes[p.Spec.NodeName]++
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("100 sandboxes made, used and closed in %v (25 at a time), by node: %v", time.Since(start).Round(time.Millisecond), nodes)
	if len(nodes) < 2 {
		t.Errorf("nodes used: %v, want both", nodes)
	}
}
