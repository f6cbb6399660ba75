// Package kubernetes runs the sandbox package's sandboxes on a Kubernetes
// cluster: one Pod per sandbox, with the library's agent as its main
// process, through client-go. It is a module of its own, so that client-go
// never enters the core library's dependencies.
//
//	drv := kubernetes.New(kubernetes.Config{Namespace: "sandboxes"})
//	sb, err := sandbox.New(ctx, sandbox.WithDriver(drv), sandbox.WithImage("python:3.12-slim"))
//
// # The pod
//
// An init container from the agent's image (AgentImage; see WriteAgentImage
// for how to publish it) copies the agent into an emptyDir and, unless the
// sandbox has an open network, sets every network interface of the pod but
// loopback down (no route out): it alone holds CAP_NET_ADMIN, so the sandbox's own
// container never has it. The sandbox's container runs the user's image
// with the agent as its main process: as root with only the capabilities
// driver.AgentCaps, no privilege escalation, a read-only root file system,
// the runtime's seccomp profile or the library's (Config.SeccompProfile),
// no service-account token, no service environment variables, no host
// namespaces, restartPolicy Never and activeDeadlineSeconds of the
// Lifetime. The working directory, /tmp and
// /dev/shm are memory-backed emptyDirs with a sizeLimit (a tmpfs of that
// size: writing past it is ENOSPC), counted towards the memory limit.
// WithRuntime sets runtimeClassName.
//
// Those three and POSIX message queues (/dev/mqueue) are the only places
// a command can write, as the sandbox's user and as root (WithUser("0")):
// the agent's emptyDir is read-only in the sandbox's container, and the
// agent, as it starts, takes every other writable mount away from root
// (it removes their write bits and gives them to a user no command runs
// as, with CAP_CHOWN, which it then drops for good): the kubelet's
// /dev/termination-log and /etc/hosts, files on the node's disk, and the
// runtime's /dev (and runc's /sys/fs/cgroup, a tmpfs). A tmpfs's sizeLimit
// bounds its bytes, not its inodes: the kubelet mounts it with size= only,
// and no pod field sets nr_inodes. An empty file's inode and dentry (about
// 1 KiB) are charged to the container's memory cgroup, so empty files in a
// "0 % used" /tmp fill at most the memory limit: the pod's own OOM, not
// the node's.
//
// # Streams
//
// The library's frames never pass through the pod's log: the agent serves
// them on a unix socket in /dev (root's only, and listened on only until
// the relay connects), reached by an exec'd relay (the agent again, with
// no capabilities); pods/exec streams are not logged.
// The container's attach stream is the owner's tether: its stdin is open
// only while the library's attach lasts (stdinOnce), so when the owning
// process closes the sandbox or dies the agent sees its stdin end and the
// pod ends. A keepalive byte goes down the tether every Config.KeepAlive.
// A leased sandbox has no tether (see Leased sandboxes).
//
// # Leased sandboxes
//
// A sandbox made with a lease (sandbox.WithLease) has no tether: its
// container has no stdin, and the creator's attach carries only the
// agent's stderr, whose end ends nothing. Every process that has the
// sandbox open — its creator, and any that opened it by its ID, the pod's
// name (Driver.Open, from any machine that reaches the cluster) — has its
// own exec'd relay, a session of the agent's. The pod ends when its agent
// exits: its lease not renewed in time, its Lifetime (activeDeadlineSeconds
// still bounds it), or Close, which deletes the pod for everyone; Detach
// ends only this process's streams. An ended pod (Succeeded or Failed)
// stays, known to List and Open (ErrSandboxGone), until Prune deletes it;
// Prune never deletes a leased pod that runs, whatever became of the
// process that made it. The pod carries the lease's duration in the label
// dev.agentsandbox.lease and, as annotations, the image as given, the
// user's labels and the sandbox package's record of its settings (base64;
// never a secret).
//
// # Limits
//
// CPUs and Memory are the container's limits; its requests are
// Config.RequestFraction of them. The PIDs limit is not a pod setting in
// Kubernetes (it is the kubelet's podPidsLimit, per node): the agent puts
// it on the sandbox's user as RLIMIT_NPROC, which counts that user's
// processes on the node — one per sandbox, as the library draws a user per
// sandbox; a user given with sandbox.WithUser shares its count with other
// sandboxes of that user on the node. FileSize and OpenFiles are the
// agent's own resource limits, which commands inherit. The kernel buffers
// of the sandbox's TCP sockets count towards the memory limit on cgroup v2
// nodes; on cgroup v1 nodes nothing bounds them (no pod field does).
//
// # Network
//
// A sandbox without a network is made so inside the pod, not by a CNI
// plugin or NetworkPolicy the cluster may lack: the init container sets every
// interface of the pod's network namespace but loopback down, which leaves
// no route out, and the sandbox's container holds no capability to set one
// up. Allow-lists, credentials and Expose work as on Docker: the egress
// proxy runs in the library's process and reaches the sandbox over the
// agent's stream, and Expose returns a loopback URL of the library's
// process. NetworkPolicy{Open: true} leaves the interfaces up: the sandbox
// has the pod network as the cluster's NetworkPolicies leave it, so other
// pods and cluster services are reachable unless a NetworkPolicy keeps
// them out.
//
// # What differs from Docker
//
// The PIDs limit (above); a working directory always in memory; no inode
// bound on a tmpfs; the runtime's seccomp profile unless the library's is
// installed on the nodes; no reason for a sandbox's death from engine
// events (a command's OOMKilled still comes from the agent); no snapshot
// image (sandbox.Snapshot.Image is sandbox.ErrUnsupported — snapshots,
// forks and restores work, from the library's process); Open as above.
//
// # What a user grants
//
// In the namespace: pods (create, get, list, watch, delete), pods/attach
// (create, get) and pods/exec (create, get). List needs pods list, Open
// pods get and watch and pods/exec, Prune pods list and delete: nothing
// Create does not need already. Nothing cluster-wide. The
// namespace's Pod Security level must admit the pod: "baseline" rejects
// NET_ADMIN of the init container (drop it with an open network only), so
// network-less sandboxes need "privileged" there; the sandbox's container
// itself fits "baseline".
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/agentsandbox/sandbox/driver"
)

