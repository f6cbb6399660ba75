package kubernetes

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/driver/seccomp"
)

const (
	// agentDir is where the agent's emptyDir is mounted in both
	// containers: writable by the init container, read-only in the
	// sandbox's; the agent keeps it to itself (mode 0700).
	agentDir  = "/.agentsandbox"
	agentPath = agentDir + "/agent"
	// agentSocket is where the agent serves the library's relay: in the
	// runtime's /dev, which the agent then locks (see writable).
	agentSocket = "/dev/agentsandbox.sock"
	// sandboxContainer is the name of the container sandbox code runs in.
	sandboxContainer = "sandbox"
	// annotationOwner holds owner.ID(), which is no valid label value.
	annotationOwner = owner.LabelOwner
	// annotationRecord holds driver.Spec.Record, base64 (an annotation
	// is a string; the record is bytes).
	annotationRecord = owner.LabelRecord
	// annotationImage holds driver.Spec.Image as given.
	annotationImage = owner.LabelImage
	// annotationLabels holds driver.Spec.Labels as JSON, as given: the
	// pod's labels hold them too, but those whose value is no valid
	// label value are annotations, and a pod carries annotations others
	// put there.
	annotationLabels = "dev.agentsandbox.labels"
	// kindSandbox is owner.LabelKind of a sandbox's pod.
	kindSandbox = "sandbox"
)

// writable are the places besides the working directory a sandbox can
// write, each bounded: the agent locks every other writable mount as it
// starts (the kubelet's termination log and /etc/hosts, /dev).
var writable = []string{"/tmp", "/dev/shm", "/dev/mqueue"}

// connectCommand runs an agent that relays its standard input and output
// to the sandbox's agent (Args.Connect).
var connectCommand = func() []string {
	argv, err := agentargs.Args{Connect: agentSocket}.Argv()
	if err != nil {
		panic(err) // a constant socket path
	}
	return append([]string{agentPath}, argv...)
}()

// podFor is the pod a sandbox made from spec runs in.
func (d *Driver) podFor(name, ns string, spec *driver.Spec) (*corev1.Pod, error) {
	if len(spec.Record) > driver.RecordMax {
		return nil, fmt.Errorf("%w: kubernetes: the sandbox's record is %d bytes, more than %d", driver.ErrTooLarge, len(spec.Record), driver.RecordMax)
	}
	labels, annotations, err := splitLabels(owner.Labels(kindSandbox, spec.Labels))
	if err != nil {
		return nil, err
	}
	annotations[annotationOwner] = owner.ID()
	delete(labels, owner.LabelOwner)
	annotations[annotationImage] = spec.Image
	if len(spec.Record) > 0 {
		annotations[annotationRecord] = base64.StdEncoding.EncodeToString(spec.Record)
	}
	if len(spec.Labels) > 0 {
		b, err := json.Marshal(spec.Labels)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: the sandbox's labels: %w", err)
		}
		annotations[annotationLabels] = string(b)
	}
	leased := spec.Agent.Lease > 0
	if leased {
		// time.Duration's String is a valid label value ("1m30s", "1.5s").
		labels[owner.LabelLease] = spec.Agent.Lease.String()
	}

	r := spec.Resources
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	names := make([]string, 0, len(spec.Env))
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.Contains(k, ",") {
			return nil, fmt.Errorf("kubernetes: environment variable %q: a name with a comma is not supported", k)
		}
		env = append(env, corev1.EnvVar{Name: k, Value: v})
		names = append(names, k)
	}
	a := spec.Agent
	a.Listen, a.Writable = agentSocket, writable
	a.KeepEnv = names // the agent keeps only these: the kubelet adds service variables
	a.FileSize, a.OpenFiles, a.Procs = max(r.FileSize, 0), max(r.OpenFiles, 0), max(r.PIDs, 0)
	argv, err := a.Argv()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	args := append([]string{agentPath}, argv...)
	isolate := spec.Network == driver.NetworkNone
	installArgv, err := agentargs.Args{Install: agentPath, Isolate: isolate}.Argv()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	install := append([]string{"/agent"}, installArgv...)
	initCaps := []corev1.Capability{}
	if isolate {
		initCaps = append(initCaps, "NET_ADMIN")
	}
	agentCaps := make([]corev1.Capability, len(driver.AgentCaps))
	for i, c := range driver.AgentCaps {
		agentCaps[i] = corev1.Capability(c)
	}
	pull := corev1.PullNever
	if spec.Pull {
		pull = corev1.PullIfNotPresent
	}
	limits, requests := d.resources(r)
	agentMount := corev1.VolumeMount{Name: "agent", MountPath: agentDir}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			NodeSelector:                  d.cfg.NodeSelector,
			// Spread the library's pods over the nodes, where they fit.
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
				MaxSkew:           1,
				TopologyKey:       "kubernetes.io/hostname",
				WhenUnsatisfiable: corev1.ScheduleAnyway,
				LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{owner.LabelManaged: "true"}},
			}},
			SecurityContext: &corev1.PodSecurityContext{SeccompProfile: d.seccomp()},
			InitContainers: []corev1.Container{{
				Name:            "agent",
				Image:           d.agent,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         install,
				SecurityContext: securityContext(initCaps),
				VolumeMounts:    []corev1.VolumeMount{agentMount},
				Resources:       corev1.ResourceRequirements{Limits: limits, Requests: requests},
			}},
			Containers: []corev1.Container{{
				Name:            sandboxContainer,
				Image:           spec.Image,
				ImagePullPolicy: pull,
				Command:         args,
				WorkingDir:      spec.Workdir,
				Env:             env,
				// The tether: a tethered agent's stdin is open only while
				// the library's attach lasts. A leased one has none.
				Stdin:                    !leased,
				StdinOnce:                !leased,
				SecurityContext:          securityContext(agentCaps),
				Resources:                corev1.ResourceRequirements{Limits: limits, Requests: requests},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				VolumeMounts: []corev1.VolumeMount{{Name: "agent", MountPath: agentDir, ReadOnly: true},
					{Name: "workdir", MountPath: spec.Workdir},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "shm", MountPath: "/dev/shm"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "agent", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				memoryVolume("workdir", r.Disk),
				memoryVolume("tmp", r.TmpSize),
				memoryVolume("shm", r.TmpSize),
			},
		},
	}
	if r.Lifetime > 0 {
		// The agent ends the sandbox at its Lifetime; the deadline ends a
		// pod whose agent did not (a second later, counted from the pod's
		// start, which is before the agent's).
		pod.Spec.ActiveDeadlineSeconds = ptr.To(int64(r.Lifetime.Seconds()) + 2)
	}
	if spec.Runtime != "" {
		pod.Spec.RuntimeClassName = ptr.To(spec.Runtime)
	}
	return pod, nil
}

