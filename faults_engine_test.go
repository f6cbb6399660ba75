package sandbox_test

// Faults of the engine itself (see faults_test.go for the harness and
// the rules these tests follow): an engine that stops answering during
// New, one that disappears in the middle of a call, the caller's context
// cancelled at every engine request of a call; and the connection a
// driver's sandboxes share.

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/docker/docker/client"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/docker"
	"github.com/agentsandbox/sandbox/internal/faultproxy"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// TestFaultEngineFrozenNew: the engine stops answering (the proxy freezes)
// when one of New's requests goes by; the caller's context has no
// deadline, the sandbox's bound is faultBound. New fails with
// ErrUnresponsive (and ErrEngineUnavailable) within a few bounds; after
// the engine answers again, nothing of it is left.
func TestFaultEngineFrozenNew(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for i, tc := range []struct {
		name    string
		method  string
		path    string
		replies bool // only the replies freeze: the request is carried out
	}{
		{"image inspect", "GET", "/images/", false},
		{"volume create", "POST", "/volumes/create", false},
		{"volume create reply", "POST", "/volumes/create", true},
		{"container create", "POST", "/containers/create", false},
		{"container create reply", "POST", "/containers/create", true},
		{"attach", "POST", "/attach", false},
		{"start", "POST", "/start", false},
		{"start reply", "POST", "/start", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startFaultProxy(t)
			// One driver through the proxy for the whole subtest: it
			// remembers what the frozen engine did not answer. Used once
			// first, so that it knows the engine and New's first request
			// is the image's.
			drv := docker.New(docker.Config{Host: "unix://" + p.Path, Timeout: faultBound})
			defer drv.Close()
			warm, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
			if err != nil {
				t.Fatal(err)
			}
			warm.Close()
			before := takeInventory(t, cli)
			var frozeAt atomic.Value
			p.OnRequest(func(r faultproxy.Request) {
				if r.Method == tc.method && strings.Contains(r.Path, tc.path) && frozeAt.Load() == nil {
					frozeAt.Store(r.String())
					if tc.replies {
						p.FreezeReplies()
					} else {
						p.Freeze()
					}
				}
			})
			var sb *sandbox.Sandbox
			d, err := timed(t, "New", 10*faultBound, func() error {
				var err error
				sb, err = sandbox.New(context.Background(), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv), sandbox.WithTestTimeout(faultBound))
				return err
			})
			t.Logf("froze at %v; New took %.1f bounds", frozeAt.Load(), float64(d)/float64(faultBound))
			p.Thaw()
			// Held requests reach the engine now; wait until it has
			// answered them all (every connection through the proxy has
			// closed once the driver lets go of its idle ones), so that
			// what they make is seen below.
			drv.CloseIdleConnections()
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = sandboxtest.Poll(cctx, 50*time.Millisecond, func() (bool, string) {
				drv.CloseIdleConnections()
				return p.Conns() == 0, ""
			})
			cancel()
			t.Logf("connections still open through the proxy after the thaw: %v", p.Open())
			if err == nil {
				t.Errorf("WRONG ERROR: New with the engine frozen at %v succeeded", frozeAt.Load())
				timed(t, "Close", hangGuard, sb.Close)
			} else if !errors.Is(err, sandbox.ErrUnresponsive) || !errors.Is(err, sandbox.ErrEngineUnavailable) {
				t.Errorf("WRONG ERROR: New with the engine frozen: %v; want ErrUnresponsive and ErrEngineUnavailable", err)
			}
			// A request the engine did not answer may have been carried out
			// after the thaw (a create), or not (a removal): the library
			// driver remembers those objects and removes them at its
			// next Close of a sandbox, or at its Prune.
			if i%2 == 0 {
				_, err = timed(t, "New and Close through the thawed proxy", hangGuard, func() error {
					sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(drv))
					if err != nil {
						return err
					}
					return sb.Close()
				})
			} else {
				_, err = timed(t, "Prune", hangGuard, func() error { _, err := drv.Prune(testCtx(t)); return err })
			}
			if err != nil {
				t.Error(err)
			}
			settle(t, cli, before, 30*time.Second, "New failed on a frozen engine, then thawed, then the next Close or Prune")
		})
	}
}

