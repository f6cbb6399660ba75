package sandbox_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// Usage counts the bytes through the egress proxy: a 1 MiB download in,
// a 256 KiB upload out, with the requests' heads. (The rest of Usage is in
// the conformance suite's usage subtest.)
func TestUsageNetwork(t *testing.T) {
	t.Parallel()
	body := bytes.Repeat([]byte("d"), 1<<20)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/up" {
			n, _ := bytes.NewBuffer(nil).ReadFrom(r.Body)
			w.Write([]byte(r.Method + " " + strconv.FormatInt(n, 10)))
			return
		}
		w.Write(body)
	}))
	t.Cleanup(up.Close)
	port := strconv.Itoa(up.Listener.Addr().(*net.TCPAddr).Port)
	sb := newSandbox(t, sandbox.WithNetwork(sandbox.AllowHosts("api.test:"+port, "127.0.0.1/32")),
		sandbox.WithTestResolver(netResolver(map[string]string{"api.test": "127.0.0.1"})))
	ctx := testCtx(t)
	before, err := sb.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.NetworkIn != 0 || before.NetworkOut != 0 {
		t.Errorf("network bytes before any traffic: %+v", before)
	}
	r := mustExec(t, sb, "wget -q -O - http://api.test:"+port+"/ | wc -c; head -c 262144 /dev/zero | tr '\\0' u > up && wget -q -O - --post-file up http://api.test:"+port+"/up")
	// (BusyBox's wget sends a POST through a proxy as a GET with a body.)
	if !strings.HasPrefix(r.Stdout, "1048576\n") || !strings.HasSuffix(r.Stdout, " 262144") {
		t.Fatalf("download and upload through the proxy: %.200q, stderr %.200q", r.Stdout, r.Stderr)
	}
	u, err := sb.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after 1 MiB in and 256 KiB out: in %d, out %d bytes", u.NetworkIn, u.NetworkOut)
	if u.NetworkIn < 1<<20 || u.NetworkIn > 1<<20+64<<10 {
		t.Errorf("NetworkIn = %d after a download of 1 MiB", u.NetworkIn)
	}
	if u.NetworkOut < 256<<10 || u.NetworkOut > 256<<10+64<<10 {
		t.Errorf("NetworkOut = %d after an upload of 256 KiB", u.NetworkOut)
	}
}

// Under gVisor, Usage reads what its kernel gives: figures that follow the
// sandbox (from its emulated cgroup, or summed over its processes).
func TestUsageGVisor(t *testing.T) {
	testenv.NotOn(t, podmanGVisor, testenv.Podman...)
	t.Parallel()
	requireRunsc(t)
	sb := newSandbox(t, sandbox.WithRuntime("runsc"))
	ctx := testCtx(t)
	idle, err := sb.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Command(ctx, "sh", "-c", `dd if=/dev/zero bs=32M count=1 2>/dev/null | sleep 600`)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// dd may hold its buffer before the shell has forked sleep: wait for
	// the pipeline's steady state, all three processes and the buffer.
	var held sandbox.Usage
	sandboxtest.Eventually(t, time.Minute, func() (bool, string) {
		held, err = sb.Usage(ctx)
		return err == nil && held.Memory >= idle.Memory+30<<20 && held.Processes == 3,
			fmt.Sprintf("Usage with a shell, dd and sleep and dd's 32 MiB buffer: %+v, %v", held, err)
	})
	t.Logf("under gVisor: idle %+v; holding 32 MiB %+v", idle, held)
	if held.MemoryPeak < held.Memory || held.CPU <= 0 {
		t.Errorf("Usage holding 32 MiB: %+v, idle %+v", held, idle)
	}
}

// BenchmarkUsage measures one Usage of a running sandbox beside the
// engine's own one-shot stats of the same container (the floor a user
// would otherwise call) and Exec of `true`.
func BenchmarkUsage(b *testing.B) {
	sb := newSandbox(b)
	ctx := b.Context()
	b.Run("impl=floor-engine-stats", func(b *testing.B) {
		cli := benchClient(b)
		for b.Loop() {
			st, err := cli.ContainerStatsOneShot(ctx, sb.ID())
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, st.Body)
			st.Body.Close()
		}
	})
	b.Run("impl=library", func(b *testing.B) {
		for b.Loop() {
			if _, err := sb.Usage(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=exec-true", func(b *testing.B) {
		for b.Loop() {
			mustTrue(b, ctx, sb)
		}
	})
}
