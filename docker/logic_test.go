package docker

// Unit tests of the driver's own logic: no Docker engine is used (the
// engine is a fake behind engine.API), so they pass in milliseconds on a
// machine without one.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/leftover"
)

// fakeEngine is an engine holding the objects the test lists; it records
// removals and answers them with the errors the test set. Calls it does
// not implement panic (the embedded nil API): a test that reaches one
// uses the engine in a way it did not expect.
type fakeEngine struct {
	engine.API
	mu         sync.Mutex
	containers []container.Summary
	volumes    []*volume.Volume
	networks   []network.Summary
	images     []image.Summary
	removeErr  map[string][]error // per ID: the errors of successive removals
	removed    []string
	inspected  []string
	filters    []filters.Args
	state      *container.State // ContainerInspect's answer; nil: not found
}

// Events answers that the engine remembers no event.
func (f *fakeEngine) Events(context.Context, events.ListOptions) (<-chan events.Message, <-chan error) {
	m := make(chan events.Message)
	close(m)
	return m, make(chan error)
}

func (f *fakeEngine) remove(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if errs := f.removeErr[id]; len(errs) > 0 {
		f.removeErr[id] = errs[1:]
		if errs[0] != nil {
			return errs[0]
		}
	}
	f.removed = append(f.removed, id)
	return nil
}

func (f *fakeEngine) list(a filters.Args) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.filters = append(f.filters, a)
}

func (f *fakeEngine) ContainerList(_ context.Context, o container.ListOptions) ([]container.Summary, error) {
	f.list(o.Filters)
	return f.containers, nil
}
func (f *fakeEngine) ContainerRemove(_ context.Context, id string, _ container.RemoveOptions) error {
	return f.remove(id)
}
func (f *fakeEngine) VolumeList(_ context.Context, o volume.ListOptions) (volume.ListResponse, error) {
	f.list(o.Filters)
	return volume.ListResponse{Volumes: f.volumes}, nil
}
func (f *fakeEngine) VolumeRemove(_ context.Context, id string, _ bool) error { return f.remove(id) }
func (f *fakeEngine) NetworkList(_ context.Context, o network.ListOptions) ([]network.Summary, error) {
	f.list(o.Filters)
	return f.networks, nil
}
func (f *fakeEngine) NetworkRemove(_ context.Context, id string) error { return f.remove(id) }
func (f *fakeEngine) NetworkInspect(_ context.Context, id string, _ network.InspectOptions) (network.Inspect, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inspected = append(f.inspected, id)
	for _, n := range f.networks {
		if n.ID == id || n.Name == id {
			return network.Inspect(n), nil
		}
	}
	return network.Inspect{}, fmt.Errorf("network %s not found: %w", id, cerrdefs.ErrNotFound)
}
func (f *fakeEngine) ImageList(_ context.Context, o image.ListOptions) ([]image.Summary, error) {
	f.list(o.Filters)
	return f.images, nil
}
func (f *fakeEngine) ImageRemove(_ context.Context, id string, _ image.RemoveOptions) ([]image.DeleteResponse, error) {
	return nil, f.remove(id)
}
func (f *fakeEngine) ContainerInspect(_ context.Context, id string) (container.InspectResponse, error) {
	if f.state == nil {
		return container.InspectResponse{}, fmt.Errorf("No such container: %s: %w", id, cerrdefs.ErrNotFound)
	}
	return container.InspectResponse{ContainerJSONBase: &container.ContainerJSONBase{ID: id, State: f.state}}, nil
}
func (f *fakeEngine) Close() error { return nil }

