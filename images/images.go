// Package images builds sandbox images locally, without a container
// registry, from recipes embedded in this package: every image is made from
// Debian packages (mmdebstrap) or a host binary, imported into the Docker
// engine and tagged "agentsandbox/NAME:HASH", where HASH is derived from
// the recipe, so it is built once and rebuilt only when the recipe changes.
//
//	ref, err := images.Ensure(ctx, images.PythonSlim, os.Stderr)
//	sb, err := sandbox.New(ctx, sandbox.WithImage(ref))
//
// The recipes:
//
//   - [Busybox]: a FROM-scratch image holding the host's busybox-static
//     binary (apt-get install busybox-static), built in seconds through
//     the engine's API.
//   - [PythonSlim]: a minimal Debian bookworm root file system with python3
//     and nothing to build code with (no compilers, no headers).
//   - [Python]: the same with pip, git, numpy, pandas and matplotlib.
//
// The Python recipes run mmdebstrap (apt-get install mmdebstrap uidmap)
// and need a Debian archive and a local engine. The archive is the one the
// host's apt uses, on a Debian host (its main, updates and security
// archives, as `apt-get indextargets` lists them, used for bookworm), so a
// host behind a mirror of its own builds through it; elsewhere
// mmdebstrap's default (deb.debian.org). DEBIAN_MIRROR overrides both: a
// URI, a one-line "deb URI SUITE COMPONENTS" entry or the path of an apt
// sources file, as mmdebstrap takes its MIRROR argument. A build takes a
// minute or a few and says what it is doing on the progress writer, one
// line per step (the first names the archives) and per package
// downloaded. It needs no root: as a user with subordinate ids in
// /etc/subuid and /etc/subgid (useradd gives every new user a range)
// mmdebstrap builds in a user namespace, and the image is imported through
// the engine's API like any docker-group user's. Builds are serialized
// across processes with a file lock per image in [os.TempDir].
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
)

// Recipe names an image recipe.
type Recipe string

// The recipes.
const (
	// Busybox is a tiny image: Debian's static busybox and a sandbox user.
	Busybox Recipe = "busybox"
	// PythonSlim is Debian bookworm with python3, procps and CA
	// certificates: no compilers or development headers.
	PythonSlim Recipe = "python-slim"
	// Python is PythonSlim with pip, git, numpy, pandas and matplotlib.
	Python Recipe = "python"
)

// recipes says what each recipe is made of: a directory of recipes/ and,
// for Debian recipes, the Debian packages to include.
var recipes = map[Recipe]struct{ dir, packages string }{
	Busybox:    {dir: "busybox"},
	PythonSlim: {dir: "python", packages: "python3,procps,ca-certificates"},
	Python:     {dir: "python", packages: "python3,python3-pip,python3-numpy,python3-pandas,python3-matplotlib,git,procps,ca-certificates"},
}

//go:embed recipes
var recipeFS embed.FS

// EnvImage is the environment variable that, when set, names the image
// [FromEnv] returns instead of building [Python].
const EnvImage = "SANDBOX_IMAGE"

// LabelKey is the image label that marks an image built by this package; its
// value is the recipe name.
const LabelKey = "dev.agentsandbox.image"

// tagPrefix is the repository prefix of every tag this package makes.
const tagPrefix = "agentsandbox/"

// busyboxBinary is where Debian's busybox-static package installs the
// statically linked binary that the busybox image is made of.
const busyboxBinary = "/usr/bin/busybox"

// pythonBuildMinutes is the rough duration of a python image build, printed
// so that whoever waits knows what to expect. Measured with mmdebstrap on a
// 2-core machine: PythonSlim 40 s to 90 s, Python 4m49s while a test suite
// ran beside it (most of it unpacking and configuring; importing ~20 s).
const pythonBuildMinutes = 5

// lockPoll is how often a process waiting for another one's build retries
// the file lock.
const lockPoll = 250 * time.Millisecond

// buildWaitDelay is how long a cancelled build's script (sent SIGTERM) and
// its output pipes are given to end before they are killed and closed.
const buildWaitDelay = 30 * time.Second

// Ensure returns a local image reference for recipe, building the image
// only when no image with that reference exists yet. A note saying what is
// being built, and the build's progress, go to progress, which may be nil.
//
// The reference is "agentsandbox/NAME:HASH", where HASH is the first 12 hex
// digits of a SHA-256 over the recipe's files and packages. The Docker
// engine is found through the usual DOCKER_* environment variables.
func Ensure(ctx context.Context, recipe Recipe, progress io.Writer) (string, error) {
	log := progress
	if log == nil {
		log = io.Discard
	}
	r, ok := recipes[recipe]
	if !ok {
		return "", fmt.Errorf("images: unknown recipe %q (want %q, %q or %q)", recipe, Busybox, PythonSlim, Python)
	}
	name := string(recipe)
	hash, err := recipeHash(r.dir, r.packages)
	if err != nil {
		return "", fmt.Errorf("images: hashing recipe %s: %w", name, err)
	}
	tag := tagPrefix + name + ":" + hash

	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return "", fmt.Errorf("images: docker client: %w", err)
	}
	defer cli.Close()

	if ok, err := imageExists(ctx, cli, tag); err != nil || ok {
		return tag, err
	}

	unlock, err := lock(ctx, name, tag, log)
	if err != nil {
		return "", err
	}
	defer unlock()

	// Another process may have built it while this one waited for the lock.
	if ok, err := imageExists(ctx, cli, tag); err != nil || ok {
		return tag, err
	}

	start := time.Now()
	if recipe == Busybox {
		fmt.Fprintf(log, "images: building %s from the host's busybox-static (a few seconds)...\n", tag)
		err = buildBusybox(ctx, cli, r.dir, tag, log)
	} else {
		fmt.Fprintf(log, "images: building %s with mmdebstrap from Debian packages %s (a few minutes, up to about %d)...\n",
			tag, r.packages, pythonBuildMinutes)
		err = buildDebian(ctx, r.dir, r.packages, recipe, tag, log)
	}
	if err != nil {
		return "", fmt.Errorf("images: building %s: %w", tag, err)
	}
	info, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		return "", fmt.Errorf("images: build of %s finished but the engine has no such image: %w", tag, err)
	}
	fmt.Fprintf(log, "images: built %s in %v: %.1f MB\n", tag, time.Since(start).Round(time.Second), float64(info.Size)/1e6)
	return tag, nil
}

