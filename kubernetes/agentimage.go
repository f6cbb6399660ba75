package kubernetes

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"

	"github.com/agentsandbox/sandbox/driver/agentbin"
)

// AgentImage returns the name of the agent's image for this version of
// the library: "agentsandbox.dev/agent:" and a hash of the agent's
// binaries. Nodes must have it (loaded, or pulled from a registry the
// cluster reaches: publish it there and set Config.AgentImage).
func AgentImage() string {
	h := sha256.New()
	for _, arch := range []string{"amd64", "arm64"} {
		bin, _, _ := agentbin.Binary(arch)
		h.Write(bin)
	}
	return "agentsandbox.dev/agent:" + hex.EncodeToString(h.Sum(nil)[:8])
}

// WriteAgentImage writes the agent's image for arch ("amd64" or "arm64")
// to w as a docker-archive tar named AgentImage(): one file, /agent. Load
// it with `docker load` or `ctr -n k8s.io images import`, and push it to a
// registry with the tools of your choice (for a cluster of both
// architectures, push both under one multi-architecture index).
func WriteAgentImage(w io.Writer, arch string) error {
	bin, _, err := agentbin.Binary(arch)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	lt := tar.NewWriter(&layer)
	lt.WriteHeader(&tar.Header{Name: "agent", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, Format: tar.FormatPAX})
	lt.Write(bin)
	if err := lt.Close(); err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": arch,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": []string{"/agent"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(layerSum[:])}},
	})
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	layerName := hex.EncodeToString(layerSum[:]) + "/layer.tar"
	manifest, _ := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{AgentImage()}, "Layers": []string{layerName},
	}})
	tw := tar.NewWriter(w)
	for _, f := range []struct {
		name string
		data []byte
	}{{configName, config}, {layerName, layer.Bytes()}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("kubernetes: writing the agent image: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("kubernetes: writing the agent image: %w", err)
		}
	}
	return tw.Close()
}
