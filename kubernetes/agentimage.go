package kubernetes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentsandbox/sandbox/driver/agentbin"
)

// AgentImage returns the name of the agent's image for this version of
// the library: "agentsandbox.dev/agent:" and a hash of the agent's
// binaries. Nodes must have it (loaded, or pulled from a registry the
// cluster reaches: publish it there and set Config.AgentImage).
func AgentImage() string {
	h := sha256.New()
	for _, arch := range []string{"amd64", "arm64"} {
		bin, _, err := agentbin.Binary(arch)
		if err != nil {
			panic(err) // both are embedded: the build fails without them
		}
		h.Write(bin)
	}
	return "agentsandbox.dev/agent:" + hex.EncodeToString(h.Sum(nil)[:8])
}

// WriteAgentImage writes the agent's image for arch ("amd64" or "arm64")
// to w as a docker-archive tar named AgentImage(): one file, /agent. Load
// it with `docker load` or `ctr -n k8s.io images import`, and push it to a
// registry with the tools of your choice (for a cluster of both
// architectures, push both under one multi-architecture index). The
// archive is the same for the same library and arch.
func WriteAgentImage(w io.Writer, arch string) error {
	bin, _, err := agentbin.Binary(arch)
	if err != nil {
		return err
	}
	if err := writeImage(w, AgentImage(), arch, bin); err != nil {
		return fmt.Errorf("kubernetes: writing the agent image: %w", err)
	}
	return nil
}

// writeImage writes a docker-archive of the image ref for linux/arch whose
// one layer holds bin as /agent, its entrypoint.
func writeImage(w io.Writer, ref, arch string, bin []byte) error {
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	if err := lt.WriteHeader(&tar.Header{Name: "agent", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := lt.Write(bin); err != nil {
		return err
	}
	if err := lt.Close(); err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layer.Bytes())), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: arch, OS: "linux", Config: v1.Config{Entrypoint: []string{"/agent"}},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return err
	}
	if img, err = mutate.AppendLayers(img, l); err != nil { // sets the config's diff_ids
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.Write(tag, img, w)
}