// FromEnv returns the image that tests and examples should run code in: the
// value of $SANDBOX_IMAGE when it is set, otherwise the [Python] image from
// [Ensure] (built if missing, with progress written to log).
func FromEnv(ctx context.Context, log io.Writer) (string, error) {
	if img := os.Getenv(EnvImage); img != "" {
		return img, nil
	}
	return Ensure(ctx, Python, log)
}

// recipeHash returns the first 12 hex digits of a SHA-256 over the
// relative names and contents of the recipe directory's files, in lexical
// order, and the package list.
func recipeHash(dir, packages string) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(recipeFS, "recipes/"+dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := recipeFS.ReadFile(p)
		if err != nil {
			return err
		}
		// Length-prefix each field so that no two different recipes hash
		// the same input.
		fmt.Fprintf(h, "%d:%s\x00%d:", len(p), p, len(data))
		h.Write(data)
		return nil
	})
	if err != nil {
		return "", err
	}
	fmt.Fprintf(h, "packages:%s", packages)
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// imageExists reports whether the engine has an image called ref.
func imageExists(ctx context.Context, cli *client.Client, ref string) (bool, error) {
	_, err := cli.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("images: inspecting image %s: %w", ref, err)
	}
}

// lock takes an exclusive flock on a per-image lock file in os.TempDir(),
// waiting (and saying so on log) while another process holds it, until ctx
// is done. The returned function releases the lock.
func lock(ctx context.Context, name, tag string, log io.Writer) (func(), error) {
	path := filepath.Join(os.TempDir(), "agentsandbox-image-"+name+".lock")
	// Every user locks the same file: it is opened read-only (all flock
	// needs), and made readable by all by whoever comes first. Opening it
	// with O_CREAT when another user made it would fail in a sticky /tmp
	// (fs.protected_regular), so it is created only where it is missing.
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if errors.Is(err, fs.ErrExist) {
			f, err = os.Open(path)
		}
		if err == nil {
			f.Chmod(0o444) // whatever the umask
		}
	}
	if err != nil {
		return nil, fmt.Errorf("images: opening lock file: %w", err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("images: locking %s: %w", path, err)
		}
		if !said {
			fmt.Fprintf(log, "images: waiting for another process to finish building %s (lock %s)...\n", tag, path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("images: waiting for lock %s: %w", path, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// buildBusybox builds the busybox recipe in dir as tag through the Docker
// API, with a build context made of the recipe's files plus the host's
// busybox-static binary.
func buildBusybox(ctx context.Context, cli *client.Client, dir, tag string, log io.Writer) error {
	bin, err := os.ReadFile(busyboxBinary)
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("busybox-static is not installed: apt-get install busybox-static")
	}
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	entries, err := recipeFS.ReadDir("recipes/" + dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := recipeFS.ReadFile("recipes/" + dir + "/" + e.Name())
		if err != nil {
			return err
		}
		if err := add(e.Name(), 0o644, data); err != nil {
			return err
		}
	}
	if err := add("busybox", 0o755, bin); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}

	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{
		Tags:        []string{tag},
		Dockerfile:  "Dockerfile",
		Remove:      true,
		ForceRemove: true,
		Labels:      map[string]string{LabelKey: string(Busybox)},
		Version:     build.BuilderV1,
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return readBuildStream(resp.Body, log)
}

// buildMessage is the part of the engine's JSON build-progress messages
// that matters here.
type buildMessage struct {
	Stream      string `json:"stream"`
	Status      string `json:"status"`
	Error       string `json:"error"`
	ErrorDetail *struct {
		Message string `json:"message"`
	} `json:"errorDetail"`
}

// readBuildStream copies the build output in the engine's JSON message
// stream r to log and returns the build's error, if it reports one.
func readBuildStream(r io.Reader, log io.Writer) error {
	dec := json.NewDecoder(r)
	for {
		var m buildMessage
		if err := dec.Decode(&m); err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("reading build output: %w", err)
		}
		if m.ErrorDetail != nil && m.ErrorDetail.Message != "" {
			return errors.New(m.ErrorDetail.Message)
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if m.Stream != "" {
			io.WriteString(log, m.Stream)
		} else if m.Status != "" {
			fmt.Fprintln(log, m.Status)
		}
	}
}

// buildDebian runs the recipe's build.sh with tag and packages, its
// output going to log. Cancelling ctx sends SIGTERM to the script's whole
// process group (mmdebstrap, docker import), whose EXIT trap removes its
// files.
func buildDebian(ctx context.Context, dir, packages string, recipe Recipe, tag string, log io.Writer) error {
	script, err := recipeFS.ReadFile("recipes/" + dir + "/build.sh")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "agentsandbox-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	path := filepath.Join(tmp, "build.sh")
	if err := os.WriteFile(path, script, 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", path, tag, packages, LabelKey+"="+string(recipe))
	cmd.Dir = tmp
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	cmd.WaitDelay = buildWaitDelay
	return cmd.Run()
}
