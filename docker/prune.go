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

	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
)

// Prune removes the containers, volumes, networks (with their firewall
// rules) and snapshot images that processes on this host left behind when
// they died, and the objects whose removal this Driver's engine did not
// answer earlier. It never touches objects whose owner still runs (such as
// another test run beside this one) or that were made on another host.
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
	for _, c := range cs {
		if owner.Dead(c.Labels[owner.LabelOwner]) {
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
		if owner.Dead(v.Labels[owner.LabelOwner]) {
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
		if owner.Dead(nw.Labels[owner.LabelOwner]) {
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