// seccomp is the pods' seccomp profile: the library's, where it is
// installed on the nodes (Config.SeccompProfile), else the runtime's.
func (d *Driver) seccomp() *corev1.SeccompProfile {
	if d.cfg.SeccompProfile == "" {
		return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To(d.cfg.SeccompProfile)}
}

// SeccompProfile returns the library's seccomp profile for nodes of
// architecture arch ("amd64", "arm64") as OCI JSON, the format containerd
// reads: Docker's default, resolved for the sandbox's capabilities, minus
// io_uring, userfaultfd, modify_ldt and remap_file_pages. Install it on
// every node under the kubelet's seccomp directory and name it in
// Config.SeccompProfile.
func SeccompProfile(arch string) ([]byte, error) {
	return json.Marshal(seccomp.Profile(arch))
}

// securityContext runs a container as root with only caps and no way to
// more, on a read-only root file system.
func securityContext(caps []corev1.Capability) *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser:                ptr.To(int64(0)),
		RunAsGroup:               ptr.To(int64(0)),
		RunAsNonRoot:             ptr.To(false),
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: caps},
	}
}

// memoryVolume is a tmpfs of size bytes (none: unsized, bounded by the
// pod's memory limit).
func memoryVolume(name string, size int64) corev1.Volume {
	ed := &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}
	if size > 0 {
		ed.SizeLimit = resource.NewQuantity(size, resource.BinarySI)
	}
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: ed}}
}

// resources are the container's limits and its requests (a fraction of
// them, at least a millicore and a mebibyte).
func (d *Driver) resources(r driver.Resources) (limits, requests corev1.ResourceList) {
	limits, requests = corev1.ResourceList{}, corev1.ResourceList{}
	f := d.cfg.RequestFraction
	if r.CPUs > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(int64(r.CPUs*1000+0.5), resource.DecimalSI)
		requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(max(1, int64(r.CPUs*1000*f)), resource.DecimalSI)
	} else {
		requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(10, resource.DecimalSI)
	}
	if r.Memory > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(r.Memory, resource.BinarySI)
		requests[corev1.ResourceMemory] = *resource.NewQuantity(max(1<<20, int64(float64(r.Memory)*f)), resource.BinarySI)
	}
	return limits, requests
}

// splitLabels keeps labels Kubernetes accepts as labels, and those whose
// value it does not accept (a snapshot's "sha256:…") as annotations. A key
// it does not accept is an error.
func splitLabels(in map[string]string) (labels, annotations map[string]string, err error) {
	labels, annotations = map[string]string{}, map[string]string{}
	for k, v := range in {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return nil, nil, fmt.Errorf("kubernetes: label %q: %s", k, strings.Join(errs, "; "))
		}
		if len(validation.IsValidLabelValue(v)) > 0 {
			annotations[k] = v
			continue
		}
		labels[k] = v
	}
	return labels, annotations, nil
}
