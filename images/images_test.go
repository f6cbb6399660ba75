package images

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/agentsandbox/sandbox/docker"
	"github.com/agentsandbox/sandbox/driver"
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
		// Limits of its own that every engine's runtime may set: rootful
		// Podman would raise RLIMIT_NOFILE and RLIMIT_NPROC to maxima that
		// a host capping root's limits refuses (runc: "error setting
		// rlimit type 7: operation not permitted").
		&container.HostConfig{NetworkMode: "none", Resources: container.Resources{Ulimits: []*container.Ulimit{
			{Name: "nofile", Soft: 1024, Hard: 1024}, {Name: "nproc", Soft: 4096, Hard: 4096}}}},
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

// engineCaps is what the engine DOCKER_HOST names says of itself, asked
// once.
var engineCaps = sync.OnceValues(func() (driver.Caps, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := docker.New(docker.Config{})
	defer d.Close()
	return d.Caps(ctx)
})

// notOnPodman skips a test that builds a Debian image (minutes of
// mmdebstrap) when the engine is Podman, rootful or rootless: the build
// is the same whatever the engine, and so is its import, through the
// engine API that Podman's Docker-compatible service speaks too. It is
// checked on Docker, as root and as a docker-group user; on Podman,
// TestEnsureBusybox checks an import and the suites import their images
// through Ensure at start. A decision, not a missing piece of the
// environment: CI accepts it.
func notOnPodman(t *testing.T) {
	t.Helper()
	caps, err := engineCaps()
	if err != nil {
		t.Fatalf("the engine: %v", err)
	}
	if caps.Engine.Podman() {
		t.Skipf("not applicable on %v: a Debian image's build and import are checked on Docker", caps.Engine)
	}
}