// TestFaultEngineCut: the engine disappears (the proxy closes every
// connection and refuses new ones) while a command runs, before a file
// write, while a file is read, or while New runs. Calls fail with ErrEngineUnavailable (or
// ErrSandboxGone, where the attach stream's end says so first) promptly;
// Close returns. The container ends by itself once its attach stream is
// gone (unless paused); what the library could not remove is removed here
// through the real socket.
func TestFaultEngineCut(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	for _, tc := range []struct {
		name   string
		method string // cut when this request goes by ("" = cut before the call)
		suffix string
		call   func(ctx context.Context, sb *sandbox.Sandbox) error
	}{
		{name: "Exec running", call: nil},
		{name: "before WriteFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			return sb.WriteFile(ctx, "g", []byte("y"), 0o644)
		}},
		{name: "before Exec", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			_, err := sb.Exec(ctx, "true")
			return err
		}},
		{name: "before ReadFile", call: func(ctx context.Context, sb *sandbox.Sandbox) error {
			_, err := sb.ReadFile(ctx, "f")
			return err
		}},
		{name: "during New", method: "POST", suffix: "/containers/create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			p := startFaultProxy(t)
			opts := []sandbox.Option{sandbox.WithImage(busyboxImage), viaProxy(p), sandbox.WithTestTimeout(sandboxBound)}
			if tc.name == "during New" {
				p.OnRequest(func(r faultproxy.Request) {
					if r.Method == tc.method && strings.Contains(r.Path, tc.suffix) {
						p.Cut()
					}
				})
				_, err := timed(t, "New", hangGuard, func() error {
					sb, err := sandbox.New(context.Background(), opts...)
					if err == nil {
						sb.Close()
					}
					return err
				})
				if !errors.Is(err, sandbox.ErrEngineUnavailable) {
					t.Errorf("WRONG ERROR: New with the engine gone: %v; want ErrEngineUnavailable", err)
				}
				cutLeftovers(t, cli, before)
				return
			}
			sb := newFaultSandbox(t, opts[1:]...)
			id := sb.ID()
			var err error
			if err := sb.WriteFile(testCtx(t), "f", []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.call == nil { // Exec running
				done := make(chan error, 1)
				go func() { _, err := sb.Exec(context.Background(), "sleep 30"); done <- err }()
				waitProcess(t, cli, id, "sleep 30")
				p.Cut()
				_, err = timed(t, "Exec when cut", hangGuard, func() error { return <-done })
			} else {
				if tc.method == "" {
					p.Cut()
				} else {
					want := "/containers/" + id + tc.suffix
					p.OnRequest(func(r faultproxy.Request) {
						if r.Method == tc.method && strings.Contains(r.Path, want) {
							p.Cut()
						}
					})
				}
				_, err = timed(t, tc.name, hangGuard, func() error { return tc.call(context.Background(), sb) })
			}
			if !errors.Is(err, sandbox.ErrEngineUnavailable) && !errors.Is(err, sandbox.ErrSandboxGone) {
				t.Errorf("WRONG ERROR: %s with the engine gone: %v; want ErrEngineUnavailable or ErrSandboxGone", tc.name, err)
			}
			_, err = timed(t, "Close", hangGuard, sb.Close)
			if err == nil {
				t.Logf("Close with the engine gone returned nil")
			}
			cutLeftovers(t, cli, before)
		})
	}
}

// cutLeftovers reports what a sandbox whose engine went away left: its
// container should end by itself (its attach stream is gone) unless it is
// paused (its init is frozen, and only the engine can end it, once the
// library reaches it again, at Close or Prune); its volume
// the library could not remove. All are then removed through the real
// socket.
func cutLeftovers(t testing.TB, cli *client.Client, before inventory) {
	t.Helper()
	// Only a sandbox's container that is not paused has a process that
	// ends it; a helper container (never started) stays until removed.
	ending := func(s string) bool {
		return strings.HasPrefix(s, "container ") && strings.Contains(s, " sandbox") && !strings.HasSuffix(s, "(paused)")
	}
	// The wait's end is checked below, one container at a time.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var left []string
	_ = sandboxtest.Poll(ctx, 100*time.Millisecond, func() (bool, string) {
		left = takeInventory(t, cli).minus(before)
		return !slices.ContainsFunc(left, ending), ""
	})
	for _, s := range left {
		if ending(s) {
			t.Errorf("LEFT: the sandbox's container did not end by itself after the engine connection was cut: %s", s)
		}
	}
	if len(left) > 0 {
		t.Logf("left after the cut (removed now through the real socket): %v", left)
	}
	removeExtra(t, cli, before)
	settle(t, cli, before, 20*time.Second, "cleanup")
}

