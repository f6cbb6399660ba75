// Package testimage builds, on demand, the local Docker images that the
// library's tests and examples run sandboxed code in.
//
// No container registry is reachable where the tests run, so nothing is
// pulled: every image is built locally from a recipe under
// testdata/images/NAME in this repository. An image is tagged
// "agentsandbox-test/NAME:HASH", where HASH is derived from the recipe's
// files, so it is built once and rebuilt only when its recipe changes.
//
// Two recipes exist:
//
//   - [Busybox]: a FROM-scratch image holding Debian's busybox-static binary,
//     built in seconds through the Docker API.
//   - [Python]: a Debian bookworm root file system made with debootstrap,
//     holding python3 with numpy, pandas and matplotlib, built by
//     testdata/images/python/build.sh in a few minutes.
//
// Builds are serialized across processes (go test ./... runs several test
// binaries at once) with a file lock per image in [os.TempDir].
package testimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
)

// Busybox names the tiny busybox image recipe (testdata/images/busybox).
const Busybox = "busybox"

// Python names the Debian python3 + numpy/pandas/matplotlib image recipe
// (testdata/images/python).
const Python = "python"

// EnvImage is the environment variable that, when set, names the image
// [FromEnv] returns instead of building [Python].
const EnvImage = "SANDBOX_IMAGE"

// LabelKey is the image label that marks an image built by this package; its
// value is the recipe name.
const LabelKey = "dev.agentsandbox.testimage"

// tagPrefix is the repository prefix of every tag this package makes.
const tagPrefix = "agentsandbox-test/"

// busyboxBinary is where Debian's busybox-static package installs the
// statically linked binary that the busybox image is made of.
const busyboxBinary = "/usr/bin/busybox"

// pythonBuildMinutes is the rough duration of a python image build, printed
// so that whoever waits knows what to expect. Measured on a 2-core machine:
// 3m10s on an idle machine (about 1 min downloading, 2 min unpacking and
// configuring, 20 s importing), up to 8 min while other work competes.
const pythonBuildMinutes = 4

// lockPoll is how often a process waiting for another one's build retries
// the file lock.
const lockPoll = 250 * time.Millisecond

// Ensure returns a local image reference for the recipe called name
// ([Busybox] or [Python]), building the image only when no image with that
// reference exists yet. Build progress and a note saying what is being built
// go to log, which may be nil.
//
// The reference is "agentsandbox-test/NAME:HASH", where HASH is the first 12
// hex digits of a SHA-256 over the names and contents of the recipe's files.
// The Docker engine is found through the usual DOCKER_* environment
// variables.
func Ensure(ctx context.Context, name string, log io.Writer) (string, error) {
	if log == nil {
		log = io.Discard
	}
	if name != Busybox && name != Python {
		return "", fmt.Errorf("testimage: unknown image %q (want %q or %q)", name, Busybox, Python)
	}
	dir, err := RecipeDir(name)
	if err != nil {
		return "", err
	}
	hash, err := recipeHash(dir)
	if err != nil {
		return "", fmt.Errorf("testimage: hashing recipe %s: %w", dir, err)
	}
	tag := tagPrefix + name + ":" + hash

	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return "", fmt.Errorf("testimage: docker client: %w", err)
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

	switch name {
	case Busybox:
		fmt.Fprintf(log, "testimage: building image %s from testdata/images/%s (a few seconds)...\n", tag, name)
		err = buildBusybox(ctx, cli, dir, tag, log)
	case Python:
		fmt.Fprintf(log, "testimage: building image %s from testdata/images/%s (debootstrap, about %d minutes)...\n", tag, name, pythonBuildMinutes)
		err = buildPython(ctx, dir, tag, log)
	}
	if err != nil {
		return "", fmt.Errorf("testimage: building %s: %w", tag, err)
	}
	ok, err := imageExists(ctx, cli, tag)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("testimage: build of %s finished but the engine has no such image", tag)
	}
	fmt.Fprintf(log, "testimage: built %s\n", tag)
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

// RecipeDir returns the absolute path of testdata/images/NAME in this
// repository. It is found from this source file's location, so it works from
// any package's tests and from go run inside the module; when the source path
// is not usable (a -trimpath build), it falls back to searching upward from
// the working directory.
func RecipeDir(name string) (string, error) {
	rel := filepath.Join("testdata", "images", name)
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		// file is <root>/internal/testimage/testimage.go.
		dir := filepath.Join(filepath.Dir(file), "..", "..", rel)
		if isDir(dir) {
			return filepath.Clean(dir), nil
		}
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testimage: locating %s: %w", rel, err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if dir := filepath.Join(d, rel); isDir(dir) {
			return dir, nil
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Errorf("testimage: cannot find %s from this source file or above %s", rel, wd)
}

// isDir reports whether path names an existing directory.
func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// recipeHash returns the first 12 hex digits of a SHA-256 over the relative
// names and contents of the regular files under dir, in lexical order.
func recipeHash(dir string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, path := range files {
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return "", err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		// Length-prefix each field so that no two different recipes hash
		// the same input.
		fmt.Fprintf(h, "%d:%s\x00%d:", len(rel), filepath.ToSlash(rel), len(data))
		h.Write(data)
	}
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
		return false, fmt.Errorf("testimage: inspecting image %s: %w", ref, err)
	}
}

// lock takes an exclusive flock on a per-image lock file in os.TempDir(),
// waiting (and saying so on log) while another process holds it, until ctx
// is done. The returned function releases the lock.
func lock(ctx context.Context, name, tag string, log io.Writer) (func(), error) {
	path := filepath.Join(os.TempDir(), "agentsandbox-testimage-"+name+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("testimage: opening lock file: %w", err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("testimage: locking %s: %w", path, err)
		}
		if !said {
			fmt.Fprintf(log, "testimage: waiting for another process to finish building %s (lock %s)...\n", tag, path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("testimage: waiting for lock %s: %w", path, ctx.Err())
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
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
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
		Labels:      map[string]string{LabelKey: Busybox},
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

// buildPython runs the python recipe's build.sh with tag, its output going
// to log. Cancelling ctx sends SIGTERM to the script's whole process group
// (debootstrap, tar, docker import), whose EXIT trap removes the root file
// system.
func buildPython(ctx context.Context, dir, tag string, log io.Writer) error {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "build.sh"), tag)
	cmd.Dir = dir
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	cmd.WaitDelay = 30 * time.Second
	return cmd.Run()
}
