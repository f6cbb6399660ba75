package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"

	"github.com/agentsandbox/sandbox/driver"
)

// defaultTimeout bounds each API request when Spec.Timeout is 0 (the
// sandbox package always sets it: its DefaultTimeout, the same 30 s).
const defaultTimeout = 30 * time.Second

// startBound is the least time a pod is given to be scheduled and start:
// on a busy cluster that takes longer than one API request.
const startBound = 2 * time.Minute

// streamLinger is how long Remove waits for the streams to end by
// themselves (the agent exits when its tether ends) before it cuts them.
const streamLinger = 2 * time.Second

// instance is one sandbox's pod and this process's streams to it.
type instance struct {
	d       *Driver
	name    string
	node    string
	timeout time.Duration
	leased  bool // made with a lease: no tether, and Detach lets go

	relay  *stream        // the exec'd relay: the library's frames
	tether *io.PipeWriter // the attach stream's stdin (tethered only)
	cancel context.CancelFunc
	wg     sync.WaitGroup // the streams' goroutines
	done   sync.Once      // Remove or Detach
}

var (
	_ driver.Opener   = (*Driver)(nil)
	_ driver.Lister   = (*Driver)(nil)
	_ driver.Detacher = (*instance)(nil)
)

// Create makes the sandbox's pod, waits for its agent to run, and connects
// the tether (attach) and the relay (exec). A leased sandbox's pod has no
// tether: the attach carries only the agent's stderr, and its end does not
// end the pod.
func (d *Driver) Create(ctx context.Context, spec *driver.Spec) (driver.Instance, error) {
	cs, err := d.client()
	if err != nil {
		return nil, err
	}
	var b [6]byte
	rand.Read(b[:])
	name := "agentsandbox-" + hex.EncodeToString(b[:])
	pod, err := d.podFor(name, d.ns, spec)
	if err != nil {
		return nil, err
	}
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	created, err := cs.CoreV1().Pods(d.ns).Create(rctx, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
			d.remember(name) // it may have been made after all
		}
		if spec.Runtime != "" && apierrors.IsForbidden(err) && strings.Contains(err.Error(), "RuntimeClass") {
			return nil, fmt.Errorf("kubernetes: creating pod: the cluster has no RuntimeClass %q (sandbox.WithRuntime names one): %w", spec.Runtime, err)
		}
		return nil, d.err("creating pod", err)
	}
	in := &instance{d: d, name: name, timeout: timeout, leased: spec.Agent.Lease > 0}
	fail := func(err error) (driver.Instance, error) {
		rctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		in.Remove(rctx)
		return nil, err
	}
	if in.node, err = d.waitRunning(ctx, name, created.ResourceVersion, max(timeout, startBound), spec); err != nil {
		return fail(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	in.cancel = scancel
	if err := in.attach(sctx, spec.Stderr); err != nil {
		return fail(err)
	}
	in.relay, err = in.exec(sctx, spec.Stderr)
	if err != nil {
		return fail(err)
	}
	return in, nil
}

// waitRunning watches the pod until its sandbox container runs, and
// returns its node. A pod that cannot start is an error saying why.
func (d *Driver) waitRunning(ctx context.Context, name, rv string, bound time.Duration, spec *driver.Spec) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	w, err := d.cs.CoreV1().Pods(d.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: rv,
	})
	if err != nil {
		return "", d.err("watching pod "+name, err)
	}
	defer w.Stop()
	last := "not scheduled"
	for {
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded && context.Cause(ctx) == context.DeadlineExceeded {
				return "", fmt.Errorf("%w: kubernetes: pod %s did not start within %v (%s)", driver.ErrUnresponsive, name, bound, last)
			}
			return "", fmt.Errorf("kubernetes: pod %s: %w", name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server ended the watch: start another.
				w.Stop()
				if w, err = d.cs.CoreV1().Pods(d.ns).Watch(ctx, metav1.ListOptions{
					FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
				}); err != nil {
					return "", d.err("watching pod "+name, err)
				}
				continue
			}
			if ev.Type == watch.Deleted {
				return "", fmt.Errorf("%w: kubernetes: pod %s was deleted while it started", driver.ErrGone, name)
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			done, why, err := podStarted(pod, spec, d.agent)
			if err != nil || done {
				return pod.Spec.NodeName, err
			}
			last = why
		}
	}
}

