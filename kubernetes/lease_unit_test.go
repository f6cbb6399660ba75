package kubernetes

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// A leased sandbox's pod (no cluster): no stdin (no tether), the lease in
// a label, the agent told of it, and what List gives back — image as
// given, the user's labels exactly, the record's bytes — read from the
// pod as made.
func TestUnitLeasedPod(t *testing.T) {
	d := New(Config{AgentImage: "agent:1"})
	record := []byte("{\"user\":\"1000\"}\x00\xff") // not UTF-8: kept as bytes
	labels := map[string]string{"team": "rl", "dev.agentsandbox.snapshot": "sha256:" + strings.Repeat("a", 64)}
	spec := &driver.Spec{
		Image: "registry.example/python:3.12@sha256:" + strings.Repeat("b", 64), Workdir: "/workspace",
		Agent: agentargs.Args{Lease: 90 * time.Second, User: "1000:1000"}, Labels: labels, Record: record,
	}
	p, err := d.podFor("agentsandbox-l", "ns", spec)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Spec.Containers[0]
	if c.Stdin || c.StdinOnce {
		t.Errorf("a leased sandbox's container has stdin %v, stdinOnce %v: want no tether", c.Stdin, c.StdinOnce)
	}
	if !slices.Contains(c.Command, "-lease=1m30s") || !slices.Contains(c.Command, "-listen="+agentSocket) {
		t.Errorf("command %q: want -lease and -listen", c.Command)
	}
	if p.Labels[owner.LabelLease] != "1m30s" || p.Labels["team"] != "rl" || p.Annotations[owner.LabelOwner] != owner.ID() {
		t.Errorf("labels %v, annotations %v", p.Labels, p.Annotations)
	}
	p.CreationTimestamp = metav1.Now()
	p.Status.Phase = corev1.PodRunning
	info := infoOf(p)
	if info.ID != "agentsandbox-l" || info.Image != spec.Image || !maps.Equal(info.Labels, labels) ||
		info.Lease != 90*time.Second || !info.Running || !bytes.Equal(info.Record, record) || info.Created.IsZero() {
		t.Errorf("info %+v", info)
	}

	// Tethered: stdin, no lease; the same description otherwise.
	spec.Agent.Lease, spec.Record, spec.Labels = 0, nil, nil
	p, _ = d.podFor("agentsandbox-t", "ns", spec)
	if c := p.Spec.Containers[0]; !c.Stdin || !c.StdinOnce || slices.ContainsFunc(c.Command, func(a string) bool { return strings.HasPrefix(a, "-lease") }) {
		t.Errorf("a tethered sandbox's container: stdin %v, stdinOnce %v, command %q", c.Stdin, c.StdinOnce, c.Command)
	}
	if _, ok := p.Labels[owner.LabelLease]; ok {
		t.Errorf("a tethered pod with a lease label: %v", p.Labels)
	}
	p.Status.Phase = corev1.PodSucceeded
	if info := infoOf(p); info.Lease != 0 || info.Running || info.Image != spec.Image || len(info.Labels) != 0 || info.Record != nil {
		t.Errorf("a tethered, ended pod: %+v", info)
	}

	spec.Record = make([]byte, driver.RecordMax+1)
	if _, err := d.podFor("agentsandbox-r", "ns", spec); !errors.Is(err, driver.ErrTooLarge) {
		t.Errorf("a record of %d bytes: %v, want ErrTooLarge", len(spec.Record), err)
	}
}

// What Prune removes of pods it made no attempt on (no cluster).
func TestUnitPrunable(t *testing.T) {
	f := strings.Split(owner.ID(), "/")
	start, _ := strconv.ParseUint(f[3], 10, 64)
	dead := strings.Join(append(f[:3:3], strconv.FormatUint(start+1, 10)), "/")
	if !owner.Dead(dead) {
		t.Skipf("no owner ID to fake here: %q", owner.ID())
	}
	pod := func(own, lease string, phase corev1.PodPhase) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{owner.LabelManaged: "true"},
			Annotations: map[string]string{annotationOwner: own}}, Status: corev1.PodStatus{Phase: phase}}
		if lease != "" {
			p.Labels[owner.LabelLease] = lease
		}
		return p
	}
	for _, c := range []struct {
		owner, lease string
		phase        corev1.PodPhase
		want         bool
	}{
		{owner.ID(), "", corev1.PodRunning, false},
		{owner.ID(), "", corev1.PodSucceeded, false}, // its owner removes it
		{dead, "", corev1.PodRunning, true},
		{"another-host/b/1/1", "", corev1.PodRunning, false},
		{dead, "1m0s", corev1.PodRunning, false},        // the lease holds it
		{owner.ID(), "1m0s", corev1.PodSucceeded, true}, // its lease ran out
		{"another-host/b/1/1", "1m0s", corev1.PodFailed, true},
		{dead, "1m0s", corev1.PodPending, true}, // its Create never returned
		{owner.ID(), "1m0s", corev1.PodPending, false},
		{"another-host/b/1/1", "1m0s", corev1.PodPending, false},
	} {
		if got := prunable(pod(c.owner, c.lease, c.phase)); got != c.want {
			t.Errorf("owner %q, lease %q, %s: prunable %v, want %v", c.owner, c.lease, c.phase, got, c.want)
		}
	}
}