// Config configures the backend. The zero value reads the kubeconfig as
// kubectl does ($KUBECONFIG, then ~/.kube/config) or, in a pod, the
// in-cluster configuration, and uses namespace "default".
type Config struct {
	// REST is a client configuration to use as is; Kubeconfig and
	// Context are then ignored.
	REST *rest.Config
	// Kubeconfig is the path of a kubeconfig file ("": as kubectl).
	Kubeconfig string
	// Context is the kubeconfig's context to use ("": its current one).
	Context string
	// Namespace is where the sandboxes' pods are made ("": the
	// kubeconfig context's namespace, else "default").
	Namespace string
	// AgentImage is the image the init container copies the agent from
	// (default AgentImage()).
	AgentImage string
	// RequestFraction is the share of the CPU and memory limits a pod
	// requests (0: 0.02). Sandboxes mostly wait for a model; 1 makes them
	// Guaranteed.
	RequestFraction float64
	// NodeSelector restricts where sandboxes' pods run.
	NodeSelector map[string]string
	// SeccompProfile names the library's seccomp profile (SeccompProfile)
	// installed on every node, relative to the kubelet's seccomp directory
	// (<kubelet root>/seccomp), such as "agentsandbox.json". "" uses the
	// runtime's default profile (RuntimeDefault).
	SeccompProfile string
	// KeepAlive is how often a byte goes down each sandbox's tether and
	// a ping to its agent while the sandbox is idle (0: a minute), well
	// under the kubelet's streamingConnectionIdleTimeout (4 h by default).
	KeepAlive time.Duration
}

// Driver is the Kubernetes backend: a client of one cluster and
// namespace. It is safe for concurrent use.
type Driver struct {
	cfg   Config
	agent string // the agent image

	once    sync.Once
	rest    *rest.Config
	http    *http.Client
	cs      *k8s.Clientset
	ns      string
	initErr error

	mu     sync.Mutex
	failed map[string]bool // pods whose removal failed, for Prune
}