// TestRecipeHash checks that each recipe has its own 12-hex-digit hash,
// stable, depending on the packages too.
func TestRecipeHash(t *testing.T) {
	seen := map[string]Recipe{}
	for name, r := range recipes {
		h, err := recipeHash(r.dir, r.packages)
		if err != nil || len(h) != 12 {
			t.Fatalf("%s: hash %q, %v", name, h, err)
		}
		if again, _ := recipeHash(r.dir, r.packages); again != h {
			t.Fatalf("%s: hash not stable", name)
		}
		if other, ok := seen[h]; ok {
			t.Fatalf("%s and %s share hash %s", name, other, h)
		}
		seen[h] = name
	}
	if _, err := recipeHash("nope", ""); err == nil {
		t.Error("hash of a missing recipe directory")
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
	if !strings.HasPrefix(tag, "agentsandbox/busybox:") {
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

// TestEnsurePythonSlim builds (or finds) the slim python image, a few
// minutes the first time: python3 runs, and there is no compiler or header
// to build code with.
func TestEnsurePythonSlim(t *testing.T) {
	notOnPodman(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	tag, err := Ensure(ctx, PythonSlim, tlog{t})
	if err != nil {
		t.Fatal(err)
	}
	out, code := run(t, tag, "python3", "-c", `import json, sqlite3, ssl; print("ok")`)
	if code != 0 || strings.TrimSpace(out) != "ok" {
		t.Fatalf("python3: exit %d, output %q", code, out)
	}
	out, code = run(t, tag, "/bin/sh", "-c", `for c in gcc cc g++ make; do command -v $c; done; ls /usr/include 2>/dev/null | head -3; id sandbox`)
	if code != 0 || strings.Contains(out, "gcc") || strings.Contains(out, "make") || strings.Contains(out, ".h") {
		t.Errorf("the slim image has build tools or headers: exit %d, %q", code, out)
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	slim, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %.1f MB", tag, float64(slim.Size)/1e6)
	if slim.Config.Labels[LabelKey] != string(PythonSlim) {
		t.Errorf("labels %v", slim.Config.Labels)
	}
}

// TestEnsurePython builds (or finds) the python image, a few minutes the first
// time, and imports numpy, pandas and matplotlib in it.
func TestEnsurePython(t *testing.T) {
	notOnPodman(t)
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

// TestBuildDebianAnyUser runs the Debian recipe's build into a throwaway
// tag, whatever user runs the test: as root mmdebstrap builds in root mode,
// as a docker-group user in a user namespace (CI runs it both ways). The
// image has root-owned system files, a setuid passwd, the sandbox user and
// a /workspace it owns, and python3.
func TestBuildDebianAnyUser(t *testing.T) {
	notOnPodman(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("agentsandbox/build-test:%d-%d", os.Getuid(), time.Now().UnixNano())
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	t.Cleanup(func() {
		if _, err := cli.ImageRemove(context.Background(), tag, image.RemoveOptions{PruneChildren: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("removing %s: %v", tag, err)
		}
	})
	var progress bytes.Buffer
	r := recipes[PythonSlim]
	if err := buildDebian(ctx, r.dir, r.packages, PythonSlim, tag, io.MultiWriter(&progress, tlog{t})); err != nil {
		t.Fatalf("build as uid %d: %v", os.Getuid(), err)
	}
	wants := []string{"==> images: mmdebstrap", "Get:", "python3", "==> images: importing"}
	if debianCodename(t) != "" && os.Getenv("DEBIAN_MIRROR") == "" {
		// No mirror named by the recipe: the host's own, for the image's
		// release, with its updates and security archives.
		wants = append(wants, "from the host's apt sources (", " bookworm-updates", " bookworm-security)")
	}
	for _, want := range wants {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("the progress does not say %q", want)
		}
	}
	out, code := run(t, tag, "/bin/sh", "-c", `stat -c '%u:%g %a %n' /etc /usr/bin/passwd /etc/shadow /workspace; id -u sandbox; python3 -c 'print(6*7)'`)
	want := "0:0 755 /etc\n0:0 4755 /usr/bin/passwd\n0:42 640 /etc/shadow\n1000:1000 755 /workspace\n1000\n42\n"
	if code != 0 || out != want {
		t.Errorf("image built as uid %d: exit %d\n%s\nwant\n%s", os.Getuid(), code, out, want)
	}
}

// Where the Debian recipe's packages come from: the host's apt sources
// (here an apt configuration naming a corporate mirror after two
// third-party repositories), or DEBIAN_MIRROR over them. The "mirror" is a
// listener on loopback that records what it is asked and has nothing, so
// each build fails after asking it for the suites' indexes.
func TestBuildDebianSources(t *testing.T) {
	mirror := func(t *testing.T) (url string, asked func() []string) {
		var mu sync.Mutex
		var paths []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			paths = append(paths, r.URL.Path)
			mu.Unlock()
			http.NotFound(w, r)
		}))
		t.Cleanup(srv.Close)
		return srv.URL, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(paths)
		}
	}
	// build builds from a mirror that has nothing: it must fail, say
	// where it looked (want), and have asked under each of dists.
	build := func(t *testing.T, want string, asked func() []string, dists ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var progress bytes.Buffer
		r := recipes[PythonSlim]
		if err := buildDebian(ctx, r.dir, r.packages, PythonSlim, "agentsandbox/build-test:never", &progress); err == nil {
			t.Fatal("the build succeeded from a mirror that has nothing")
		}
		if !strings.Contains(progress.String(), want) {
			t.Errorf("the progress does not say %q:\n%s", want, progress.String())
		}
		for _, dist := range dists {
			if !slices.ContainsFunc(asked(), func(p string) bool { return strings.HasPrefix(p, dist) }) {
				t.Errorf("the mirror was asked %q, nothing under %s", asked(), dist)
			}
		}
	}
	t.Run("host", func(t *testing.T) {
		url, asked := mirror(t)
		// The host's own release names its sources; the image is bookworm
		// whatever the host runs.
		codename := debianCodename(t)
		dir := t.TempDir()
		list := filepath.Join(dir, "sources.list")
		sources := "deb [arch=amd64] http://127.0.0.1:9/docker " + codename + " stable\n" +
			"deb http://127.0.0.1:9/nodesource nodistro main\n" +
			"deb " + url + "/corp " + codename + " main contrib\n" +
			"deb " + url + "/corp-security " + codename + "-security main\n"
		conf := filepath.Join(dir, "apt.conf")
		if err := os.WriteFile(list, []byte(sources), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(fmt.Sprintf("Dir::Etc::SourceList %q;\nDir::Etc::SourceParts %q;\n", list, dir)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv("APT_CONFIG", conf)
		t.Setenv("DEBIAN_MIRROR", "")
		if codename == "" {
			build(t, "from mmdebstrap's default archives", asked)
			return
		}
		build(t, "from the host's apt sources ("+url+"/corp/ bookworm, "+url+"/corp/ bookworm-updates, "+url+"/corp-security/ bookworm-security)",
			asked, "/corp/dists/bookworm/", "/corp/dists/bookworm-updates/", "/corp-security/dists/bookworm-security/")
	})
	t.Run("override", func(t *testing.T) {
		url, asked := mirror(t)
		t.Setenv("DEBIAN_MIRROR", "deb "+url+"/other bookworm main")
		build(t, "from DEBIAN_MIRROR (deb "+url+"/other bookworm main)", asked, "/other/dists/bookworm/")
	})
}

// debianCodename returns the host's Debian release (VERSION_CODENAME in
// /etc/os-release), or "" on a host that is not Debian.
func debianCodename(t *testing.T) string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		t.Logf("reading os-release: %v", err)
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if !slices.Contains(lines, "ID=debian") {
		return ""
	}
	for _, l := range lines {
		if v, ok := strings.CutPrefix(l, "VERSION_CODENAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// The build lock works for every user: a lock file another user made
// (read-only to this one) is locked, and a second taker waits for the
// first, saying so. CI runs this as root and as a docker-group user, the
// latter on the file root's runs made.
func TestLockSharedFile(t *testing.T) {
	if dir := os.Getenv("AGENTSANDBOX_LOCK_DIR"); dir != "" {
		t.Setenv("TMPDIR", dir) // the directory another user's lock file is in
	} else {
		t.Setenv("TMPDIR", t.TempDir())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	unlock, err := lock(ctx, "locktest", "agentsandbox/locktest:1", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(os.TempDir(), "agentsandbox-image-locktest.lock"))
	if err != nil || fi.Mode().Perm()&0o444 != 0o444 {
		t.Errorf("lock file: %v, %v; want readable by all", fi.Mode(), err)
	}
	var said bytes.Buffer
	got := make(chan error, 1)
	go func() {
		unlock2, err := lock(ctx, "locktest", "agentsandbox/locktest:1", &said)
		if err == nil {
			unlock2()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second lock was taken while the first was held: %v", err)
	case <-time.After(3 * lockPoll):
	}
	unlock()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(said.String(), "waiting for another process") {
		t.Errorf("the waiting taker said %q", said.String())
	}
}
