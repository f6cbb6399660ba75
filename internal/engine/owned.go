package engine

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver/owner"
)

// Object is an engine object the library made.
type Object struct {
	Type  string // "container", "volume", "network", "image" (or another backend's: "pod")
	ID    string // the engine's ID (a volume's name)
	Name  string // a container's or network's name; empty for others
	Role  string // what the library made it for: "sandbox", "disk", "snapshot", ...
	State string // a container's state ("running", "exited", ...); empty for others
}

// Owned lists the containers (running or not), volumes, networks and
// images that process pid on this host made through the library, on the
// engine cli talks to; pid 0 means this process. For another pid, the
// objects of every process that has had that pid since the host booted are
// listed. The order is by type, then ID.
func Owned(ctx context.Context, cli API, pid int) ([]Object, error) {
	mine := owner.ID()
	match := func(labels map[string]string) bool { return labels[owner.LabelOwner] == mine }
	if pid != 0 {
		f := strings.Split(mine, "/") // hostname/boot-id/pid/start-time
		prefix := f[0] + "/" + f[1] + "/" + strconv.Itoa(pid) + "/"
		match = func(labels map[string]string) bool { return strings.HasPrefix(labels[owner.LabelOwner], prefix) }
	}
	managed := filters.NewArgs(filters.Arg("label", owner.LabelManaged+"=true"))
	var objs []Object
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: managed})
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if match(c.Labels) {
			name := ""
			if len(c.Names) > 0 {
				name = strings.TrimPrefix(c.Names[0], "/")
			}
			objs = append(objs, Object{Type: "container", ID: c.ID, Name: name, Role: c.Labels[owner.LabelKind], State: string(c.State)})
		}
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: managed})
	if err != nil {
		return nil, err
	}
	for _, v := range vs.Volumes {
		if match(v.Labels) {
			objs = append(objs, Object{Type: "volume", ID: v.Name, Role: v.Labels[owner.LabelKind]})
		}
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: managed})
	if err != nil {
		return nil, err
	}
	for _, n := range ns {
		if match(n.Labels) {
			objs = append(objs, Object{Type: "network", ID: n.ID, Name: n.Name, Role: n.Labels[owner.LabelKind]})
		}
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: managed})
	if err != nil {
		return nil, err
	}
	for _, im := range is {
		if match(im.Labels) {
			objs = append(objs, Object{Type: "image", ID: im.ID, Role: im.Labels[owner.LabelKind]})
		}
	}
	sort.SliceStable(objs, func(i, j int) bool {
		if objs[i].Type != objs[j].Type {
			return objs[i].Type < objs[j].Type
		}
		return objs[i].ID < objs[j].ID
	})
	return objs, nil
}

// Describe says how many objects of each type remain, and names them.
func Describe(objs []Object) string {
	count := map[string]int{}
	var names []string
	for _, o := range objs {
		count[o.Type]++
		id := o.ID
		if o.Name != "" {
			id = o.Name
		} else if len(id) > 19 && strings.HasPrefix(id, "sha256:") {
			id = id[7:19]
		} else if len(id) > 12 && o.Type != "volume" {
			id = id[:12]
		}
		names = append(names, fmt.Sprintf("%s %s (%s)", o.Type, id, o.Role))
	}
	return fmt.Sprintf("%d containers, %d volumes, %d networks, %d images: %s",
		count["container"], count["volume"], count["network"], count["image"], strings.Join(names, ", "))
}

// Left waits up to wait for the engine DOCKER_HOST names to hold no object
// made by this process, and describes what remains if some do.
func Left(wait time.Duration) error { return LeftOf(wait, ownedHere) }

// LeftOf is Left for the objects list returns (another backend's).
func LeftOf(wait time.Duration, list func(context.Context) ([]Object, error)) error {
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), leftListTimeout)
		objs, err := list(ctx)
		cancel()
		if err != nil {
			return err
		}
		if len(objs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left behind: %s", Describe(objs))
		}
		time.Sleep(leftPoll)
	}
}

// leftListTimeout bounds one listing of LeftOf; leftPoll is the pause
// between listings while objects remain.
const (
	leftListTimeout = 30 * time.Second
	leftPoll        = 100 * time.Millisecond
)

// ownedHere lists this process's objects on the engine DOCKER_HOST names.
func ownedHere(ctx context.Context) ([]Object, error) {
	cli, err := Connect(ctx, "", leftListTimeout, "")
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return Owned(ctx, cli, 0)
}
