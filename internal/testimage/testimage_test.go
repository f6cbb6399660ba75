package testimage

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
)

// testLabel marks the containers these tests create.
const testLabel = "dev.agentsandbox.test"

// tlog adapts a *testing.T to the io.Writer that Ensure logs to.
type tlog struct{ t *testing.T }

// Write logs p through t.Log.
func (w tlog) Write(p []byte) (int, error) {
	w.t.Helper()
	if s := strings.TrimRight(string(p), "\n"); strings.TrimSpace(s) != "" {
		w.t.Log(s)
	}
	return len(p), nil
}

// run runs cmd in a container of image, removes the container, and returns
// the container's combined output and exit code.
func run(t *testing.T, image string, cmd ...string) (string, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	created, err := cli.ContainerCreate(ctx,
		&container.Config{Image: image, Cmd: cmd, Labels: map[string]string{testLabel: "1"}},
		&container.HostConfig{NetworkMode: "none"},
		nil, nil, "")
	if err != nil {
		t.Fatalf("creating container: %v", err)
	}
	defer func() {
		// A fresh context: ctx may have expired.
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		if err := cli.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true}); err != nil {
			t.Errorf("removing container: %v", err)
		}
	}()

	waitC, errC := cli.ContainerWait(ctx, created.ID, container.WaitConditionNextExit)
	if err := cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		t.Fatalf("starting container: %v", err)
	}
	var code int64
	select {
	case w := <-waitC:
		if w.Error != nil {
			t.Fatalf("waiting for container: %s", w.Error.Message)
		}
		code = w.StatusCode
	case err := <-errC:
		t.Fatalf("waiting for container: %v", err)
	}

	logs, err := cli.ContainerLogs(ctx, created.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatalf("reading logs: %v", err)
	}
	defer logs.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, logs); err != nil {
		t.Fatalf("reading logs: %v", err)
	}
	return out.String(), code
}

// TestRecipeHash checks that the recipe hash is 12 hex digits, stable, and
// changes when a file's content changes or a file is added.
func TestRecipeHash(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", "FROM scratch\n")
	h1, err := recipeHash(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(h1) != 12 {
		t.Fatalf("hash %q: want 12 hex digits", h1)
	}
	if h, _ := recipeHash(dir); h != h1 {
		t.Fatalf("hash not stable: %s then %s", h1, h)
	}
	write("Dockerfile", "FROM scratch\n# changed\n")
	h2, _ := recipeHash(dir)
	if h2 == h1 {
		t.Fatal("hash did not change with the content")
	}
	write("extra", "")
	if h3, _ := recipeHash(dir); h3 == h2 {
		t.Fatal("hash did not change with a new file")
	}
}

// TestRecipeDir checks that both recipes' directories are found.
func TestRecipeDir(t *testing.T) {
	for _, name := range []string{Busybox, Python} {
		dir, err := RecipeDir(name)
		if err != nil {
			t.Fatal(err)
		}
		if !isDir(dir) {
			t.Fatalf("%s is not a directory", dir)
		}
	}
}

// TestEnsureUnknown checks that an unknown recipe name is an error.
func TestEnsureUnknown(t *testing.T) {
	if _, err := Ensure(context.Background(), "nope", nil); err == nil {
		t.Fatal("Ensure of an unknown recipe succeeded")
	}
}

// TestFromEnvOverride checks that $SANDBOX_IMAGE wins over building.
func TestFromEnvOverride(t *testing.T) {
	t.Setenv(EnvImage, "example/image:tag")
	img, err := FromEnv(context.Background(), nil)
	if err != nil || img != "example/image:tag" {
		t.Fatalf("FromEnv = %q, %v; want the $%s value", img, err, EnvImage)
	}
}

// TestEnsureBusybox builds (or finds) the busybox image, checks that a second
// Ensure only finds it under the same tag, and runs a shell in it.
func TestEnsureBusybox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag, err := Ensure(ctx, Busybox, tlog{t})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tag, "agentsandbox-test/busybox:") {
		t.Fatalf("tag %q", tag)
	}

	// The second Ensure only finds the image: it writes nothing to its
	// log (a build would).
	start := time.Now()
	var second strings.Builder
	again, err := Ensure(ctx, Busybox, &second)
	if err != nil {
		t.Fatal(err)
	}
	if again != tag {
		t.Fatalf("second Ensure gave %q, first %q", again, tag)
	}
	if second.Len() != 0 {
		t.Errorf("second Ensure logged %q; it should only find the image", second.String())
	}
	t.Logf("second Ensure took %v", time.Since(start))

	out, code := run(t, tag, "/bin/sh", "-c", "echo ok")
	if code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("echo ok: exit %d, output %q", code, out)
	}
	out, code = run(t, tag, "/bin/sh", "-c", "id sandbox && test -d /workspace && test -k /tmp")
	if code != 0 {
		t.Fatalf("image layout: exit %d, output %q", code, out)
	}
}

// TestEnsurePython builds (or finds) the python image, a few minutes the first
// time, and imports numpy, pandas and matplotlib in it.
func TestEnsurePython(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	tag, err := Ensure(ctx, Python, tlog{t})
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, tag, "python3", "-c", `import numpy, pandas, matplotlib; print("ok")`)
	if code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("python3 imports: exit %d, output %q", code, out)
	}
}
