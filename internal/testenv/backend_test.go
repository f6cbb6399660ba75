package testenv

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/driver"
)

// setSuite sets the backend the helpers ask for the test's duration.
func setSuite(t *testing.T, caps driver.Caps, err error) {
	old := suite
	t.Cleanup(func() { suite = old })
	suite.drv, suite.caps, suite.err = nil, caps, err
	if err == nil {
		suite.drv = struct{ driver.Driver }{}
	}
}

// A backend that lacks what a test needs is a decision, a skip also under
// CI=true; a backend that cannot be asked is a missing piece of the
// environment, a failure under CI=true.
func TestRequiresNotOn(t *testing.T) {
	t.Setenv("CI", "true")
	rootless := driver.Caps{Engine: driver.EnginePodmanRootless, NoResourceLimits: true}
	setSuite(t, rootless, nil)
	r := &recordTB{TB: t}
	Requires(r, ResourceLimits, DiskExt4)
	if r.fatal != "" || !strings.Contains(r.skip, "not applicable on podman-rootless") ||
		!strings.Contains(r.skip, "needs resource limits") || !strings.Contains(r.skip, "the working directory is a tmpfs here") {
		t.Errorf("Requires(ResourceLimits, DiskExt4) on rootless Podman: fatal %q, skip %q", r.fatal, r.skip)
	}
	r = &recordTB{TB: t}
	NotOn(r, "its events", Podman...)
	if r.fatal != "" || r.skip != "not applicable on podman-rootless: its events" {
		t.Errorf("NotOn(Podman) on rootless Podman: fatal %q, skip %q", r.fatal, r.skip)
	}
	r = &recordTB{TB: t}
	Requires(r, Root)
	if root := os.Geteuid() == 0; r.fatal != "" || root != (r.skip == "") || (!root && !strings.HasPrefix(r.skip, "not applicable: needs root: the tests run as uid")) {
		t.Errorf("Requires(Root) as uid %d: fatal %q, skip %q", os.Geteuid(), r.fatal, r.skip)
	}

	setSuite(t, driver.Caps{Engine: driver.EngineDocker, Disk: driver.DiskExt4}, nil)
	r = &recordTB{TB: t}
	Requires(r, ResourceLimits, DiskExt4)
	NotOn(r, "its events", Podman...)
	if r.fatal != "" || r.skip != "" {
		t.Errorf("on Docker as root: fatal %q, skip %q, want neither", r.fatal, r.skip)
	}

	setSuite(t, driver.Caps{}, errors.New("no engine at unix:///nowhere"))
	r = &recordTB{TB: t}
	NotOn(r, "its events", Podman...)
	if r.skip != "" || !strings.Contains(r.fatal, "CI=true: cannot skip: no backend to test: no engine at unix:///nowhere") {
		t.Errorf("without an engine under CI=true: fatal %q, skip %q, want a failure", r.fatal, r.skip)
	}
}

// Main refuses a run on an engine of another kind than the one
// AGENTSANDBOX_BACKEND names.
func TestCheckBackend(t *testing.T) {
	docker := driver.Caps{Engine: driver.EngineDocker}
	for _, c := range []struct {
		env  string
		caps driver.Caps
		ok   bool
	}{
		{"", docker, true},
		{"docker", docker, true},
		{"podman", docker, false},
		{"podman-rootless", driver.Caps{Engine: driver.EnginePodmanRootless}, true},
		{"podman", driver.Caps{Engine: driver.EnginePodmanRootless}, false},
	} {
		t.Setenv(EnvBackend, c.env)
		if why := checkBackend(c.caps); (why == "") != c.ok {
			t.Errorf("%s=%q on %v: %q", EnvBackend, c.env, c.caps.Engine, why)
		}
	}
}
