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

// maxLine bounds a reply line; code in the sandbox can write to the
// supervisor's stdout, so nothing read from it is trusted to be small.
const maxLine = 256

// Conn is a connection to a running supervisor over the container's attach
// stream. It is safe for concurrent use; requests are answered one at a time.
type Conn struct {
	w    io.WriteCloser
	mu   sync.Mutex // one request in flight
	rep  chan string
	done chan struct{}
	once sync.Once
}

// Start reads replies from r (the multiplexed attach stream) and writes
// requests to w (its stdin). Closing w ends the supervisor and the container.
func Start(w io.WriteCloser, r io.Reader) *Conn {
	c := &Conn{w: w, rep: make(chan string), done: make(chan struct{})}
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
			select {
			case c.rep <- line:
			default: // nobody asked: a stray or forged line
			}
		}
	}()
	return c
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

// request sends line and waits for a reply starting with prefix.
func (c *Conn) request(ctx context.Context, line, prefix string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
		return "", ErrGone
	default:
	}
	if _, err := io.WriteString(c.w, line+"\n"); err != nil {
		return "", fmt.Errorf("%w: %v", ErrGone, err)
	}
	for {
		select {
		case r := <-c.rep:
			if strings.HasPrefix(r, prefix) {
				return strings.TrimPrefix(r, prefix), nil
			}
		case <-c.done:
			return "", ErrGone
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Ping waits until the supervisor answers.
func (c *Conn) Ping(ctx context.Context) error {
	_, err := c.request(ctx, "p 1", "p 1")
	return err
}

// Kill kills process pid and its whole tree (session, process group,
// descendants, and every process whose environment holds mark) and returns
// once they are gone. The supervisor can only kill processes of its own
// user.
func (c *Conn) Kill(ctx context.Context, pid int, mark string) error {
	p := strconv.Itoa(pid)
	_, err := c.request(ctx, "k "+p+" "+mark, "k "+p)
	return err
}

// OOMKills returns how many processes the kernel's OOM killer has ended in
// the container's memory cgroup so far, or -1 if the container cannot see
// that counter (as under gVisor).
func (c *Conn) OOMKills(ctx context.Context) (int64, error) {
	s, err := c.request(ctx, "o", "o ")
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
