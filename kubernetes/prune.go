package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// managed selects the library's pods.
var managed = owner.LabelManaged + "=true"

// Prune deletes the pods in the namespace whose owner — a process on this
// host — has died, and those this Driver failed to delete earlier. Pods
// of live processes and of other hosts are never touched. A leased
// sandbox's pod has no owner: Prune deletes it once it has ended (its
// lease ran out, its Lifetime, its node lost it) whoever made it, and
// never while it runs; one still starting only if the process that made
// it is dead (its Create never returned). A pod is all the backend makes
// for a sandbox.
func (d *Driver) Prune(ctx context.Context) (int, error) {
	cs, err := d.client()
	if err != nil {
		return 0, err
	}
	pods, err := cs.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: managed})
	if err != nil {
		return 0, d.err("listing pods", err)
	}
	d.mu.Lock()
	failed := make(map[string]bool, len(d.failed))
	for n := range d.failed {
		failed[n] = true
	}
	d.mu.Unlock()
	var n int
	var errs []error
	for _, p := range pods.Items {
		if !failed[p.Name] && !prunable(&p) {
			continue
		}
		delete(failed, p.Name)
		if err := d.deletePod(ctx, p.Name); err != nil {
			errs = append(errs, err)
		} else {
			n++
		}
	}
	for name := range failed { // not listed: gone already
		d.forget(name)
	}
	return n, errors.Join(errs...)
}

// prunable says whether Prune removes a pod it made no attempt on.
func prunable(p *corev1.Pod) bool {
	dead := owner.Dead(p.Annotations[annotationOwner])
	if !leased(p) {
		return dead
	}
	if ended(p) {
		return true
	}
	// A pod still starting was never handed out: its Create waits until
	// it runs.
	return dead && p.Status.Phase == corev1.PodPending
}

// Owned lists the pods process pid on this host made (pid 0: this
// process), ordered by name.
func (d *Driver) Owned(ctx context.Context, pid int) ([]driver.Object, error) {
	cs, err := d.client()
	if err != nil {
		return nil, err
	}
	mine := owner.ID()
	match := func(label string) bool { return label == mine }
	if pid != 0 {
		parts := strings.Split(mine, "/")
		prefix := fmt.Sprintf("%s/%s/%d/", parts[0], parts[1], pid)
		match = func(label string) bool { return strings.HasPrefix(label, prefix) }
	}
	pods, err := cs.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: managed})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, d.err("listing pods", err)
	}
	var objs []driver.Object
	for _, p := range pods.Items {
		if match(p.Annotations[annotationOwner]) {
			objs = append(objs, driver.Object{Type: "pod", ID: p.Name, Name: p.Name,
				Role: p.Labels[owner.LabelKind], State: podState(&p)})
		}
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].ID < objs[j].ID })
	return objs, nil
}

// podState is a pod's phase in lower case, "terminating" once deleted.
func podState(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "terminating"
	}
	return strings.ToLower(string(p.Status.Phase))
}