// Prune removes exactly the objects whose owner is known to be dead: made
// on this host by a process that no longer runs, or before the host last
// booted. Live owners (this process), other hosts and labels it cannot
// read are left alone; a removal someone else is already doing is not an
// error, and a volume still in use is retried until it goes.
func TestUnitPruneOwnerRules(t *testing.T) {
	me := owner.ID()
	f := strings.Split(me, "/") // host/boot/pid/start
	start, _ := strconv.ParseUint(f[3], 10, 64)
	owners := map[string]string{
		"live":      me,
		"dead":      f[0] + "/" + f[1] + "/" + f[2] + "/" + strconv.FormatUint(start+1, 10), // same pid, another start
		"rebooted":  f[0] + "/other-boot/" + f[2] + "/" + f[3],
		"otherhost": "elsewhere/" + f[1] + "/1/1",
		"garbled":   "not an owner",
		"none":      "",
	}
	labels := func(who string) map[string]string {
		return map[string]string{owner.LabelManaged: "true", owner.LabelOwner: owners[who]}
	}
	fe := &fakeEngine{removeErr: map[string][]error{
		// Another Prune is removing it: not this one's, not an error.
		"c-rebooted": {fmt.Errorf("removal of container c-rebooted is already in progress: %w", cerrdefs.ErrConflict)},
		// Still held by a container being removed: retried.
		"v-dead": {fmt.Errorf("volume is in use: %w", cerrdefs.ErrConflict), nil},
		// Went while being looked up.
		"i-rebooted": {errors.New("unrecognized image ID sha256:1234")},
	}}
	for who := range owners {
		fe.containers = append(fe.containers, container.Summary{ID: "c-" + who, Labels: labels(who)})
		fe.volumes = append(fe.volumes, &volume.Volume{Name: "v-" + who, Labels: labels(who)})
		fe.networks = append(fe.networks, network.Summary{ID: "n-" + who, Name: "agentsandbox-" + who, Labels: labels(who)})
		fe.images = append(fe.images, image.Summary{ID: "i-" + who, Labels: labels(who)})
	}
	var asked []string
	fw := func(ctx context.Context, exists func(string) bool) (int, error) {
		// Rules of a network that exists are kept, others removed.
		for _, tag := range []string{"n-live", "n-gone"} {
			if !exists(tag) {
				asked = append(asked, tag)
			}
		}
		return len(asked), nil
	}
	n, err := newWithAPI(fe, Config{}).prune(context.Background(), fe, fw)
	if err != nil {
		t.Fatalf("prune: %v", err)
	}
	want := []string{"c-dead", "i-dead", "n-dead", "n-rebooted", "v-dead", "v-rebooted"}
	slices.Sort(fe.removed)
	if !slices.Equal(fe.removed, want) {
		t.Errorf("removed %v, want %v", fe.removed, want)
	}
	if !slices.Equal(asked, []string{"n-gone"}) {
		t.Errorf("firewall rules judged orphaned: %v, want [n-gone]", asked)
	}
	if n != len(want)+1 {
		t.Errorf("prune counted %d, want %d (%d objects and 1 firewall rule set)", n, len(want)+1, len(want))
	}
	for _, a := range fe.filters {
		if !a.ExactMatch("label", owner.LabelManaged+"=true") {
			t.Errorf("a list was not limited to the library's objects: %v", a)
		}
	}

	// A removal that fails for another reason is reported, and the rest
	// still done.
	fe = &fakeEngine{
		containers: []container.Summary{{ID: "c1", Labels: labels("dead")}, {ID: "c2", Labels: labels("dead")}},
		removeErr:  map[string][]error{"c1": {errors.New("driver failed")}},
	}
	n, err = newWithAPI(fe, Config{}).prune(context.Background(), fe, func(context.Context, func(string) bool) (int, error) { return 0, nil })
	if err == nil || !strings.Contains(err.Error(), "driver failed") || n != 1 || !slices.Equal(fe.removed, []string{"c2"}) {
		t.Errorf("prune with a failing removal: %d, %v, removed %v", n, err, fe.removed)
	}
}