// New returns a backend for cfg. It does not reach the cluster; the first
// sandbox does.
func New(cfg Config) *Driver {
	if cfg.RequestFraction <= 0 {
		cfg.RequestFraction = 0.02
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = time.Minute
	}
	agent := cfg.AgentImage
	if agent == "" {
		agent = AgentImage()
	}
	return &Driver{cfg: cfg, agent: agent, failed: map[string]bool{}}
}

// client connects on first use.
func (d *Driver) client() (*k8s.Clientset, error) {
	d.once.Do(func() {
		rc, ns, err := d.restConfig()
		if err != nil {
			d.initErr = fmt.Errorf("%w: kubernetes: %v", driver.ErrUnavailable, err)
			return
		}
		rc.QPS, rc.Burst = 200, 400 // a Fork or a pool fill makes pods at once
		rc.UserAgent = "agentsandbox"
		d.rest = rc
		d.ns = ns
		if d.http, d.initErr = rest.HTTPClientFor(rc); d.initErr == nil {
			d.cs, d.initErr = k8s.NewForConfigAndClient(rc, d.http)
		}
	})
	return d.cs, d.initErr
}

// Clientset returns the backend's client of the cluster.
func (d *Driver) Clientset() (*k8s.Clientset, error) { return d.client() }

// CloseIdleConnections closes the client's connections that no request
// uses now.
func (d *Driver) CloseIdleConnections() {
	if _, err := d.client(); err == nil {
		utilnet.CloseIdleConnectionsFor(d.http.Transport)
	}
}

func (d *Driver) restConfig() (*rest.Config, string, error) {
	ns := d.cfg.Namespace
	if d.cfg.REST != nil {
		if ns == "" {
			ns = "default"
		}
		return rest.CopyConfig(d.cfg.REST), ns, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = d.cfg.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: d.cfg.Context})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil || ns == "" {
			ns = "default"
		}
	}
	return rc, ns, nil
}

// Namespace returns the namespace the sandboxes' pods are made in.
func (d *Driver) Namespace() string {
	d.client()
	return d.ns
}

// Caps: the engine is Kubernetes, and the working directory is a tmpfs (a
// memory-backed emptyDir).
func (d *Driver) Caps(context.Context) (driver.Caps, error) {
	if _, err := d.client(); err != nil {
		return driver.Caps{}, err
	}
	return driver.Caps{Disk: driver.DiskMemory, KeepAlive: d.cfg.KeepAlive, Engine: driver.EngineKubernetes}, nil
}

// Close closes the client's idle connections. Sandboxes already made keep
// running until closed; the Driver may still be used.
func (d *Driver) Close() error {
	d.CloseIdleConnections()
	return nil
}

// err wraps an API error in the driver's sentinels where one applies.
func (d *Driver) err(op string, err error) error {
	var ne net.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("kubernetes: %s: %w", op, err)
	case apierrors.IsForbidden(err) && denied(err):
		return fmt.Errorf("kubernetes: %s: %w (grant the library's user pods, pods/exec and pods/attach in namespace %s: see the package doc)", op, err, d.ns)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "PodSecurity"):
		return fmt.Errorf("kubernetes: %s: %w (the Pod Security level of namespace %s must admit the pod: see the package doc)", op, err, d.ns)
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w: kubernetes: %s: %v", driver.ErrUnavailable, driver.ErrUnresponsive, op, err)
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), errors.As(err, &ne), isConnErr(err):
		return fmt.Errorf("%w: kubernetes: %s: %v", driver.ErrUnavailable, op, err)
	}
	return fmt.Errorf("kubernetes: %s: %w", op, err)
}

// denied says whether a 403 is the authorizer's (RBAC: "User ... cannot
// create resource ..."), not an admission plugin's (a missing
// RuntimeClass, Pod Security, a quota), which granting would not cure.
func denied(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, " cannot ") && (strings.Contains(msg, " resource \"") || strings.Contains(msg, " path \""))
}

// isConnErr reports a failure to reach the API server at all.
func isConnErr(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return errors.As(err, &op) || errors.As(err, &dns)
}
