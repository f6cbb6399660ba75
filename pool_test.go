package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// poolContainers counts the containers carrying the test's pool label.
func poolContainers(t *testing.T, label string) int {
	t.Helper()
	cs, err := engineClient(t).ContainerList(testCtx(t), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", "test.pool="+label))})
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}

// waitPoolContainers waits until n containers carry the label.
func waitPoolContainers(t *testing.T, label string, n int) {
	t.Helper()
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		got := poolContainers(t, label)
		return got == n, fmt.Sprintf("%d containers of the pool, want %d", got, n)
	})
}

// Get hands out started sandboxes, each once, and the pool refills; Close
// removes what it holds, and Get afterwards says the pool is closed.
func TestPoolGet(t *testing.T) {
	t.Parallel()
	label := t.Name()
	p, err := sandbox.NewPool(testCtx(t), 2, sandbox.WithImage(busyboxImage),
		sandbox.WithLabels(map[string]string{"test.pool": label}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	seen := map[string]bool{}
	for i := range 3 { // one more than the pool holds: the third waits for a refill
		sb, err := p.Get(testCtx(t))
		if err != nil {
			t.Fatalf("Get %d: %v", i, err)
		}
		if seen[sb.ID()] {
			t.Fatalf("Get %d handed out %s again", i, sb.ID())
		}
		seen[sb.ID()] = true
		if r := mustExec(t, sb, "echo ok"); r.Stdout != "ok\n" {
			t.Errorf("Exec in a pooled sandbox: %+v", r)
		}
		if err := sb.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	waitPoolContainers(t, label, 2) // refilled
	st := p.Stats()
	if st.Handed != 3 || st.Created+st.Creating < 5 || st.Failures != 0 || st.LastErr != nil {
		t.Errorf("Stats = %+v", st)
	}
	if err := p.Close(); err != nil {
		t.Errorf("pool Close: %v", err)
	}
	waitPoolContainers(t, label, 0)
	if _, err := p.Get(testCtx(t)); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Get after Close: %v, want ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// Close while the pool is starting its sandboxes removes them too.
func TestPoolCloseWhileFilling(t *testing.T) {
	t.Parallel()
	label := t.Name()
	p, err := sandbox.NewPool(testCtx(t), 4, sandbox.WithImage(busyboxImage),
		sandbox.WithLabels(map[string]string{"test.pool": label}))
	if err != nil {
		t.Fatal(err)
	}
	// Once the first container exists, the pool is mid-fill.
	sandboxtest.Eventually(t, testenv.HangGuard, func() (bool, string) {
		return poolContainers(t, label) > 0, "no container of the pool"
	})
	t.Logf("closing with %+v", p.Stats())
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitPoolContainers(t, label, 0)
}

// A Get that has to wait ends with its context.
func TestPoolGetCancelled(t *testing.T) {
	t.Parallel()
	p, err := sandbox.NewPool(testCtx(t), 1, sandbox.WithImage(busyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sb, err := p.Get(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	// The refill takes a container start; none is ready right after Get.
	if sb2, err := p.Get(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a cancelled context and nothing ready: %v, %v", sb2, err)
		if sb2 != nil {
			sb2.Close()
		}
	}
}

// While the engine cannot be reached, Get returns the error instead of
// waiting, and the pool backs off instead of spinning.
func TestPoolEngineError(t *testing.T) {
	t.Parallel()
	p, err := sandbox.NewPool(testCtx(t), 2, sandbox.WithImage(busyboxImage),
		sandbox.WithHost("unix:///nonexistent/agentsandbox-pool-test.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		if _, err := p.Get(testCtx(t)); !errors.Is(err, sandbox.ErrEngineUnavailable) {
			t.Fatalf("Get %d on an unreachable engine: %v, want ErrEngineUnavailable", i, err)
		}
	}
	st := p.Stats()
	if st.Failures < 1 || !errors.Is(st.LastErr, sandbox.ErrEngineUnavailable) || st.Created != 0 {
		t.Errorf("Stats = %+v", st)
	}
	t.Logf("Stats after three Gets: %+v", st)
}

// Bad options are refused by NewPool itself.
func TestPoolBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := sandbox.NewPool(testCtx(t), 0); err == nil {
		t.Error("NewPool of size 0 succeeded")
	}
	if _, err := sandbox.NewPool(testCtx(t), 1, sandbox.WithUser("bob smith")); err == nil {
		t.Error("NewPool with a bad user succeeded")
	}
}