// err is where the package turns the engine's errors into the driver's
// sentinels.
func TestUnitEngineErrors(t *testing.T) {
	dialErr := &net.OpError{Op: "dial", Net: "unix", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ENOENT}}
	noAnswer := fmt.Errorf("post: %w", engine.ErrNoAnswer)
	notFound := fmt.Errorf("No such container: x: %w", cerrdefs.ErrNotFound)
	conflict := fmt.Errorf("container x is not running: %w", cerrdefs.ErrConflict)
	cases := []struct {
		name  string
		id    string
		state *container.State
		err   error
		is    []error
		isNot []error
		say   string
	}{
		{"unreachable", "", nil, dialErr, []error{driver.ErrUnavailable}, []error{driver.ErrUnresponsive}, "is dockerd running?"},
		{"no answer", "", nil, noAnswer, []error{driver.ErrUnavailable, driver.ErrUnresponsive}, nil, "stopped or overloaded"},
		{"caller's deadline", "", nil, fmt.Errorf("x: %w", context.DeadlineExceeded), []error{context.DeadlineExceeded}, []error{driver.ErrUnavailable}, ""},
		{"caller cancelled", "c1", nil, context.Canceled, []error{context.Canceled}, []error{driver.ErrGone}, ""},
		{"container gone", "c1", nil, notFound, []error{driver.ErrGone}, []error{driver.ErrUnavailable}, "c1"},
		{"container exited", "c1", &container.State{Status: "exited"}, conflict, []error{driver.ErrGone}, nil, ""},
		{"container paused", "c1", &container.State{Running: true, Paused: true}, conflict, []error{driver.ErrUnresponsive}, []error{driver.ErrGone}, "paused"},
		{"not found before create", "", nil, notFound, nil, []error{driver.ErrGone, driver.ErrUnavailable}, "sandbox: op:"},
		{"other", "c1", &container.State{Running: true}, errors.New("disk full"), nil, []error{driver.ErrGone, driver.ErrUnresponsive}, "disk full"},
	}
	for _, c := range cases {
		fe := &fakeEngine{state: c.state}
		in := &instance{d: newWithAPI(fe, Config{Timeout: time.Second}), cli: fe, id: c.id, spec: driver.Spec{Timeout: time.Second}}
		got := in.err("op", c.err)
		for _, e := range c.is {
			if !errors.Is(got, e) {
				t.Errorf("%s: %v is not %v", c.name, got, e)
			}
		}
		for _, e := range c.isNot {
			if errors.Is(got, e) {
				t.Errorf("%s: %v is %v", c.name, got, e)
			}
		}
		if !strings.Contains(got.Error(), c.say) {
			t.Errorf("%s: %q does not say %q", c.name, got, c.say)
		}
	}
	if (&instance{d: New(Config{})}).err("op", nil) != nil {
		t.Error("err(nil) is not nil")
	}
}

// Objects whose removal the engine did not answer are remembered by the
// Driver (no other), and removed by its next Prune; one the engine still
// refuses is kept for a later try.
func TestUnitLeftoversPerDriver(t *testing.T) {
	fe := &fakeEngine{removeErr: map[string][]error{"v1": {errors.New("busy disk"), nil}}}
	d, other := newWithAPI(fe, Config{}), newWithAPI(fe, Config{})
	noAnswer := fmt.Errorf("post: %w", engine.ErrNoAnswer)
	d.remember(leftover.Volume, "v1", noAnswer)
	d.remember(leftover.Container, "c1", noAnswer)
	d.remember(leftover.Network, "n1", errors.New("refused")) // answered: not remembered
	none := func(context.Context, func(string) bool) (int, error) { return 0, nil }
	if n, err := other.prune(context.Background(), fe, none); n != 0 || err != nil {
		t.Fatalf("another driver's prune: %d, %v", n, err)
	}
	n, err := d.prune(context.Background(), fe, none)
	if n != 1 || err == nil || !strings.Contains(err.Error(), "busy disk") || !slices.Equal(fe.removed, []string{"c1"}) {
		t.Fatalf("first prune: %d, %v, removed %v; want c1 removed, v1 failing", n, err, fe.removed)
	}
	if n, err := d.prune(context.Background(), fe, none); n != 1 || err != nil || !slices.Equal(fe.removed, []string{"c1", "v1"}) {
		t.Fatalf("second prune: %d, %v, removed %v; want v1 too", n, err, fe.removed)
	}
}

// What Prune takes of a leased sandbox: what has ended, whatever its
// maker; never what runs; what never started only once its maker died.
func TestUnitLeaseOver(t *testing.T) {
	dead := "another-host-is-never-dead/x/1/1" // Dead is false: not this host
	for _, c := range []struct {
		state string
		found bool
		want  bool
	}{
		{"", false, true},
		{"exited", true, true},
		{"dead", true, true},
		{"stopped", true, true}, // Podman, before its clean-up
		{"running", true, false},
		{"paused", true, false},
		{"restarting", true, false},
		{"removing", true, false},
		{"unknown", true, false},
		{"created", true, false},
	} {
		if got := leaseOver(c.state, c.found, dead); got != c.want {
			t.Errorf("leaseOver(%q, %v) = %v, want %v", c.state, c.found, got, c.want)
		}
	}
}
