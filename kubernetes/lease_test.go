package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/kubernetes"
)

// randHex is 12 random hex digits.
func randHex() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// unique is a label value no other test run uses.
func unique(t *testing.T) string {
	return strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + randHex()
}

// List finds another tethered sandbox by its labels, as made: its ID, the
// image as given, its labels, running, no lease. Open refuses it
// (ErrNotLeased) and leaves it working; Open of an ID no sandbox has, or
// that no pod can have, matches fs.ErrNotExist.
func TestListOpenTethered(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	labels := map[string]string{"test": unique(t), "team": "rl"}
	sb := newSandbox(t, sandbox.WithLabels(labels))
	before := time.Now()

	infos, err := drv.List(ctx, map[string]string{"test": labels["test"]})
	if err != nil || len(infos) != 1 {
		t.Fatalf("List by the sandbox's label: %+v, %v; want it alone", infos, err)
	}
	info := infos[0]
	if info.ID != sb.ID() || info.Image != busyboxImage || !maps.Equal(info.Labels, labels) ||
		info.Lease != 0 || !info.Running || info.Created.IsZero() || info.Created.After(before) {
		t.Errorf("List: %+v; want ID %s, image %s, labels %v, no lease, running, created before %v",
			info, sb.ID(), busyboxImage, labels, before)
	}
	if infos, err := drv.List(ctx, map[string]string{"test": labels["test"], "team": "other"}); err != nil || len(infos) != 0 {
		t.Errorf("List by a label the sandbox has with another value: %+v, %v; want none", infos, err)
	}
	all, err := drv.List(ctx, nil)
	if err != nil || !containsID(all, sb.ID()) {
		t.Errorf("List of all: %d sandboxes, %v; want %s among them", len(all), err, sb.ID())
	}

	in, _, err := drv.Open(ctx, sb.ID(), driver.OpenOptions{})
	if !errors.Is(err, driver.ErrNotLeased) || errors.Is(err, fs.ErrNotExist) || in != nil {
		t.Errorf("Open of a tethered sandbox: %v, %v; want ErrNotLeased", in, err)
	}
	if r, err := sb.Exec(ctx, "echo ok"); err != nil || r.Stdout != "ok\n" {
		t.Errorf("Exec after Open refused: %+v, %v; want the sandbox unharmed", r, err)
	}
	for _, id := range []string{"agentsandbox-000000000000", "", "Not/A-Pod"} {
		if _, _, err := drv.Open(ctx, id, driver.OpenOptions{}); !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("Open(%q): %v; want ErrNotFound, fs.ErrNotExist", id, err)
		}
	}
}

func containsID(infos []driver.InstanceInfo, id string) bool {
	for _, i := range infos {
		if i.ID == id {
			return true
		}
	}
	return false
}

// deadOwner is an owner ID of a process of this host that has ended: this
// process's pid with another start time.
func deadOwner(t *testing.T) string {
	f := strings.Split(owner.ID(), "/")
	start, _ := strconv.ParseUint(f[3], 10, 64)
	dead := strings.Join(append(f[:3:3], strconv.FormatUint(start+1, 10)), "/")
	if !owner.Dead(dead) {
		t.Fatalf("owner.Dead(%q) is false: no dead owner to fake", dead)
	}
	return dead
}

// fakePod makes a pod that looks like a sandbox's to Prune, List and Open
// (the library's labels, an owner) but runs busybox's command, and
// removes it at the end of the test. lease "" is a tethered one.
func fakePod(t *testing.T, ownerID, lease, image string, labels map[string]string, command ...string) string {
	t.Helper()
	l := owner.Labels("sandbox", labels)
	delete(l, owner.LabelOwner)
	if lease != "" {
		l[owner.LabelLease] = lease
	}
	name := "agentsandbox-fake-" + randHex()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l,
			Annotations: map[string]string{owner.LabelOwner: ownerID, owner.LabelImage: image}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "sandbox", Image: image, ImagePullPolicy: corev1.PullNever, Command: command,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				}}},
		},
	}
	ctx := ctxFor(t)
	if _, err := cs.CoreV1().Pods(drv.Namespace()).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods(drv.Namespace()).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	return name
}

// waitPod waits until pod name is in a state ok accepts.
func waitPod(t *testing.T, name, want string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx := ctxFor(t)
	for {
		p, err := cs.CoreV1().Pods(drv.Namespace()).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if ok(p) {
			return p
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s: not %s (phase %s): %v", name, want, p.Status.Phase, ctx.Err())
		case <-time.After(200 * time.Millisecond): // polling the API server
		}
	}
}

func phase(ph corev1.PodPhase) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return p.Status.Phase == ph }
}

