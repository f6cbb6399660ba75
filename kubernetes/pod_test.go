package kubernetes

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// The pod a spec makes, field by field (no cluster).
func TestUnitPodFor(t *testing.T) {
	d := New(Config{AgentImage: "agent:1", NodeSelector: map[string]string{"pool": "sandboxes"}})
	spec := &driver.Spec{
		Image: "python:3", Agent: agentargs.Args{Lifetime: time.Minute, User: "1000:1000"}, Workdir: "/workspace",
		Env:    []string{"A=1", "B=x=y"},
		Labels: map[string]string{"team": "rl", "dev.agentsandbox.snapshot": "sha256:" + strings.Repeat("a", 64)},
		Resources: driver.Resources{CPUs: 0.5, Memory: 512 << 20, PIDs: 64, Disk: 100 << 20, TmpSize: 8 << 20,
			FileSize: 1 << 20, OpenFiles: 200, Lifetime: time.Minute},
	}
	p, err := d.podFor("agentsandbox-x", "ns", spec)
	if err != nil {
		t.Fatal(err)
	}
	if p.Labels["team"] != "rl" || p.Labels[owner.LabelManaged] != "true" || p.Labels[owner.LabelOwner] != "" {
		t.Errorf("labels %v", p.Labels)
	}
	if p.Annotations["dev.agentsandbox.snapshot"] == "" || p.Annotations[owner.LabelOwner] != owner.ID() {
		t.Errorf("annotations %v", p.Annotations)
	}
	c := p.Spec.Containers[0]
	want := []string{agentPath, "-lifetime=1m0s", "-user=1000:1000", "-fsize=1048576", "-nofile=200", "-nproc=64", "-keepenv=A,B",
		"-listen=" + agentSocket, "-writable=/tmp,/dev/shm,/dev/mqueue"}
	if !slices.Equal(c.Command, want) {
		t.Errorf("command %q, want %q", c.Command, want)
	}
	if m := c.VolumeMounts[0]; m.Name != "agent" || m.MountPath != agentDir || !m.ReadOnly {
		t.Errorf("the agent's volume in the sandbox's container: %+v, want it read-only", m)
	}
	if len(c.Env) != 2 || c.Env[1].Name != "B" || c.Env[1].Value != "x=y" {
		t.Errorf("env %+v", c.Env)
	}
	if c.ImagePullPolicy != corev1.PullNever || !c.Stdin || !c.StdinOnce || c.TTY {
		t.Errorf("container %+v", c)
	}
	if got := c.Resources.Limits.Cpu().MilliValue(); got != 500 {
		t.Errorf("cpu limit %dm", got)
	}
	if got := c.Resources.Requests.Cpu().MilliValue(); got != 10 {
		t.Errorf("cpu request %dm, want 2%% of 500m", got)
	}
	if got := c.Resources.Limits.Memory().Value(); got != 512<<20 {
		t.Errorf("memory limit %d", got)
	}
	for _, v := range p.Spec.Volumes {
		ed := v.EmptyDir
		switch v.Name {
		case "workdir":
			if ed.Medium != corev1.StorageMediumMemory || ed.SizeLimit.Value() != 100<<20 {
				t.Errorf("workdir volume %+v", ed)
			}
		case "tmp", "shm":
			if ed.Medium != corev1.StorageMediumMemory || ed.SizeLimit.Value() != 8<<20 {
				t.Errorf("%s volume %+v", v.Name, ed)
			}
		}
	}
	init := p.Spec.InitContainers[0]
	if !slices.Equal(init.Command, []string{"/agent", "-install=" + agentPath, "-isolate"}) ||
		!slices.Equal(init.SecurityContext.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) || init.Image != "agent:1" {
		t.Errorf("init container %+v", init)
	}
	if *p.Spec.ActiveDeadlineSeconds != 62 || p.Spec.NodeSelector["pool"] != "sandboxes" || p.Spec.RuntimeClassName != nil {
		t.Errorf("pod spec %+v", p.Spec)
	}

	// An open network: the init container has no capability at all.
	spec.Network, spec.Runtime, spec.Pull = driver.NetworkOpen, "gvisor", true
	p, _ = d.podFor("agentsandbox-y", "ns", spec)
	if init := p.Spec.InitContainers[0]; len(init.SecurityContext.Capabilities.Add) != 0 || slices.Contains(init.Command, "-isolate") {
		t.Errorf("init container with an open network: %+v", init)
	}
	if *p.Spec.RuntimeClassName != "gvisor" || p.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("runtime class %v, pull %v", p.Spec.RuntimeClassName, p.Spec.Containers[0].ImagePullPolicy)
	}

	if sp := p.Spec.SecurityContext.SeccompProfile; sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccomp %+v, want RuntimeDefault", sp)
	}
	d.cfg.SeccompProfile = "agentsandbox.json"
	p, _ = d.podFor("agentsandbox-y", "ns", spec)
	if sp := p.Spec.SecurityContext.SeccompProfile; sp.Type != corev1.SeccompProfileTypeLocalhost || *sp.LocalhostProfile != "agentsandbox.json" {
		t.Errorf("seccomp %+v, want Localhost agentsandbox.json", sp)
	}

	// A label key Kubernetes refuses is an error.
	spec.Labels = map[string]string{"bad key!": "v"}
	if _, err := d.podFor("agentsandbox-z", "ns", spec); err == nil {
		t.Error("a label key with a space and '!' was accepted")
	}
}

// A 403 hints at RBAC only when the authorizer said it; an admission
// plugin's (a missing RuntimeClass, Pod Security) gets no wrong hint.
func TestUnitForbidden(t *testing.T) {
	d := New(Config{})
	pods := schema.GroupResource{Resource: "pods"}
	rbac := apierrors.NewForbidden(pods, "", errors.New(`User "u" cannot create resource "pods" in API group "" in the namespace "ns"`))
	rc := apierrors.NewForbidden(pods, "p", errors.New(`pod rejected: RuntimeClass "x" not found`))
	pss := apierrors.NewForbidden(pods, "p", errors.New(`violates PodSecurity "baseline:latest": non-default capabilities`))
	for _, c := range []struct {
		err        error
		hint, none string
	}{
		{rbac, "grant the library's user", "Pod Security"},
		{rc, "", "grant"},
		{pss, "Pod Security level", "grant"},
	} {
		got := d.err("creating pod", c.err)
		if !apierrors.IsForbidden(got) || !strings.Contains(got.Error(), c.hint) || strings.Contains(got.Error(), c.none) {
			t.Errorf("%v: %v", c.err, got)
		}
	}
}
