package sandbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The agentsandbox_nodocker build tag leaves the Docker backend out of the
// root package: no Docker SDK package, no OpenTelemetry (which the SDK
// brings), no Docker plumbing of the library's own. Without the tag they
// are there (so the check below can fail). No engine: it asks the go tool.
func TestUnitNoDocker(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH:", err)
	}
	deps := func(tags string) []string {
		t.Helper()
		out, err := exec.Command(gotool, "list", "-deps", "-tags="+tags, ".").Output()
		if err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				t.Fatalf("go list -deps -tags=%q: %v: %s", tags, err, ee.Stderr)
			}
			t.Fatalf("go list -deps -tags=%q: %v", tags, err)
		}
		return strings.Fields(string(out))
	}
	dockerish := func(pkg string) bool {
		return strings.HasPrefix(pkg, "github.com/docker/") || strings.HasPrefix(pkg, "go.opentelemetry.io/") ||
			pkg == "github.com/agentsandbox/sandbox/docker" || strings.HasPrefix(pkg, "github.com/agentsandbox/sandbox/internal/engine")
	}
	var with []string
	for _, p := range deps("") {
		if strings.HasPrefix(p, "github.com/docker/") {
			with = append(with, p)
		}
	}
	if len(with) == 0 {
		t.Fatal("the default build links no github.com/docker/ package: the Docker default is gone, or go list answered nothing")
	}
	for _, p := range deps("agentsandbox_nodocker") {
		if dockerish(p) {
			t.Errorf("built with agentsandbox_nodocker, the root package still depends on %s", p)
		}
	}
}
