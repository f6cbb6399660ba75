package docker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
)

// A leased sandbox (driver.Spec.Agent.Lease > 0) is tied to no process:
// its container has no attached standard input (no tether) and is not
// removed when it stops, so that an ended one stays known until Prune; its
// agent serves sessions at agentSocket, and every process — the creator
// too — reaches it through an exec'd relay (the agent run with
// agentargs.Args.Connect), as the Kubernetes backend does for every
// sandbox. The relay runs as root in the container, with the container's
// capabilities and seccomp profile, and becomes a user of its own with no
// capability once connected; the socket is root's alone (mode 0600).

// agentSocket is where a leased sandbox's agent serves its sessions: in
// /dev, a tmpfs of the container's own that the agent locks after it made
// the socket.
const agentSocket = "/dev/agentsandbox.sock"

var (
	_ driver.Opener   = (*Driver)(nil)
	_ driver.Detacher = (*instance)(nil)
)

// leased says whether the instance is a leased sandbox's.
func (in *instance) leased() bool { return in.spec.Agent.Lease > 0 }

// labels are the labels of an object of kind made for the instance: the
// owner's, and for a leased sandbox the lease's (owner.LabelLease,
// owner.LabelInstance), which keep Prune off it while it runs.
func (in *instance) labels(kind string, extra map[string]string) map[string]string {
	l := owner.Labels(kind, extra)
	if in.leased() {
		l[owner.LabelLease] = in.spec.Agent.Lease.String()
		l[owner.LabelInstance] = in.name
	}
	return l
}

// sandboxLabels are the container's labels: the user's, the owner's, the
// lease's, the image as given and the record.
func (in *instance) sandboxLabels() map[string]string {
	l := in.labels("sandbox", in.spec.Labels)
	l[owner.LabelImage] = in.spec.Image
	if len(in.spec.Record) > 0 {
		l[owner.LabelRecord] = string(in.spec.Record)
	}
	return l
}

// relay starts the agent's relay in the container and returns the stream
// it carries: a session of the agent's.
func (in *instance) relay(ctx context.Context) error {
	argv, err := agentargs.Args{Connect: agentSocket}.Argv()
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	ex, err := in.cli.ContainerExecCreate(ctx, in.id, container.ExecOptions{
		User: "0:0", AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Cmd: append([]string{agentDir + "/agent"}, argv...),
	})
	if err != nil {
		return in.err("exec the agent's relay", err)
	}
	if in.attach, err = engine.Attach(ctx, in.spec.Timeout, func(ctx context.Context) (types.HijackedResponse, error) {
		return in.cli.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	}); err != nil {
		return in.err("attach the agent's relay", err)
	}
	stderr := in.spec.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	in.stream = newStream(in.attach, engine.Demux(in.attach.Reader, stderr))
	return nil
}

// Detach lets go of a leased sandbox: the relay's stream closes (the
// agent ends this session and what it started) and the container runs on.
func (in *instance) Detach() error {
	if !in.leased() {
		return driver.ErrNotLeased
	}
	if in.attach.Conn != nil {
		in.attach.Close()
	}
	if in.dev != nil {
		// The engine's mount holds the loop device while the container
		// runs; the kernel frees it once the volume is unmounted.
		in.dev.Release()
	}
	return nil
}

// List returns the library's sandbox containers carrying every label of
// match: every process's, tethered and leased, running and ended.
func (d *Driver) List(ctx context.Context, match map[string]string) ([]driver.InstanceInfo, error) {
	cli, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	f := filters.NewArgs(filters.Arg("label", owner.LabelManaged+"=true"), filters.Arg("label", owner.LabelKind+"=sandbox"))
	for k, v := range match {
		f.Add("label", k+"="+v)
	}
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return nil, d.err("list containers", err)
	}
	infos := make([]driver.InstanceInfo, 0, len(cs))
	for _, c := range cs {
		infos = append(infos, infoOf(c.ID, c.Image, c.Labels, time.Unix(c.Created, 0), c.State == "running" || c.State == "paused"))
	}
	return infos, nil
}

// infoOf describes a sandbox's container from its labels.
func infoOf(id, image string, labels map[string]string, created time.Time, running bool) driver.InstanceInfo {
	info := driver.InstanceInfo{ID: id, Image: cmp.Or(labels[owner.LabelImage], image), Labels: map[string]string{},
		Created: created, Running: running}
	info.Lease, _ = time.ParseDuration(labels[owner.LabelLease])
	if r := labels[owner.LabelRecord]; r != "" {
		info.Record = []byte(r)
	}
	for k, v := range labels {
		if !strings.HasPrefix(k, "dev.agentsandbox.") {
			info.Labels[k] = v
		}
	}
	return info
}