// Prune never removes a running leased pod, even one whose owner is dead;
// it removes an ended leased pod whoever made it, a leased pod still
// starting whose owner is dead (its Create never returned), and a
// tethered pod whose owner is dead, as before. List and Open see the
// ended leased pod until then: not running, its lease, ErrGone. Open of a
// pod the library did not make matches fs.ErrNotExist. The pods are fakes
// (busybox as the sandbox's container, the library's labels, a dead owner).
// Not parallel: another test's Prune would remove the ended pods under it.
func TestPruneLeased(t *testing.T) {
	ctx := ctxFor(t)
	dead := deadOwner(t)
	labels := map[string]string{"test": unique(t)}
	running := fakePod(t, dead, "1m0s", busyboxImage, labels, "sleep", "3600")
	ended := fakePod(t, owner.ID(), "30s", busyboxImage, labels, "true")
	starting := fakePod(t, dead, "1m0s", "agentsandbox.dev/no-such-image:1", labels, "true")
	tethered := fakePod(t, dead, "", busyboxImage, labels, "sleep", "3600")
	waitPod(t, running, "running", phase(corev1.PodRunning))
	waitPod(t, ended, "succeeded", phase(corev1.PodSucceeded))
	waitPod(t, starting, "waiting for its image", func(p *corev1.Pod) bool {
		for _, st := range p.Status.ContainerStatuses {
			if w := st.State.Waiting; w != nil && w.Reason == "ErrImageNeverPull" {
				return true
			}
		}
		return false
	})

	infos, err := drv.List(ctx, labels)
	if err != nil || len(infos) != 4 {
		t.Fatalf("List: %+v, %v; want the 4 pods", infos, err)
	}
	for _, info := range infos {
		switch info.ID {
		case ended:
			if info.Running || info.Lease != 30*time.Second || info.Image != busyboxImage {
				t.Errorf("List of an ended leased pod: %+v; want not running, lease 30s, image %s", info, busyboxImage)
			}
		case running:
			if !info.Running || info.Lease != time.Minute {
				t.Errorf("List of a running leased pod: %+v; want running, lease 1m", info)
			}
		}
	}
	if _, info, err := drv.Open(ctx, ended, driver.OpenOptions{}); !errors.Is(err, driver.ErrGone) || info.ID != ended {
		t.Errorf("Open of an ended leased pod: %+v, %v; want ErrGone and its description", info, err)
	}

	other := "agentsandbox-other-" + randHex()
	_, err = cs.CoreV1().Pods(drv.Namespace()).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: other, Labels: map[string]string{owner.LabelLease: "1m0s"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: busyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"sleep", "3600"}}}, TerminationGracePeriodSeconds: ptr.To(int64(0))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().Pods(drv.Namespace()).Delete(context.Background(), other, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	})
	if _, _, err := drv.Open(ctx, other, driver.OpenOptions{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a pod the library did not make: %v; want fs.ErrNotExist", err)
	}

	if _, err := drv.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, what string
		kept       bool
	}{
		{running, "a running leased pod of a dead owner", true},
		{ended, "an ended leased pod of a live owner", false},
		{starting, "a leased pod still starting of a dead owner", false},
		{tethered, "a tethered pod of a dead owner", false},
	} {
		p, err := cs.CoreV1().Pods(drv.Namespace()).Get(ctx, c.name, metav1.GetOptions{})
		gone := apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if gone == c.kept {
			t.Errorf("after Prune, %s (%s): removed %v, want %v", c.what, c.name, gone, !c.kept)
		}
	}
	if p := waitPod(t, running, "running", func(*corev1.Pod) bool { return true }); p.Status.Phase != corev1.PodRunning {
		t.Errorf("the running leased pod after Prune: %s", p.Status.Phase)
	}
}

// syncBuffer is a buffer safe for concurrent use: the agent's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// greeted waits for the agent's first bytes (its greeting) on a session's
// stream, and then reads the stream to its end, as the sandbox package
// does.
func greeted(t *testing.T, what string, s driver.Stream) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := io.ReadFull(s, b[:])
		got <- err
		io.Copy(io.Discard, s)
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("%s: no greeting from the agent: %v", what, err)
		}
	case <-ctxFor(t).Done():
		t.Fatalf("%s: no greeting from the agent", what)
	}
}

