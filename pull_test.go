package sandbox_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/docker/docker/api/types/image"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/driver/owner"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// testRegistry is a registry of one image, served on loopback (which the
// engine treats as an insecure registry, so plain HTTP is fine): enough of
// the distribution API for docker pull. The image holds the host's static
// busybox as /bin/busybox and /bin/sh.
type testRegistry struct {
	*httptest.Server
	name, tag string

	mu       sync.Mutex
	requests []string
}

func sha(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }

func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("the registry's image needs the host's static busybox: %v", err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "busybox", Mode: 0o777})
	tw.Close()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(layer.Bytes())
	zw.Close()
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Labels": owner.Labels("test-pull", nil)},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{sha(layer.Bytes())}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.docker.distribution.manifest.v2+json",
		"config":        map[string]any{"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config), "digest": sha(config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
			"size": len(gz.Bytes()), "digest": sha(gz.Bytes())}},
	})
	blobs := map[string][]byte{sha(config): config, sha(gz.Bytes()): gz.Bytes()}

	r := &testRegistry{name: "agentsandbox-test/pulled", tag: "v1"}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.requests = append(r.requests, req.Method+" "+req.URL.Path)
		r.mu.Unlock()
		switch p := req.URL.Path; {
		case p == "/v2/":
			w.Write([]byte("{}"))
		case p == "/v2/"+r.name+"/manifests/"+r.tag || p == "/v2/"+r.name+"/manifests/"+sha(manifest):
			w.Header().Set("Content-Type", "application/vnd.docker.distribution.manifest.v2+json")
			w.Header().Set("Docker-Content-Digest", sha(manifest))
			w.Header().Set("Content-Length", fmt.Sprint(len(manifest)))
			if req.Method != http.MethodHead {
				w.Write(manifest)
			}
		case strings.HasPrefix(p, "/v2/"+r.name+"/blobs/") && blobs[strings.TrimPrefix(p, "/v2/"+r.name+"/blobs/")] != nil:
			b := blobs[strings.TrimPrefix(p, "/v2/"+r.name+"/blobs/")]
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			if req.Method != http.MethodHead {
				w.Write(b)
			}
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}`))
		}
	}))
	t.Cleanup(r.Close)
	return r
}

// ref is the image's reference, with the given tag.
func (r *testRegistry) ref(tag string) string {
	return strings.TrimPrefix(r.URL, "http://") + "/" + r.name + ":" + tag
}

func (r *testRegistry) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.requests...)
}

// TestPull: PullMissing pulls a missing image (progress in the audit log)
// and the sandbox runs it; PullNever and a registry without the image give
// ErrImageNotFound saying what to do. The registry is the test's own, on
// loopback.
func TestPull(t *testing.T) {
	testenv.NotOn(t, podmanPull, testenv.Podman...)
	t.Parallel()
	reg := newTestRegistry(t)
	ctx := testCtx(t)
	ref := reg.ref(reg.tag)
	cli := engineClient(t)
	t.Cleanup(func() { cli.ImageRemove(context.Background(), ref, image.RemoveOptions{Force: true}) })

	// The tests' environment says never (AGENTSANDBOX_PULL=never).
	_, err := sandbox.New(ctx, sandbox.WithImage(ref))
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "PullNever") {
		t.Fatalf("New of a missing image under PullNever: %v", err)
	}
	if got := reg.seen(); len(got) != 0 {
		t.Fatalf("PullNever reached the registry: %q", got)
	}

	var log bytes.Buffer
	var mu sync.Mutex
	sb, err := sandbox.New(ctx, sandbox.WithImage(ref), sandbox.WithPullPolicy(sandbox.PullMissing),
		sandbox.WithLogger(slog.New(slog.NewJSONHandler(lockedWriter{&mu, &log}, nil))))
	if err != nil {
		t.Fatalf("New with PullMissing: %v (registry saw %q)", err, reg.seen())
	}
	defer sb.Close()
	out, err := sb.Command(ctx, "/bin/busybox", "echo", "pulled").Output()
	if err != nil || string(out) != "pulled\n" {
		t.Errorf("running the pulled image: %q, %v", out, err)
	}
	mu.Lock()
	text := log.String()
	mu.Unlock()
	if !strings.Contains(text, `"msg":"sandbox.pull.progress"`) || !strings.Contains(text, `"msg":"sandbox.pull"`) ||
		strings.Count(text, `"msg":"sandbox.pull"`) != 1 {
		t.Errorf("audit log of the pull:\n%s", text)
	}
	t.Logf("registry requests: %q", reg.seen())

	// A tag the registry does not have.
	_, err = sandbox.New(ctx, sandbox.WithImage(reg.ref("nope")), sandbox.WithPullPolicy(sandbox.PullMissing))
	if !errors.Is(err, sandbox.ErrImageNotFound) || !strings.Contains(err.Error(), "pulling it failed") {
		t.Errorf("New of a tag the registry lacks: %v", err)
	}
	if _, err := sandbox.New(ctx, sandbox.WithPullPolicy(42)); err == nil {
		t.Errorf("an unknown pull policy was accepted")
	}
}
