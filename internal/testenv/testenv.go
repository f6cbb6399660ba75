// Package testenv is the shared TestMain of the project's test suites: it
// builds the images the tests need, runs them, and then fails the run if
// this process left engine objects (containers, volumes, networks, images
// carrying its owner label) or goroutines behind.
package testenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/internal/engine"
)

// Images receives the references of the test images. Nil fields are not
// built.
type Images struct {
	Busybox *string // the tiny busybox image
	Python  *string // SANDBOX_IMAGE, or the project's Debian + python3 image
}

// Main builds the images, runs setup (if not nil), runs the tests, and
// checks for leaks. Use it as os.Exit(testenv.Main(m, images, nil)).
func Main(m *testing.M, imgs Images, setup func(ctx context.Context) (cleanup func(), err error)) int {
	// Tests never have the engine reach a registry (the network rule):
	// a missing image is an error, not a pull. Tests of pulling set
	// PullMissing themselves, against a registry of their own.
	os.Setenv("AGENTSANDBOX_PULL", "never")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var err error
	if imgs.Busybox != nil {
		if *imgs.Busybox, err = images.Ensure(ctx, images.Busybox, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "test images:", err)
			return 1
		}
	}
	if imgs.Python != nil {
		if *imgs.Python, err = images.FromEnv(ctx, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "test images:", err)
			return 1
		}
	}
	if setup != nil {
		cleanup, err := setup(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "test setup:", err)
			return 1
		}
		if cleanup != nil {
			defer cleanup()
		}
	}
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if err := LeftObjects(15 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	if err := goleak.Find(before); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	return code
}

// Objects counts the engine objects carrying this process's owner label.
type Objects struct {
	Containers, Volumes, Networks, Images int
}

// Total returns the number of objects of every kind.
func (o Objects) Total() int { return o.Containers + o.Volumes + o.Networks + o.Images }

func (o Objects) String() string {
	return fmt.Sprintf("%d containers, %d volumes, %d networks, %d images",
		o.Containers, o.Volumes, o.Networks, o.Images)
}

// OwnedObjects counts the containers (running or not), volumes, networks
// and images labelled with this process as owner (engine.LabelOwner =
// engine.Owner()), on the engine the environment (DOCKER_HOST) names.
func OwnedObjects(ctx context.Context) (Objects, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return Objects{}, err
	}
	defer cli.Close()
	return ownedObjects(ctx, cli)
}

func ownedObjects(ctx context.Context, cli *client.Client) (Objects, error) {
	f := filters.NewArgs(filters.Arg("label", engine.LabelOwner+"="+engine.Owner()))
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		return Objects{}, err
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		return Objects{}, err
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		return Objects{}, err
	}
	is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
	if err != nil {
		return Objects{}, err
	}
	return Objects{Containers: len(cs), Volumes: len(vs.Volumes), Networks: len(ns), Images: len(is)}, nil
}

// LeftObjects waits up to wait (the engine removes auto-removed containers
// asynchronously) for no container, volume, network or image labelled with
// this process as owner to remain, and says what is left otherwise.
func LeftObjects(wait time.Duration) error {
	ctx := context.Background()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	deadline := time.Now().Add(wait)
	for {
		o, err := ownedObjects(ctx, cli)
		if err != nil {
			return err
		}
		if o.Total() == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left behind: %v", o)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
