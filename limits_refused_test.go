package sandbox_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// An OpenFiles above the engine's own hard limit (Docker here: 20000 or
// so; 1<<30 is above any) is refused by the runtime at start: New fails
// with an error naming the limit and wrapping ErrLimitsUnsupported (it
// said ErrSandboxGone, "container is gone ... error setting rlimit type
// 7"), and leaves nothing on the engine. Not parallel: the engine's
// objects of this process are compared before and after.
func TestLimitsOpenFilesAboveEngine(t *testing.T) {
	ctx := testCtx(t)
	before, err := sandboxtest.Owned(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLimits(sandbox.Limits{OpenFiles: 1 << 30}))
	if err == nil {
		sb.Close()
		t.Fatal("New with OpenFiles 1<<30: no error")
	}
	if !errors.Is(err, sandbox.ErrLimitsUnsupported) || errors.Is(err, sandbox.ErrSandboxGone) ||
		!strings.Contains(err.Error(), "Limits.OpenFiles = 1073741824") {
		t.Errorf("New with OpenFiles 1<<30: %v; want ErrLimitsUnsupported naming Limits.OpenFiles = 1073741824", err)
	}
	t.Logf("New: %v", err)
	after, err := sandboxtest.Owned(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range after {
		if !slices.ContainsFunc(before, func(b sandboxtest.Object) bool { return b.ID == o.ID }) {
			t.Errorf("left on the engine by the failed New: %+v", o)
		}
	}
}