// TestFaultCancelEveryStep: for k = 1, 2, ..., the caller's context is
// cancelled when the k-th engine request of a call goes by, until the call
// gets through all its requests without the cancel. Every cancelled call
// fails with context.Canceled and leaves nothing behind (engine objects,
// loop devices), and the sandbox it worked on (if any) still works.
func TestFaultCancelEveryStep(t *testing.T) {
	testenv.NotOn(t, podmanFaults, testenv.Podman...)
	cli := engineClient(t)
	settleAtEnd(t, cli)
	p := startFaultProxy(t)
	newOpts := []sandbox.Option{sandbox.WithImage(busyboxImage), viaProxy(p), sandbox.WithTestTimeout(sandboxBound)}
	// Once through the proxy, so that the engine's API version is known
	// for its address, and each call below has the same steps.
	warm, err := sandbox.New(testCtx(t), newOpts...)
	if err != nil {
		t.Fatal(err)
	}
	warm.Close()

	src, sn := sourceAndSnapshot(t, newOpts...)
	defer src.Close()
	defer sn.Remove(context.Background())

	for _, tc := range []struct {
		name string
		call func(ctx context.Context) (cleanup func(), err error)
	}{
		{"New", func(ctx context.Context) (func(), error) {
			sb, err := sandbox.New(ctx, newOpts...)
			return func() { sb.Close() }, err
		}},
		{"Fork2", func(ctx context.Context) (func(), error) {
			forks, err := sn.Fork(ctx, 2)
			return func() {
				for _, f := range forks {
					f.Close()
				}
			}, err
		}},
		{"CopyIn", func(ctx context.Context) (func(), error) {
			return func() {}, src.CopyIn(ctx, "in", fstest.MapFS{
				"a.txt":   {Data: []byte("a"), Mode: 0o644},
				"d/b.txt": {Data: []byte("b"), Mode: 0o600},
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := takeInventory(t, cli)
			hostLoops := attachedLoops()
			var seq []string
			var mu sync.Mutex
			for k := 1; k <= 100; k++ {
				ctx, cancel := context.WithCancel(context.Background())
				var n atomic.Int32
				var at atomic.Value
				mu.Lock()
				seq = seq[:0]
				mu.Unlock()
				p.OnRequest(func(r faultproxy.Request) {
					mu.Lock()
					seq = append(seq, r.Method+" "+trimVersion(r.Path))
					mu.Unlock()
					if int(n.Add(1)) == k {
						at.Store(r.Method + " " + trimVersion(r.Path))
						cancel()
					}
				})
				var cleanup func()
				_, err := timed(t, fmt.Sprintf("%s cancelled at request %d", tc.name, k), hangGuard, func() error {
					var err error
					cleanup, err = tc.call(ctx)
					return err
				})
				p.OnRequest(nil)
				cancel()
				cancelled := at.Load() != nil
				switch {
				case err == nil && !cancelled:
					cleanup()
					mu.Lock()
					t.Logf("%s: %d steps (engine requests): %s", tc.name, k-1, strings.Join(seq, ", "))
					mu.Unlock()
					settle(t, cli, before, 20*time.Second, tc.name)
					t.Logf("loop devices: held by this process %v before and %v after; attached on the host %d before and %d after (other processes' tests move that count too)",
						before.loops, ownLoops(), hostLoops, attachedLoops())
					return
				case err == nil:
					t.Logf("k=%d: the cancel at %v came too late to matter: %s succeeded", k, at.Load(), tc.name)
					cleanup()
				case !cancelled:
					t.Fatalf("%s failed without a cancel: %v", tc.name, err)
				case !errors.Is(err, context.Canceled):
					t.Errorf("WRONG ERROR: k=%d, cancel at %v: %v; want context.Canceled", k, at.Load(), err)
				}
				settle(t, cli, before, 20*time.Second, fmt.Sprintf("%s cancelled at request %d (%v)", tc.name, k, at.Load()))
				if tc.name == "CopyIn" {
					// The source still works (and is not left paused).
					_, err := timed(t, "Exec in the source", 30*time.Second, func() error {
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						defer cancel()
						r, err := src.Exec(ctx, "cat f")
						if err == nil && r.Stdout != "x" {
							err = fmt.Errorf("cat f: %+v", *r)
						}
						return err
					})
					if err != nil {
						t.Errorf("BROKEN SOURCE: after %s cancelled at request %d (%v): %v", tc.name, k, at.Load(), err)
						if info, ierr := cli.ContainerInspect(testCtx(t), src.ID()); ierr == nil && info.State.Paused {
							t.Errorf("the source was left paused; unpausing it to go on")
							cli.ContainerUnpause(testCtx(t), src.ID())
						}
					}
				}
			}
			t.Errorf("%s never got through without a cancel in 100 steps", tc.name)
		})
	}
}

// trimVersion drops the "/v1.41" prefix and the query of an API path, and
// shortens container IDs, for logs.
func trimVersion(p string) string {
	if strings.HasPrefix(p, "/v1.") {
		if i := strings.Index(p[1:], "/"); i >= 0 {
			p = p[i+1:]
		}
	}
	p, _, _ = strings.Cut(p, "?")
	parts := strings.Split(p, "/")
	for i, s := range parts {
		if len(s) == 64 {
			parts[i] = s[:12]
		}
	}
	return strings.Join(parts, "/")
}

// TestDriverSharesConnection: the sandboxes of one driver share its
// connection and what it learned of the engine. Through a proxy that sees
// every request, five sandboxes made one after another with one driver
// negotiate the API version once, ask the engine's version once and check
// the agent's volume once, and their requests (attach streams aside) ride
// on few connections, kept alive between sandboxes.
func TestDriverSharesConnection(t *testing.T) {
	t.Parallel()
	p := startFaultProxy(t)
	d := docker.New(docker.Config{Host: "unix://" + p.Path, AgentVolume: "agentsandbox-agent-test-" + randomHex(4)})
	t.Cleanup(func() { d.Close() })
	var mu sync.Mutex
	count := map[string]int{}
	conns := map[int]bool{}
	p.OnRequest(func(r faultproxy.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.Contains(r.Path, "/_ping"):
			count["ping"]++
		case strings.HasSuffix(r.Path, "/version"):
			count["version"]++
		case strings.Contains(r.Path, "/containers/create?name=agentsandbox-agentfill"):
			count["agent volume check"]++
		}
		if !strings.Contains(r.Path, "/attach") {
			conns[r.Conn] = true
		}
	})
	cli := engineClient(t)
	var volume string
	for i := range 5 {
		sb, err := sandbox.New(testCtx(t), sandbox.WithImage(busyboxImage), sandbox.WithDriver(d), sandbox.WithLimits(sandbox.Limits{Disk: -1}))
		if err != nil {
			t.Fatalf("New %d: %v", i, err)
		}
		if r := mustExec(t, sb, "echo ok"); r.Stdout != "ok\n" {
			t.Errorf("Exec in sandbox %d: %q", i, r.Stdout)
		}
		if volume == "" {
			info, err := cli.ContainerInspect(testCtx(t), sb.ID())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range info.Mounts {
				if m.Destination == "/.sandbox-agent" {
					volume = m.Name
				}
			}
		}
		if err := sb.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if volume != "" {
		cli.VolumeRemove(context.Background(), volume, true)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, what := range []string{"ping", "version", "agent volume check"} {
		if count[what] != 1 {
			t.Errorf("%s: %d requests for 5 sandboxes of one driver, want 1", what, count[what])
		}
	}
	if len(conns) > 3 {
		t.Errorf("5 sandboxes made one after another used %d connections for their requests, want at most 3 (kept alive)", len(conns))
	}
	t.Logf("requests %v on %d connections (attach streams aside)", count, len(conns))
}
