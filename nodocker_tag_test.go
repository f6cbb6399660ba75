//go:build agentsandbox_nodocker

package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Built with agentsandbox_nodocker there is no DefaultDriver: a sandbox
// needs WithDriver, and the error of one without says so. WithHost, a
// Docker option, is refused. Run with
// go test -tags agentsandbox_nodocker -run TestUnitNoDockerTag .
func TestUnitNoDockerTag(t *testing.T) {
	ctx := context.Background()
	if DefaultDriver != nil {
		t.Fatalf("DefaultDriver = %T, want nil", DefaultDriver)
	}
	if _, err := New(ctx); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "WithDriver") {
		t.Errorf("New without WithDriver: %v, want ErrNoDriver naming WithDriver", err)
	}
	if _, err := Prune(ctx); !errors.Is(err, ErrNoDriver) {
		t.Errorf("Prune: %v, want ErrNoDriver", err)
	}
	if _, err := New(ctx, WithHost("unix:///var/run/docker.sock")); !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "agentsandbox_nodocker") {
		t.Errorf("WithHost: %v, want ErrNoDriver naming the tag", err)
	}
	refused := errors.New("the fake backend refuses")
	fd := &fakeDriver{err: refused}
	if _, err := New(ctx, WithDriver(fd)); !errors.Is(err, refused) || len(fd.specs) != 1 {
		t.Errorf("New with WithDriver: %v (%d creates), want the backend asked", err, len(fd.specs))
	}
}
