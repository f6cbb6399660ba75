package egress_test

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/testenv"
)

// stalledUpstream accepts connections and never reads them; it counts
// them and closes them when the test ends.
func stalledUpstream(t *testing.T) (port int, accepted func() int) {
	addr, accepted := testenv.HoldingListener(t)
	return addr.Port, accepted
}

// proxySide returns the proxy's sockets to the upstream port and their
// send queues' total.
func proxySide(t *testing.T, port int) ([]testenv.TCPSocket, int64) {
	t.Helper()
	ss, err := testenv.SocketsTo(port)
	if err != nil {
		t.Fatal(err)
	}
	var tx int64
	for _, s := range ss {
		tx += s.TxQueue
	}
	return ss, tx
}

// A sandbox that writes as fast as it can into 128 tunnels to an upstream
// that never reads makes the host's kernel hold at most UpstreamBuffer-
// bounded send queues (not the several MiB per socket autotuning grows
// them to), and Close frees the upstream sockets at once: reset, not left
// as orphans waiting behind a shut window.
func TestEgressStalledUpstreamKernelBound(t *testing.T) {
	const tunnels = 128
	port, accepted := stalledUpstream(t)
	h := startProxy(t, egress.Config{Policy: policy(t, "127.0.0.1/32"), MaxConns: tunnels})
	target := "127.0.0.1:" + strconv.Itoa(port)
	var wg sync.WaitGroup
	var clients []net.Conn
	defer func() { // the writers end with their connections
		for _, c := range clients {
			c.Close()
		}
		wg.Wait()
	}()
	memBefore, _ := testenv.TCPMemPages()
	for range tunnels {
		c, _, resp := rawConnect(t, h.addr, target, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT %s = %s", target, resp.Status)
		}
		// The sandbox's side: a relayed connection in a sandbox, whose
		// windows the agent bounds; here a socket with small buffers.
		clients = append(clients, c)
		c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		c.SetDeadline(time.Time{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
	// Each upstream socket's send queue fills up to its bound (the kernel
	// allots 2×UpstreamBuffer and may pass it by one 64 KiB segment);
	// none goes past it.
	const perSocket = 2*egress.UpstreamBuffer + 64<<10
	var peak int64
	poll.Eventually(t, testenv.HangGuard, func() (bool, string) {
		ss, tx := proxySide(t, port)
		peak = max(peak, tx)
		full := 0
		for _, s := range ss {
			if s.TxQueue > perSocket {
				t.Fatalf("an upstream socket holds %d bytes in its send queue, over 2×UpstreamBuffer = %d", s.TxQueue, perSocket)
			}
			if s.TxQueue >= egress.UpstreamBuffer/2 {
				full++
			}
		}
		return len(ss) == tunnels && full == tunnels,
			fmt.Sprintf("%d upstream sockets, %d with a full send queue (%d bytes in all)", len(ss), full, tx)
	})
	memDuring, _ := testenv.TCPMemPages()
	t.Logf("%d stalled tunnels: upstream send queues %.1f MiB in all (at most %.1f MiB); host TCP memory %d pages before, %d with the tunnels full (%+.1f MiB)",
		tunnels, float64(peak)/(1<<20), float64(tunnels*perSocket)/(1<<20), memBefore, memDuring, float64((memDuring-memBefore)*4096)/(1<<20))
	if n := accepted(); n != tunnels {
		t.Errorf("the upstream accepted %d connections, want %d", n, tunnels)
	}

	// Close: every upstream socket is gone at once, none left as an orphan
	// holding its queue.
	h.p.Close()
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		ss, tx := proxySide(t, port)
		return len(ss) == 0, fmt.Sprintf("after Close, %d upstream sockets remain (states %v), %d bytes queued", len(ss), states(ss), tx)
	})
	memAfter, _ := testenv.TCPMemPages()
	t.Logf("after Close: no upstream socket left; host TCP memory %d pages", memAfter)
}

func states(ss []testenv.TCPSocket) map[int]int {
	m := map[int]int{}
	for _, s := range ss {
		m[s.State]++
	}
	return m
}
