package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
)

// The engine's answers as the docker client returns them: a class from the
// HTTP status (errdefs) and the daemon's message.
func TestClassify(t *testing.T) {
	conflict := func(msg string) error {
		return fmt.Errorf("Error response from daemon: %s: %w", msg, cerrdefs.ErrConflict)
	}
	forbidden := func(msg string) error {
		return fmt.Errorf("Error response from daemon: %s: %w", msg, cerrdefs.ErrPermissionDenied)
	}
	notFound := fmt.Errorf("Error response from daemon: No such container: 1234: %w", cerrdefs.ErrNotFound)
	inProgress := conflict("removal of container 1234 is already in progress")
	volumeInUse := conflict("remove asb-vol: volume is in use - [1234]")
	endpoints := forbidden("error while removing network: network agentsandbox-ab id 99 has active endpoints")
	overlap := forbidden("invalid pool request: Pool overlaps with other one on this address space")
	imageGone := errors.New("Error response from daemon: unrecognized image ID sha256:abcd")
	plain := errors.New("Error response from daemon: something else")

	cases := []struct {
		name                                      string
		err                                       error
		notFound, conflict, progress, gone, inUse bool
		overlap                                   bool
	}{
		{"not found", notFound, true, false, false, true, false, false},
		{"removal in progress", inProgress, false, true, true, true, true, false},
		{"volume in use", volumeInUse, false, true, false, false, true, false},
		{"network has endpoints", endpoints, false, false, false, false, true, false},
		{"subnet overlap", overlap, false, false, false, false, false, true},
		{"image went", imageGone, false, false, false, true, false, false},
		{"other", plain, false, false, false, false, false, false},
		{"nil", nil, false, false, false, false, false, false},
	}
	for _, c := range cases {
		got := [6]bool{IsNotFound(c.err), IsConflict(c.err), IsRemovalInProgress(c.err), IsGone(c.err), IsInUse(c.err), IsSubnetOverlap(c.err)}
		want := [6]bool{c.notFound, c.conflict, c.progress, c.gone, c.inUse, c.overlap}
		if got != want {
			t.Errorf("%s: NotFound, Conflict, RemovalInProgress, Gone, InUse, SubnetOverlap = %v, want %v", c.name, got, want)
		}
		// None of them is the engine being unreachable.
		if c.err != nil && IsUnreachable(c.err) {
			t.Errorf("%s: IsUnreachable", c.name)
		}
	}
}

// The engine's answer (seen here, Docker 20.10) when a container's
// entrypoint is missing: the agent's volume emptied behind the library.
func TestIsMissingEntrypoint(t *testing.T) {
	err := errors.New(`Error response from daemon: failed to create shim task: OCI runtime create failed: runc create failed: ` +
		`unable to start container process: exec: "/.sandbox-agent/agent": stat /.sandbox-agent/agent: no such file or directory: unknown`)
	if !IsMissingEntrypoint(err, "/.sandbox-agent/agent") {
		t.Error("not recognised")
	}
	if IsMissingEntrypoint(err, "/bin/sh") || IsMissingEntrypoint(errors.New("no such file or directory"), "/.sandbox-agent/agent") || IsMissingEntrypoint(nil, "x") {
		t.Error("recognised wrongly")
	}
}

// The refusals a container's state may explain, as the client returns
// them for the engine's HTTP statuses (404, 409, 500).
func TestMayBeState(t *testing.T) {
	for class, want := range map[error]bool{cerrdefs.ErrNotFound: true, cerrdefs.ErrConflict: true, cerrdefs.ErrInternal: true,
		cerrdefs.ErrUnknown: true, cerrdefs.ErrInvalidArgument: false, cerrdefs.ErrPermissionDenied: false} {
		err := fmt.Errorf("Error response from daemon: x: %w", class)
		if got := MayBeState(err); got != want {
			t.Errorf("%v: MayBeState = %v, want %v", class, got, want)
		}
	}
	if MayBeState(errors.New("plain")) || MayBeState(context.Canceled) {
		t.Error("MayBeState of a plain error or a cancel")
	}
}

// Podman 4.3's answer to a forced remove of a container that is stopping
// on its own (seen here: its agent had just exited).
func TestIsStopping(t *testing.T) {
	stopping := fmt.Errorf("Error response from daemon: cannot remove container f5ca as it could not be stopped: sending SIGKILL to container f5ca: container state improper: stopped: %w", cerrdefs.ErrUnknown)
	if !IsStopping(stopping) || IsGone(stopping) {
		t.Errorf("Podman's stopping container: IsStopping %v, IsGone %v; want true, false", IsStopping(stopping), IsGone(stopping))
	}
	for _, err := range []error{nil, errors.New("Error response from daemon: something else")} {
		if IsStopping(err) {
			t.Errorf("IsStopping(%v)", err)
		}
	}
}

// No error is no failure of any kind, and asking does not panic.
func TestClassifyNil(t *testing.T) {
	preds := map[string]func(error) bool{
		"IsNotFound": IsNotFound, "IsConflict": IsConflict,
		"IsRemovalInProgress": IsRemovalInProgress, "IsGone": IsGone,
		"IsStopping": IsStopping, "IsInUse": IsInUse,
		"IsSubnetOverlap": IsSubnetOverlap, "IsTimeout": IsTimeout,
		"IsUnreachable": IsUnreachable, "MayBeState": MayBeState,
		"IsMissingEntrypoint": func(err error) bool { return IsMissingEntrypoint(err, "/x") },
	}
	for name, p := range preds {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s(nil) panics: %v", name, r)
				}
			}()
			if p(nil) {
				t.Errorf("%s(nil) = true, want false", name)
			}
		}()
	}
}
