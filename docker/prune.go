package docker

import (
	"context"
	"errors"
	"fmt"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
)

// Owned lists the containers (running or not), volumes, networks and
// snapshot images that process pid on this host made through the library
// on this Driver's engine; pid 0 means this process. For another pid, the
// objects of every process that has had that pid since the host booted
// are listed. The order is by type, then ID. It is the driver.Lister that
// package sandboxtest asks for what tests left behind.
func (d *Driver) Owned(ctx context.Context, pid int) ([]driver.Object, error) {
	cli, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	objs, err := engine.Owned(ctx, cli, pid)
	if err != nil {
		return nil, d.err("list the library's objects", err)
	}
	out := make([]driver.Object, len(objs))
	for i, o := range objs {
		out[i] = driver.Object(o)
	}
	return out, nil
}

// Prune removes the containers, volumes, networks (with their firewall
// rules) and snapshot images that processes on this host left behind when
// they died, and the objects whose removal this Driver's engine did not
// answer earlier. It never touches objects whose owner still runs (such as
// another test run beside this one) or that were made on another host. A
// leased sandbox (driver.Spec.Agent.Lease) has no owner: it and what was
// made for it are left while its container runs, whoever made it, and
// removed once it has ended.
func (d *Driver) Prune(ctx context.Context) (int, error) {
	cli, err := d.client(ctx)
	if err != nil {
		return 0, err
	}
	return d.prune(ctx, cli, firewall.Prune)
}

// prune is Prune removing orphaned firewall rules with fw: the seam its
// unit tests replace.
func (d *Driver) prune(ctx context.Context, cli engine.API,
	fw func(ctx context.Context, exists func(tag string) bool) (int, error)) (int, error) {
	f := filters.NewArgs(filters.Arg("label", owner.LabelManaged+"=true"))
	var n int
	var errs []error
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return 0, fmt.Errorf("sandbox: prune: %w", err)
	}
	leased := map[string]string{} // a leased sandbox's name: its container's state
	for _, c := range cs {
		if prunable(ctx, cli, c.Labels, leased) {
			err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
			if err == nil {
				n++
			} else if !engine.IsGone(err) {
				errs = append(errs, err)
			}
		}
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, v := range vs.Volumes {
		if prunable(ctx, cli, v.Labels, leased) {
			if err := removeVolume(ctx, cli, v.Name); err != nil {
				errs = append(errs, err)
			} else {
				n++
			}
		}
	}
	nets, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, nw := range nets {
		if prunable(ctx, cli, nw.Labels, leased) {
			if err := cli.NetworkRemove(ctx, nw.ID); err == nil {
				n++
			} else if !engine.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	// Firewall rules of networks that no longer exist. Each network is
	// looked up after its rules were listed: a sandbox being created now
	// makes its network before its rules, so they are never taken for
	// orphans (as they would be against a network list taken earlier).
	k, _ := fw(ctx, func(tag string) bool {
		_, err := cli.NetworkInspect(ctx, tag, network.InspectOptions{})
		return !engine.IsNotFound(err)
	})
	n += k
	// This process's own objects whose removal the engine did not answer.
	// An engine that still does not answer keeps them for a later try; that
	// is not this Prune's failure.
	k, err = d.sweep(ctx, cli)
	n += k
	if err != nil && !engine.IsUnreachable(err) {
		errs = append(errs, err)
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	if err != nil {
		return n, fmt.Errorf("sandbox: prune: %w", err)
	}
	for _, im := range is {
		if owner.Dead(im.Labels[owner.LabelOwner]) {
			_, err := cli.ImageRemove(ctx, im.ID, image.RemoveOptions{PruneChildren: true})
			if err == nil {
				n++
			} else if !engine.IsGone(err) {
				errs = append(errs, err)
			}
		}
	}
	return n, errors.Join(errs...)
}