// podStarted says whether the pod's sandbox container runs, or why not
// yet, or the error it cannot start with.
func podStarted(pod *corev1.Pod, spec *driver.Spec, agentImage string) (bool, string, error) {
	name := pod.Name
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		msg := pod.Status.Message
		for _, st := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			if t := st.State.Terminated; t != nil && t.Message != "" {
				msg += " " + st.Name + ": " + strings.TrimSpace(t.Message)
			}
		}
		return false, "", fmt.Errorf("%w: kubernetes: pod %s ended as it started: %s", driver.ErrGone, name, strings.TrimSpace(msg))
	}
	for _, st := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		w := st.State.Waiting
		if w == nil {
			continue
		}
		image := spec.Image
		if st.Name != sandboxContainer {
			image = agentImage
		}
		switch w.Reason {
		case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
			hint := ""
			if st.Name != sandboxContainer {
				hint = " (the agent's image: load or publish it, see kubernetes.WriteAgentImage)"
			}
			return false, "", fmt.Errorf("%w: kubernetes: %s on node %q: %s: %s%s", driver.ErrImageNotFound, image, pod.Spec.NodeName, w.Reason, w.Message, hint)
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
			return false, "", fmt.Errorf("kubernetes: pod %s: container %s: %s: %s", name, st.Name, w.Reason, w.Message)
		}
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == sandboxContainer && st.State.Running != nil {
			return true, "", nil
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			return false, "not scheduled: " + c.Message, nil
		}
	}
	return false, "scheduled on " + pod.Spec.NodeName + ", starting", nil
}

// attach connects the tether: the sandbox container's stdin, which the
// agent holds the sandbox alive by, and its stderr (the agent's). A leased
// sandbox's container has no stdin: the attach carries its stderr alone,
// for as long as this process holds the sandbox, and ends nothing when it
// ends.
func (in *instance) attach(ctx context.Context, stderr io.Writer) error {
	if in.leased {
		if stderr == nil {
			return nil
		}
		return in.attachStderr(ctx, stderr)
	}
	req := in.d.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(in.d.ns).Name(in.name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: sandboxContainer, Stdin: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := in.d.executor(req.URL().String())
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	in.tether = pw
	if stderr == nil {
		stderr = io.Discard
	}
	ended := make(chan struct{})
	in.wg.Add(2)
	go func() {
		defer in.wg.Done()
		err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: pr, Stderr: stderr})
		// The executor's stdin copy may outlive it: end its input rather
		// than close it under it (which client-go logs as an error).
		pw.Close()
		close(ended)
		if err != nil && ctx.Err() == nil {
			// No tether: the sandbox would outlive its owner. End it,
			// saying why where the library looks.
			fmt.Fprintln(stderr, in.d.err("the tether (pods/attach)", err))
			dctx, cancel := context.WithTimeout(context.Background(), in.timeout)
			in.d.deletePod(dctx, in.name)
			cancel()
		}
	}()
	go func() { // keepalives, so that the idle tether is not cut
		defer in.wg.Done()
		t := time.NewTicker(in.d.cfg.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-ended:
				return
			case <-t.C:
				if _, err := pw.Write([]byte{0}); err != nil {
					return
				}
			}
		}
	}()
	return nil
}

// attachStderr streams the leased agent's stderr to stderr until ctx
// ends or the container does.
func (in *instance) attachStderr(ctx context.Context, stderr io.Writer) error {
	req := in.d.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(in.d.ns).Name(in.name).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: sandboxContainer, Stderr: true}, scheme.ParameterCodec)
	ex, err := in.d.executor(req.URL().String())
	if err != nil {
		return err
	}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		// Its error says nothing of the sandbox: the relay's does.
		ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stderr: stderr})
	}()
	return nil
}

// exec starts the relay and returns its stream.
func (in *instance) exec(ctx context.Context, stderr io.Writer) (*stream, error) {
	req := in.d.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(in.d.ns).Name(in.name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: sandboxContainer,
			Command:   connectCommand,
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ex, err := in.d.executor(req.URL().String())
	if err != nil {
		return nil, err
	}
	s := newStream()
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: s.stdinR, Stdout: s.stdoutW, Stderr: io.Discard})
		if err != nil && ctx.Err() == nil {
			// Said where the library looks for why an agent did not
			// start (RBAC: no pods/exec, say).
			err = in.d.err("the agent's relay (pods/exec)", err)
			if stderr != nil {
				fmt.Fprintln(stderr, err)
			}
			err = fmt.Errorf("%w: %v", driver.ErrGone, err)
		}
		s.stdoutW.CloseWithError(err)
		s.stdinW.Close() // as for the tether
		close(s.ended)

	}()
	return s, nil
}

// executor streams over SPDY, which every API server and kubelet speaks.
// (client-go's WebSocket executor leaves its heartbeat goroutine behind a
// closed stream until its next ping fails, and logs that as an error.)
func (d *Driver) executor(u string) (remotecommand.Executor, error) {
	url, err := url.Parse(u)
	if err != nil {
		return nil, err
	}
	return remotecommand.NewSPDYExecutor(d.rest, "POST", url)
}

func (in *instance) ID() string            { return in.name }
func (in *instance) Stream() driver.Stream { return in.relay }

// Node returns the node the pod runs on.
func (in *instance) Node() string { return in.node }

