package sandbox

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// Usage is what a sandbox uses, read by its agent from inside (so on
// every backend) and, for the network, counted by the library's egress
// proxy.
//
// CPU, Memory and MemoryPeak are the kernel's figures for the sandbox's
// cgroup where the sandbox sees its own (cgroup v1's cpuacct and memory
// controllers, v2's cpu.stat, memory.current and memory.peak): then they
// count every process, the agent included, and memory counts the files
// of tmpfs places (/tmp, /dev/shm, a tmpfs working directory) and the
// page cache. Where the kernel keeps none for it (rootless Podman on
// cgroup v1, whose containers stay in their user's cgroups; gVisor), they
// are summed over the sandbox's processes: the CPU time of those alive and
// of those that ended (the agent waits for them all), the resident memory
// of those alive; MemoryPeak is then the largest sum seen by a Usage call
// (PeakSampled says so), and tmpfs files are not counted.
type Usage struct {
	CPU                   time.Duration // CPU time since the sandbox started
	Memory, MemoryPeak    int64         // bytes in use now, and the most at once
	DiskUsed              int64         // bytes used on the file systems of the working directory, /tmp and /dev/shm, each once, as statfs sees them
	Processes             int           // the sandbox's processes, the agent's aside
	NetworkIn, NetworkOut int64         // bytes through the egress proxy: to the sandbox, and from it (0 without an allow-list)
	PeakSampled           bool          // MemoryPeak is sampled, not the kernel's
	Time                  time.Time     // when it was read
}

// Usage returns what the sandbox uses now. It costs one round trip to the
// agent, which reads a few files of its cgroup (or of /proc).
func (s *Sandbox) Usage(ctx context.Context) (Usage, error) {
	if err := s.check(); err != nil {
		return Usage{}, err
	}
	w, err := s.agent.Usage(ctx, []string{s.cfg.workdir, "/tmp", "/dev/shm"})
	if err != nil {
		return Usage{}, s.initErr("usage", err)
	}
	u := Usage{
		CPU: time.Duration(w.CPU), Memory: w.Memory, MemoryPeak: w.MemoryPeak,
		DiskUsed: w.DiskUsed, Processes: w.Processes, PeakSampled: w.PeakSampled,
		Time: time.Now(),
	}
	if s.proxy != nil {
		u.NetworkIn, u.NetworkOut = s.proxy.traffic.in.Load(), s.proxy.traffic.out.Load()
	}
	return u, nil
}

// MinWatchEvery is the shortest interval WatchUsage takes.
const MinWatchEvery = 100 * time.Millisecond

// WatchUsage sends the sandbox's Usage every interval (at least
// MinWatchEvery), the first at once, until ctx ends or the sandbox is
// closed or gone; then it closes the channel. A reader slower than every
// misses readings rather than holding them up: the channel keeps the
// latest one.
func (s *Sandbox) WatchUsage(ctx context.Context, every time.Duration) (<-chan Usage, error) {
	if every < MinWatchEvery {
		return nil, fmt.Errorf("sandbox: WatchUsage every %v: below MinWatchEvery (%v)", every, MinWatchEvery)
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	ch := make(chan Usage, 1)
	go func() {
		defer close(ch)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			u, err := s.Usage(ctx)
			if err != nil {
				return
			}
			select { // the latest reading replaces one not yet read
			case <-ch:
			default:
			}
			ch <- u
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			case <-s.agent.Done(): // closed, detached or gone
				return
			}
		}
	}()
	return ch, nil
}

// traffic counts the bytes of the connections a listener accepts.
type traffic struct {
	in, out atomic.Int64 // written to the connections, read from them
}

// countingListener is a net.Listener whose connections count their bytes
// in t.
type countingListener struct {
	net.Listener
	t *traffic
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, t: l.t}, nil
}

type countingConn struct {
	net.Conn
	t *traffic
}

// Unwrap returns the relayed connection (agentconn.Origin).
func (c *countingConn) Unwrap() net.Conn { return c.Conn }

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.t.out.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.t.in.Add(int64(n))
	return n, err
}
