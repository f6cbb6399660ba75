package tools_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"
	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/testimage"
	"github.com/agentsandbox/sandbox/tools"
)

// Images used by the tests: busyboxImage is tiny and starts fast;
// pythonImage (SANDBOX_IMAGE, or the project's Debian + python3 image) has
// python3 with numpy, pandas and matplotlib.
var busyboxImage, pythonImage string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var err error
	if busyboxImage, err = testimage.Ensure(ctx, testimage.Busybox, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "test images:", err)
		return 1
	}
	if pythonImage, err = testimage.FromEnv(ctx, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "test images:", err)
		return 1
	}
	before := goleak.IgnoreCurrent()
	code := m.Run()
	if err := checkObjects(); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	if err := goleak.Find(before); err != nil {
		fmt.Fprintln(os.Stderr, "leak check:", err)
		return 1
	}
	return code
}

// checkObjects reports engine objects that this process made and left.
func checkObjects() error {
	ctx := context.Background()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	f := filters.NewArgs(filters.Arg("label", engine.LabelOwner+"="+engine.Owner()))
	deadline := time.Now().Add(15 * time.Second) // auto-removal is asynchronous
	for {
		cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
		if err != nil {
			return err
		}
		vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
		if err != nil {
			return err
		}
		is, err := cli.ImageList(ctx, image.ListOptions{All: true, Filters: f})
		if err != nil {
			return err
		}
		if len(cs)+len(vs.Volumes)+len(is) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("left behind: %d containers, %d volumes, %d images", len(cs), len(vs.Volumes), len(is))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newSandbox returns a sandbox of img closed at the end of the test.
func newSandbox(t testing.TB, img string, opts ...sandbox.Option) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := sandbox.New(ctx, append([]sandbox.Option{sandbox.WithImage(img)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb
}

// newSet returns the tools of a new busybox sandbox.
func newSet(t testing.TB, opts ...tools.Option) (*tools.Set, *sandbox.Sandbox) {
	t.Helper()
	sb := newSandbox(t, busyboxImage)
	return tools.New(sb, opts...), sb
}

// testCtx returns a context bounded by a generous deadline for one test.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// call runs a tool call that must not fail with an error.
func call(t testing.TB, set *tools.Set, name, args string) string {
	t.Helper()
	out, err := set.Call(testCtx(t), name, args)
	if err != nil {
		t.Fatalf("Call(%s, %s): %v", name, args, err)
	}
	return out
}

// mustExec runs script in sb and fails the test unless it exits 0.
func mustExec(t testing.TB, sb *sandbox.Sandbox, script string) string {
	t.Helper()
	r, err := sb.Exec(testCtx(t), script)
	if err != nil {
		t.Fatalf("Exec(%q): %v", script, err)
	}
	if r.ExitCode != 0 {
		t.Fatalf("Exec(%q): exit %d: %s%s", script, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r.Stdout
}