// State asks the API server about the pod. A pod whose node stopped
// reporting (Ready false or unknown while the pod runs) is StateUnknown.
func (in *instance) State(ctx context.Context) driver.State {
	ctx, cancel := context.WithTimeout(ctx, in.timeout)
	defer cancel()
	pod, err := in.d.cs.CoreV1().Pods(in.d.ns).Get(ctx, in.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return driver.StateGone
	case err != nil:
		return driver.StateUnknown
	case pod.DeletionTimestamp != nil, pod.Status.Phase == corev1.PodSucceeded, pod.Status.Phase == corev1.PodFailed:
		return driver.StateGone
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == sandboxContainer && st.State.Terminated != nil {
			return driver.StateGone
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			return driver.StateUnknown
		}
	}
	return driver.StateRunning
}

// Remove ends the tether (the agent exits, and with it every process of
// the sandbox) and deletes the pod at once. A leased sandbox has no
// tether: this process's streams end, then the pod is deleted, ending the
// sandbox for every process that has it open.
func (in *instance) Remove(ctx context.Context) error {
	if in.leased {
		in.detach()
		return in.d.deletePod(ctx, in.name)
	}
	in.letGo(func() { // the agent exits and the streams end by themselves
		if in.tether != nil {
			in.tether.Close()
		}
		if in.relay != nil {
			in.relay.CloseWrite()
		}
	}, in.wg.Wait)
	return in.d.deletePod(ctx, in.name)
}

// Detach lets go of a leased sandbox: this process's relay and stderr
// stream end; the pod and its agent run on, and any process may open it
// again. A tethered sandbox's is an error wrapping driver.ErrNotLeased,
// and changes nothing.
func (in *instance) Detach() error {
	if !in.leased {
		return fmt.Errorf("kubernetes: detaching pod %s: %w", in.name, driver.ErrNotLeased)
	}
	in.detach()
	return nil
}

// detach ends this process's streams to a leased sandbox's pod.
func (in *instance) detach() {
	in.letGo(func() {
		if in.relay != nil {
			in.relay.CloseWrite() // the relay exits: the agent's session ends
		}
	}, in.waitRelay)
}

// letGo ends this process's streams to the pod, once: end asks them to
// end, ended waits until they have. Unless the node does not answer (or
// nobody reads the relay's output), they end by themselves; else they are
// cut after streamLinger. The relay's stream is closed.
func (in *instance) letGo(end, ended func()) {
	in.done.Do(func() {
		end()
		wait(ended, streamLinger)
		if in.relay != nil {
			in.relay.Close()
		}
		if in.cancel != nil {
			in.cancel()
		}
		in.wg.Wait()
	})
}

// waitRelay waits until the relay's exec stream has ended.
func (in *instance) waitRelay() {
	if in.relay != nil {
		<-in.relay.ended
	}
}

// wait runs f, and returns when it has or after d.
func wait(f func(), d time.Duration) {
	ended := make(chan struct{})
	go func() { f(); close(ended) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
	}
}

// deletePod deletes a pod with no grace period; one that is gone already
// is no error. A pod it could not delete is remembered for Prune.
func (d *Driver) deletePod(ctx context.Context, name string) error {
	err := d.cs.CoreV1().Pods(d.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	if err == nil || apierrors.IsNotFound(err) {
		d.forget(name)
		return nil
	}
	d.remember(name)
	return d.err("deleting pod "+name, err)
}

func (d *Driver) remember(name string) {
	d.mu.Lock()
	d.failed[name] = true
	d.mu.Unlock()
}

func (d *Driver) forget(name string) {
	d.mu.Lock()
	delete(d.failed, name)
	d.mu.Unlock()
}

// stream is the relay's exec stream as a driver.Stream: writes go to the
// relay's stdin through a synchronous pipe that honours write deadlines.
type stream struct {
	stdinW  net.Conn // the library's end
	stdinR  net.Conn // the executor's end
	stdoutR *io.PipeReader
	stdoutW *io.PipeWriter
	ended   chan struct{} // closed when the exec stream has ended
}

func newStream() *stream {
	w, r := net.Pipe()
	or, ow := io.Pipe()
	return &stream{stdinW: w, stdinR: r, stdoutR: or, stdoutW: ow, ended: make(chan struct{})}
}

func (s *stream) Read(p []byte) (int, error)         { return s.stdoutR.Read(p) }
func (s *stream) Write(p []byte) (int, error)        { return s.stdinW.Write(p) }
func (s *stream) SetWriteDeadline(t time.Time) error { return s.stdinW.SetWriteDeadline(t) }

// CloseWrite ends the relay's stdin: the agent sees its connection end
// and exits.
func (s *stream) CloseWrite() error { return s.stdinW.Close() }

func (s *stream) Close() error {
	s.stdinW.Close()
	s.stdoutR.Close()
	return nil
}