// Open attaches to the running leased sandbox id (a container's ID, a
// unique prefix of it, or its name): a new session through the agent's
// relay.
func (d *Driver) Open(ctx context.Context, id string, o driver.OpenOptions) (driver.Instance, driver.InstanceInfo, error) {
	var none driver.InstanceInfo
	cli, err := d.client(ctx)
	if err != nil {
		return nil, none, err
	}
	c, err := cli.ContainerInspect(ctx, id)
	switch {
	case engine.IsNotFound(err), err == nil && (c.Config == nil || c.Config.Labels[owner.LabelManaged] != "true" || c.Config.Labels[owner.LabelKind] != "sandbox"):
		return nil, none, fmt.Errorf("%w: %q: no sandbox of that ID on the engine at %s (List shows those there are)", driver.ErrNotFound, id, d.Host())
	case err != nil:
		return nil, none, d.err("inspect "+shortID(id), err)
	}
	created, _ := time.Parse(time.RFC3339Nano, c.Created)
	running := c.State != nil && c.State.Running && !c.State.Dead
	info := infoOf(c.ID, c.Config.Image, c.Config.Labels, created, running)
	switch {
	case info.Lease <= 0:
		return nil, info, fmt.Errorf("%w: %s", driver.ErrNotLeased, shortID(c.ID))
	case !running:
		return nil, info, fmt.Errorf("%w: %s ended (its lease ran out, its Lifetime passed, or it was stopped from outside); Prune removes what remains of it",
			driver.ErrGone, shortID(c.ID))
	}
	in := &instance{d: d, cli: cli, id: c.ID, name: strings.TrimPrefix(c.Name, "/"), image: c.Config.Image, created: created}
	in.spec = driver.Spec{Image: info.Image, Stderr: o.Stderr, Log: o.Log, Timeout: cmp.Or(o.Timeout, d.cfg.Timeout),
		Agent: agentargs.Args{Lease: info.Lease, Listen: agentSocket}, Labels: info.Labels, Record: info.Record}
	if in.spec.Log == nil {
		in.spec.Log = slog.New(slog.DiscardHandler)
	}
	if err := in.relay(ctx); err != nil {
		return nil, info, err
	}
	return in, info, nil
}

// removeMadeFor removes the volumes and networks made for the leased
// sandbox name (by another process, or this one), and the firewall rules
// of networks that no longer exist.
func removeMadeFor(ctx context.Context, cli engine.API, name string) error {
	f := filters.NewArgs(filters.Arg("label", owner.LabelInstance+"="+name))
	var errs []error
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return fmt.Errorf("sandbox: list the sandbox's volumes: %w", err)
	}
	for _, v := range vs.Volumes {
		if err := removeVolume(ctx, cli, v.Name); err != nil {
			errs = append(errs, err)
		}
	}
	nets, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sandbox: list the sandbox's networks: %w", err))...)
	}
	for _, n := range nets {
		err := engine.RetryBusy(ctx, func() error {
			if err := cli.NetworkRemove(ctx, n.ID); err != nil && !engine.IsNotFound(err) {
				return err
			}
			return nil
		}, engine.IsInUse)
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox: remove network: %w", err))
		}
	}
	if len(nets) > 0 {
		firewall.Prune(ctx, func(tag string) bool {
			_, err := cli.NetworkInspect(ctx, tag, network.InspectOptions{})
			return !engine.IsNotFound(err)
		})
	}
	return errors.Join(errs...)
}

// leaseOver says whether Prune may remove an object of a leased sandbox
// whose container is in state (found false: it no longer exists): the
// container ended ("exited", "dead", Podman's "stopped" before its
// clean-up, ...), or never started and its maker is dead. A running,
// paused, restarting or departing one, or one whose state the engine did
// not say, is kept.
func leaseOver(state string, found bool, ownerLabel string) bool {
	switch {
	case !found:
		return true
	case state == "created":
		return owner.Dead(ownerLabel)
	case state == "running", state == "paused", state == "restarting", state == "removing", state == "unknown":
		return false
	}
	return true
}

// leasedState returns the state of the leased sandbox's container name.
func leasedState(ctx context.Context, cli engine.API, name string, cache map[string]string) (string, bool) {
	if s, ok := cache[name]; ok {
		return s, s != ""
	}
	c, err := cli.ContainerInspect(ctx, name)
	state := ""
	if err == nil && c.State != nil {
		state = cmp.Or(c.State.Status, "unknown")
	} else if err != nil && !engine.IsNotFound(err) {
		state = "unknown" // not known to have ended: keep
	}
	cache[name] = state
	return state, state != ""
}

// prunable says whether Prune removes an object with these labels: a dead
// owner's, or a leased sandbox's whose container has ended.
func prunable(ctx context.Context, cli engine.API, labels map[string]string, cache map[string]string) bool {
	if labels[owner.LabelLease] == "" {
		return owner.Dead(labels[owner.LabelOwner])
	}
	name := labels[owner.LabelInstance]
	state, found := leasedState(ctx, cli, name, cache)
	return leaseOver(state, found, labels[owner.LabelOwner])
}