// A leased pod through the backend alone (needs the agent's leased mode):
// no stdin; the creator and another Driver each have a session; the
// creator's Detach leaves the pod running for the opener; the creator
// opens it again; the opener's Remove deletes the pod, after which Open
// refuses it.
func TestLeasedDriver(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	labels := map[string]string{"test": unique(t)}
	var stderr syncBuffer
	spec := &driver.Spec{
		Image: busyboxImage, Workdir: "/workspace", Labels: labels, Record: []byte(`{"workdir":"/workspace"}`),
		Agent:     agentargs.Args{Lease: time.Minute},
		Resources: driver.Resources{Memory: 256 << 20},
		Stderr:    &stderr, Timeout: 30 * time.Second,
	}
	in, err := drv.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	t.Cleanup(func() {
		if !removed {
			in.Remove(context.Background())
		}
	})
	greeted(t, "the creator's session", in.Stream())
	p := waitPod(t, in.ID(), "running", phase(corev1.PodRunning))
	if c := p.Spec.Containers[0]; c.Stdin || p.Labels[owner.LabelLease] != "1m0s" {
		t.Errorf("the leased pod: stdin %v, labels %v; want no stdin and the lease", c.Stdin, p.Labels)
	}

	other := kubernetes.New(kubernetes.Config{})
	defer other.Close()
	in2, info, err := other.Open(ctx, in.ID(), driver.OpenOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Open from another Driver: %v (the agent said: %s)", err, stderr.String())
	}
	if info.ID != in.ID() || info.Lease != time.Minute || !info.Running || info.Image != busyboxImage ||
		!maps.Equal(info.Labels, labels) || string(info.Record) != string(spec.Record) {
		t.Errorf("Open's description: %+v", info)
	}
	greeted(t, "the opener's session", in2.Stream())

	if err := in.(driver.Detacher).Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if st := in2.State(ctx); st != driver.StateRunning {
		t.Fatalf("the pod after its creator detached: state %v, want running", st)
	}
	in3, _, err := drv.Open(ctx, in.ID(), driver.OpenOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Open again by the creator's Driver after Detach: %v", err)
	}
	greeted(t, "the creator's second session", in3.Stream())
	if err := in3.(driver.Detacher).Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}

	if err := in2.Remove(ctx); err != nil {
		t.Fatalf("the opener's Remove: %v", err)
	}
	in.Remove(ctx) // the creator's, after its Detach: the pod is gone already
	removed = true
	if _, _, err := drv.Open(ctx, in.ID(), driver.OpenOptions{}); !errors.Is(err, driver.ErrGone) && !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open after Remove: %v; want ErrGone or fs.ErrNotExist", err)
	}
}

// A tethered instance refuses Detach and stays usable.
func TestDetachTethered(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	in, err := drv.Create(ctx, &driver.Spec{Image: busyboxImage, Workdir: "/workspace", Timeout: 30 * time.Second,
		Resources: driver.Resources{Memory: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Remove(context.Background())
	greeted(t, "the session", in.Stream())
	if err := in.(driver.Detacher).Detach(); !errors.Is(err, driver.ErrNotLeased) {
		t.Errorf("Detach of a tethered instance: %v; want ErrNotLeased", err)
	}
	if st := in.State(ctx); st != driver.StateRunning {
		t.Errorf("after Detach refused: state %v, want running", st)
	}
}

// A lease nobody renews ends the pod (needs the agent's leased mode): the
// pod ends by itself, stays known — List says it is not running, Open
// ErrGone — until Prune removes it. Not parallel: another test's Prune
// would remove the ended pod under it.
func TestLeaseEnds(t *testing.T) {
	ctx := ctxFor(t)
	labels := map[string]string{"test": unique(t)}
	var stderr syncBuffer
	const lease = 5 * time.Second
	in, err := drv.Create(ctx, &driver.Spec{
		Image: busyboxImage, Workdir: "/workspace", Labels: labels, Agent: agentargs.Args{Lease: lease},
		Resources: driver.Resources{Memory: 256 << 20}, Stderr: &stderr, Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Remove(context.Background())
	start := time.Now()
	greeted(t, "the creator's session", in.Stream())
	p := waitPod(t, in.ID(), "ended", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	t.Logf("a lease of %v not renewed: the pod %s %v after the agent's greeting; the agent said %q",
		lease, p.Status.Phase, time.Since(start).Round(100*time.Millisecond), strings.TrimSpace(stderr.String()))

	infos, err := drv.List(ctx, labels)
	if err != nil || len(infos) != 1 || infos[0].Running || infos[0].Lease != lease {
		t.Errorf("List of the ended leased pod: %+v, %v; want it, not running, lease %v", infos, err, lease)
	}
	if _, _, err := drv.Open(ctx, in.ID(), driver.OpenOptions{}); !errors.Is(err, driver.ErrGone) {
		t.Errorf("Open of the ended leased pod: %v; want ErrGone", err)
	}
	if st := in.State(ctx); st != driver.StateGone {
		t.Errorf("the creator's State: %v, want gone", st)
	}
	if _, err := drv.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(drv.Namespace()).Get(ctx, in.ID(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		if err == nil {
			err = errors.New("still there")
		}
		t.Errorf("the ended leased pod after Prune: %v; want it removed", err)
	}
}
