// Package supervisor runs and talks to the small shell program that is the
// main process of every sandbox container (init.sh). It kills the process
// trees of commands from inside the container — Docker's exec API has no
// kill — using shell builtins only, so it works even when a fork bomb has
// used up the sandbox's PIDs limit; it reads the memory cgroup's OOM kill
// counter; and it ends the container when the library's attach stream
// closes (the owning process died or closed the sandbox) or when the
// sandbox's lifetime is over.
package supervisor

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/pkg/stdcopy"
)

//go:embed init.sh
var initScript string

// script is init.sh without comments and indentation, to keep the
// container's command line short.
var script = func() string {
	var b strings.Builder
	for _, line := range strings.Split(initScript, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}()

// Entrypoint returns the container entrypoint that runs the supervisor with
// the given lifetime in seconds (0 for none). It needs /bin/sh and sleep.
func Entrypoint(lifetimeSeconds int64) []string {
	return []string{"/bin/sh", "-c", script, "sandbox-init", strconv.FormatInt(lifetimeSeconds, 10)}
}

// KillCommand returns a command that, run by exec in the container as the
// user owning the processes, does what Kill does. It is the fallback for
// commands run as another user than the supervisor's, and for a supervisor
// that no longer answers.
func KillCommand(pid int, mark string) []string {
	funcs := script[:strings.Index(script, "oom()")]
	funcs = funcs[strings.Index(funcs, "has()"):]
	return []string{"/bin/sh", "-c", funcs + `tree "$1" "$2"`, "sandbox-kill", strconv.Itoa(pid), mark}
}

// ErrGone is returned once the supervisor's stream has ended: the container
// stopped or was removed.
var ErrGone = errors.New("supervisor: container stopped")

// ErrNoAnswer is returned when the supervisor did not answer a request within
// the Conn's timeout (see Start): the container is paused or frozen, or the
// engine stopped relaying its streams.
var ErrNoAnswer = errors.New("supervisor: no answer")

// resend is how long an idempotent request (Ping, OOMKills) waits for its
// answer before it is sent again, within its overall bound.
const resend = 5 * time.Second

// maxLine bounds a reply line; code in the sandbox can write to the
// supervisor's stdout, so nothing read from it is trusted to be small.
const maxLine = 256

// Conn is a connection to a running supervisor over the container's attach
// stream. It is safe for concurrent use; requests are answered one at a time.
//
// A request registers what reply it waits for before it is written, and the
// reader hands a matching line to that waiter through a buffered slot: a
// reply that arrives before the requester is ready to receive it is kept,
// not dropped. (Dropping it was the readiness hang of issue 8: on a loaded
// host the supervisor answered "o" before the requesting goroutine reached
// its receive, and the reply was thrown away as "nobody asked".)
type Conn struct {
	w       io.WriteCloser
	timeout time.Duration
	mu      sync.Mutex // one request in flight
	seq     atomic.Uint64
	done    chan struct{}
	once    sync.Once

	wmu  sync.Mutex
	want *waiter // the request in flight, if any

	delivered func(line string) // test hook: called after each line is handled
}

// waiter is a request waiting for a reply line starting with prefix.
type waiter struct {
	prefix string
	reply  chan string // capacity 1
}

// Start reads replies from r (the multiplexed attach stream) and writes
// requests to w (its stdin). Closing w ends the supervisor and the container.
// Every request waits at most timeout for its answer, whatever its context.
func Start(w io.WriteCloser, r io.Reader, timeout time.Duration) *Conn {
	c := &Conn{w: w, timeout: timeout, done: make(chan struct{})}
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, io.Discard, r)
		pw.CloseWithError(err)
	}()
	go func() {
		defer close(c.done)
		defer pr.Close()
		br := bufio.NewReaderSize(pr, maxLine)
		for {
			line, err := readLine(br)
			if err != nil {
				return
			}
			c.deliver(line)
			if c.delivered != nil {
				c.delivered(line)
			}
		}
	}()
	return c
}

// deliver hands line to the waiting request if it is the reply that request
// waits for; other lines (stray, late or forged) are dropped.
func (c *Conn) deliver(line string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.want == nil || !strings.HasPrefix(line, c.want.prefix) {
		return
	}
	select {
	case c.want.reply <- line:
	default: // already answered
	}
}

// readLine returns the next line, dropping lines longer than maxLine.
func readLine(br *bufio.Reader) (string, error) {
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			continue
		}
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(line)), nil
	}
}

// Done is closed when the supervisor's stream ends.
func (c *Conn) Done() <-chan struct{} { return c.done }

// request sends the line made by mk (given a fresh sequence number) and
// waits for a reply starting with the prefix mk returns; it returns the
// rest of that reply. If idempotent, the request is sent again (with a new
// number) when no answer came within resend. The wait is bounded by ctx and
// by the Conn's timeout.
func (c *Conn) request(ctx context.Context, idempotent bool, mk func(seq uint64) (line, prefix string)) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bound := time.NewTimer(c.timeout)
	defer bound.Stop()
	defer c.setWant(nil)
	for {
		select {
		case <-c.done:
			return "", ErrGone
		default:
		}
		line, prefix := mk(c.seq.Add(1))
		w := &waiter{prefix: prefix, reply: make(chan string, 1)}
		c.setWant(w) // before writing: the reply may come back at once
		if _, err := io.WriteString(c.w, line+"\n"); err != nil {
			return "", fmt.Errorf("%w: %v", ErrGone, err)
		}
		var again <-chan time.Time
		if idempotent {
			t := time.NewTimer(min(resend, c.timeout/3))
			defer t.Stop()
			again = t.C
		}
		select {
		case r := <-w.reply:
			return strings.TrimPrefix(r, prefix), nil
		case <-c.done:
			return "", ErrGone
		case <-ctx.Done():
			return "", ctx.Err()
		case <-bound.C:
			return "", fmt.Errorf("%w to %q within %v", ErrNoAnswer, line, c.timeout)
		case <-again:
		}
	}
}

func (c *Conn) setWant(w *waiter) {
	c.wmu.Lock()
	c.want = w
	c.wmu.Unlock()
}

// Ping waits until the supervisor answers.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.request(ctx, true, func(seq uint64) (string, string) {
		n := strconv.FormatUint(seq, 10)
		return "p " + n, "p " + n
	})
	return err
}

// Kill kills process pid and its whole tree (session, process group,
// descendants, and every process whose environment holds mark) and returns
// once they are gone. The supervisor can only kill processes of its own
// user.
func (c *Conn) Kill(ctx context.Context, pid int, mark string) error {
	p := strconv.Itoa(pid)
	_, err := c.request(ctx, false, func(uint64) (string, string) {
		return "k " + p + " " + mark, "k " + p
	})
	return err
}

// OOMKills returns how many processes the kernel's OOM killer has ended in
// the container's memory cgroup so far, or -1 if the container cannot see
// that counter (as under gVisor).
func (c *Conn) OOMKills(ctx context.Context) (int64, error) {
	s, err := c.request(ctx, true, func(seq uint64) (string, string) {
		n := strconv.FormatUint(seq, 10)
		return "o " + n, "o " + n + " "
	})
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return -1, nil
	}
	return n, nil
}

// Close closes the supervisor's stdin, which ends the container.
func (c *Conn) Close() error {
	var err error
	c.once.Do(func() { err = c.w.Close() })
	return err
}
