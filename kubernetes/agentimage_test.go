package kubernetes

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"slices"
	"testing"

	"github.com/agentsandbox/sandbox/driver/agentbin"
)

// The agent's image archive (no cluster): a docker-archive named
// AgentImage() for the arch, whose one layer holds the agent as /agent,
// executable, its entrypoint; the same bytes each time.
func TestUnitWriteAgentImage(t *testing.T) {
	var a, b bytes.Buffer
	if err := WriteAgentImage(&a, "arm64"); err != nil {
		t.Fatal(err)
	}
	if err := WriteAgentImage(&b, "arm64"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two archives of the same image differ")
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&a)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("manifest.json %q: %v", files["manifest.json"], err)
	}
	m := manifest[0]
	if !slices.Equal(m.RepoTags, []string{AgentImage()}) || len(m.Layers) != 1 {
		t.Fatalf("manifest %+v, want the tag %s and one layer", m, AgentImage())
	}
	var config struct {
		Architecture, OS string
		Config           struct{ Entrypoint []string }
		RootFS           struct{ Type string } `json:"rootfs"`
	}
	if err := json.Unmarshal(files[m.Config], &config); err != nil {
		t.Fatalf("config %q: %v", files[m.Config], err)
	}
	if config.Architecture != "arm64" || config.OS != "linux" || !slices.Equal(config.Config.Entrypoint, []string{"/agent"}) || config.RootFS.Type != "layers" {
		t.Errorf("config %s", files[m.Config])
	}
	zr, err := gzip.NewReader(bytes.NewReader(files[m.Layers[0]]))
	if err != nil {
		t.Fatalf("layer %s: %v", m.Layers[0], err)
	}
	lr := tar.NewReader(zr)
	h, err := lr.Next()
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(lr)
	if err != nil {
		t.Fatal(err)
	}
	want, _, _ := agentbin.Binary("arm64")
	if h.Name != "agent" || h.Mode != 0o755 || !bytes.Equal(got, want) {
		t.Errorf("layer entry %s mode %o, %d bytes; want agent, 755, the agent's %d bytes", h.Name, h.Mode, len(got), len(want))
	}
	if _, err := lr.Next(); err != io.EOF {
		t.Errorf("a second entry in the layer: %v", err)
	}
	if err := WriteAgentImage(io.Discard, "riscv64"); err == nil {
		t.Error("WriteAgentImage(riscv64) = nil, want an error")
	}
}
