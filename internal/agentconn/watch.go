package agentconn

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// ErrBadEvents ends a watch whose agent sent records that do not decode:
// the watch stops there (what came before was delivered).
var ErrBadEvents = errors.New("agentconn: the agent sent a watch record that does not decode")

// WatchRecord is one event of a watch as the agent sent it (see
// wire.WatchRecord's encoding).
type WatchRecord struct {
	Op         byte // wire.WatchCreate...
	Path, From string
}

// MaxWatchBytes bounds the bytes of the paths of the events a watch holds
// unread, beside their number: events of long paths overflow sooner.
const MaxWatchBytes = 8 << 20

// Watch starts the watch req and returns its events, each made by conv,
// on a channel that holds at most max of them unread (and MaxWatchBytes of
// their paths): beyond that, events
// are dropped and one made by conv of a wire.WatchOverflow record (Path:
// overflowPath) stands where they were lost; events after it are kept
// again once the reader has taken some. The channel closes when ctx
// ends, the stream to the agent ends, or the agent ends the watch (its
// directory removed); then no goroutine of the watch is left. A Failed
// answer is a *wire.FileError's error: a syscall.Errno if it has one.
func Watch[T any](c *Conn, ctx context.Context, req wire.WatchRequest, max int, overflowPath string, conv func(WatchRecord) T) (<-chan T, error) {
	ch := &channel{reply: make(chan wire.Frame, 1), killed: make(chan wire.KillResult, 1)}
	c.mu.Lock()
	c.next++
	id := c.next
	ch.events = newStream(func(n int) { c.w.WriteCount(wire.Ack, id, uint32(n)) }, wire.WatchWindow)
	c.chans[id] = ch
	c.mu.Unlock()
	if err := c.w.WriteJSON(wire.Watch, id, req); err != nil {
		c.release(id)
		return nil, c.writeErr(err)
	}
	f, err := await(c, ctx, ch.reply, "watch")
	if err == nil && f.Kind != wire.Started {
		err = watchFailed(f)
	}
	if err != nil {
		c.w.Write(wire.Kill, id, nil) // it may have started after all
		c.release(id)
		return nil, err
	}
	out := make(chan T)
	go pumpWatch(c, ctx, id, ch.events, out, max, conv, conv(WatchRecord{Op: wire.WatchOverflow, Path: overflowPath}))
	return out, nil
}

// watchFailed is the error of a Failed answer to a watch.
func watchFailed(f wire.Frame) error {
	if f.Kind != wire.Failed {
		return fmt.Errorf("agentconn: bad watch answer %v", f.Kind)
	}
	var fe wire.FileError
	if json.Unmarshal(f.Data, &fe) != nil || fe.Text == "" && fe.Errno == 0 {
		return fmt.Errorf("agentconn: watch: the agent refused: %q", f.Data)
	}
	if fe.Errno != 0 && len(fe.Path) > 0 {
		return syscall.Errno(fe.Errno) // the library names the path
	}
	if fe.Errno != 0 {
		return fmt.Errorf("%s: %w", strings.TrimPrefix(fe.Text, "agent: "), syscall.Errno(fe.Errno))
	}
	return errors.New(fe.Text)
}

// pumpWatch moves a watch's records from s to out, holding at most max
// of them unread (see Watch), until ctx ends, the stream to the agent
// ends, or the watch does.
func pumpWatch[T any](c *Conn, ctx context.Context, id uint32, s *stream, out chan<- T, max int, conv func(WatchRecord) T, overflow T) {
	defer close(out)
	defer c.release(id)
	var q []T
	var sizes []int // of q's events: the bytes of their paths
	held := 0       // the sum of sizes
	lost := false   // the last of q is the overflow event of a run of losses going on
	push := func(v T, size int) {
		if len(q) >= max || held+size > MaxWatchBytes {
			if !lost {
				q, sizes = append(q, overflow), append(sizes, 0)
				lost = true
			}
			return
		}
		q, sizes = append(q, v), append(sizes, size)
		held += size
		lost = false
	}
	buf := make([]byte, wire.MaxData)
	ended := false // the watch ended: deliver what is queued, then close
	for {
		var send chan<- T
		var head T
		if len(q) > 0 {
			send, head = out, q[0]
		} else if ended {
			return
		}
		var wake <-chan struct{}
		if !ended {
			wake = s.wake
		}
		select {
		case send <- head:
			var zero T
			q[0] = zero
			q, held, sizes = q[1:], held-sizes[0], sizes[1:]
			if len(q) == 0 {
				q, sizes = nil, nil // let go of the arrays
			}
		case <-wake:
			for !ended {
				n, ok, err := s.tryRead(buf)
				if !ok {
					break
				}
				if err != nil {
					if err != io.EOF {
						c.w.Write(wire.Kill, id, nil)
						if errors.Is(err, ErrGone) {
							return // the sandbox is gone: close now
						}
					}
					ended = true
					break
				}
				b := buf[:n]
				for len(b) > 0 {
					op, p, from, rest, ok := wire.ParseWatchRecord(b)
					if !ok {
						c.w.Write(wire.Kill, id, nil)
						s.end(ErrBadEvents)
						ended = true
						break
					}
					r := WatchRecord{Op: op, Path: string(p)}
					if len(from) > 0 {
						r.From = string(from)
					}
					push(conv(r), len(p)+len(from))
					b = rest
				}
			}
		case <-ctx.Done():
			if !ended && c.w.Write(wire.Kill, id, nil) == nil {
				drainWatch(c, s, buf)
			}
			return
		case <-c.done:
			return
		}
	}
}

// drainWatch waits, bounded by the Conn's timeout, for the end of a watch
// it killed, dropping its records: once the channel closes, the agent has
// let go of the watch (another may take its place).
func drainWatch(c *Conn, s *stream, buf []byte) {
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	for {
		for {
			_, ok, err := s.tryRead(buf)
			if !ok {
				break
			}
			if err != nil {
				return
			}
		}
		select {
		case <-s.wake:
		case <-c.done:
			return
		case <-t.C:
			return
		}
	}
}
