package kubernetes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// List returns the library's sandboxes in the namespace — every process's,
// tethered and leased, running and ended — whose labels hold every label
// of match, oldest first. It needs pods list.
func (d *Driver) List(ctx context.Context, match map[string]string) ([]driver.InstanceInfo, error) {
	cs, err := d.client()
	if err != nil {
		return nil, err
	}
	// The API server selects by the labels it can; the rest (values that
	// are annotations) are compared here.
	sel := labels.Set{}
	for k, v := range match {
		if len(validation.IsQualifiedName(k)) == 0 && len(validation.IsValidLabelValue(v)) == 0 {
			sel[k] = v
		}
	}
	sel[owner.LabelManaged], sel[owner.LabelKind] = "true", kindSandbox
	rctx, cancel := context.WithTimeout(ctx, defaultTimeout)
	defer cancel()
	pods, err := cs.CoreV1().Pods(d.ns).List(rctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, d.err("listing pods", err)
	}
	infos := []driver.InstanceInfo{}
next:
	for i := range pods.Items {
		info := infoOf(&pods.Items[i])
		for k, v := range match {
			if got, ok := info.Labels[k]; !ok || got != v {
				continue next
			}
		}
		infos = append(infos, info)
	}
	sort.Slice(infos, func(i, j int) bool {
		if !infos[i].Created.Equal(infos[j].Created) {
			return infos[i].Created.Before(infos[j].Created)
		}
		return infos[i].ID < infos[j].ID
	})
	return infos, nil
}

// Open attaches to the leased sandbox whose pod is named id: it execs a
// relay to the agent (the agent again, with Args.Connect), as Create does
// for its own session. It waits for a pod that has not started yet. It
// needs what Create needs: pods get (and watch, for a pod still
// starting) and pods/exec create.
func (d *Driver) Open(ctx context.Context, id string, opts driver.OpenOptions) (driver.Instance, driver.InstanceInfo, error) {
	cs, err := d.client()
	if err != nil {
		return nil, driver.InstanceInfo{}, err
	}
	if id == "" || len(validation.IsDNS1123Subdomain(id)) > 0 {
		return nil, driver.InstanceInfo{}, fmt.Errorf("kubernetes: opening %q: no pod can have that name: %w", id, driver.ErrNotFound)
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	p, err := cs.CoreV1().Pods(d.ns).Get(rctx, id, metav1.GetOptions{})
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return nil, driver.InstanceInfo{}, fmt.Errorf("kubernetes: opening %s: no pod of that name in namespace %s: %w", id, d.ns, driver.ErrNotFound)
	case err != nil:
		return nil, driver.InstanceInfo{}, d.err("opening pod "+id, err)
	case p.Labels[owner.LabelManaged] != "true" || p.Labels[owner.LabelKind] != kindSandbox:
		return nil, driver.InstanceInfo{}, fmt.Errorf("kubernetes: opening %s: pod %s in namespace %s is no sandbox of the library's: %w", id, id, d.ns, driver.ErrNotFound)
	}
	info := infoOf(p)
	switch {
	case info.Lease <= 0:
		return nil, driver.InstanceInfo{}, fmt.Errorf("kubernetes: opening pod %s: %w", id, driver.ErrNotLeased)
	case ended(p):
		return nil, info, fmt.Errorf("%w: kubernetes: opening pod %s: it has ended (%s); Prune removes it", driver.ErrGone, id, describe(p))
	}
	in := &instance{d: d, name: id, node: p.Spec.NodeName, timeout: timeout, leased: true}
	spec := &driver.Spec{Image: info.Image}
	started, _, err := podStarted(p, spec, d.agent)
	if err != nil {
		return nil, info, err
	}
	if !started {
		if in.node, err = d.waitRunning(ctx, id, p.ResourceVersion, max(timeout, startBound), spec); err != nil {
			return nil, info, err
		}
	}
	sctx, scancel := context.WithCancel(context.Background())
	in.cancel = scancel
	if in.relay, err = in.exec(sctx, opts.Stderr); err != nil {
		scancel()
		return nil, info, err
	}
	return in, info, nil
}

// libraryKeys are the library's own labels on a pod, which are none of
// the user's.
var libraryKeys = []string{owner.LabelManaged, owner.LabelOwner, owner.LabelKind, owner.LabelLease, owner.LabelInstance}

// infoOf describes a sandbox's pod.
func infoOf(p *corev1.Pod) driver.InstanceInfo {
	info := driver.InstanceInfo{
		ID:      p.Name,
		Image:   p.Annotations[annotationImage],
		Created: p.CreationTimestamp.Time,
		Running: !ended(p),
	}
	if info.Image == "" { // a pod made before the annotation: as the engine names it
		for _, c := range p.Spec.Containers {
			if c.Name == sandboxContainer {
				info.Image = c.Image
			}
		}
	}
	if s, ok := p.Annotations[annotationLabels]; !ok || json.Unmarshal([]byte(s), &info.Labels) != nil {
		info.Labels = map[string]string{}
		for k, v := range p.Labels {
			info.Labels[k] = v
		}
		for _, k := range libraryKeys {
			delete(info.Labels, k)
		}
	}
	if info.Labels == nil {
		info.Labels = map[string]string{}
	}
	info.Lease = leaseOf(p)
	if s := p.Annotations[annotationRecord]; s != "" {
		info.Record, _ = base64.StdEncoding.DecodeString(s)
	}
	return info
}

// leased says whether a pod was made with a lease (owner.LabelLease).
func leased(p *corev1.Pod) bool {
	_, ok := p.Labels[owner.LabelLease]
	return ok
}

// leaseOf is a pod's lease; 0 if it has none (or one that is no
// duration).
func leaseOf(p *corev1.Pod) time.Duration {
	l, err := time.ParseDuration(p.Labels[owner.LabelLease])
	if err != nil || l < 0 {
		return 0
	}
	return l
}

// ended says whether a pod's sandbox has ended: the pod succeeded, failed
// or is being deleted, or its sandbox container has terminated.
func ended(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.Name == sandboxContainer && st.State.Terminated != nil {
			return true
		}
	}
	return false
}

// describe names a pod's state for an error message.
func describe(p *corev1.Pod) string {
	return strings.TrimSpace(podState(p) + " " + p.Status.Reason)
}
