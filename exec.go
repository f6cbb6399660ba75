package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/supervisor"
)

// Cmd is a command to run in a sandbox. It mirrors os/exec.Cmd: fill in the
// fields, then call Run, or Start and Wait, or Output. A Cmd cannot be
// reused.
//
// When the context passed to Command is done, or Limits.ExecTimeout passes,
// the command and every process it started (its session, its process group,
// its descendants, and anything carrying its environment marker) are killed
// with SIGKILL inside the sandbox, and Wait returns promptly with an
// *ExitError that also matches the context's error with errors.Is. A process
// that both leaves the session and clears its environment escapes that
// sweep; it still ends when the sandbox is closed or its Lifetime passes.
//
// Unlike os/exec, a program that is not found is reported by Wait as an
// *ExitError with Code 127 (the shell's answer), not by Start.
type Cmd struct {
	// Args holds the command name and its arguments. The name is looked up
	// in the sandbox's PATH.
	Args []string
	// Env is added to the sandbox's environment for this command; later
	// entries win.
	Env []string
	// Dir is the working directory; relative to the sandbox's working
	// directory if not absolute. Empty means the sandbox's working directory.
	Dir string
	// User is the user to run as ("uid", "uid:gid" or a name in the image's
	// /etc/passwd). Empty means the sandbox's user.
	User string
	// Stdin, if not nil, is copied to the command's standard input, which is
	// closed at its end. If nil, the command reads no input (EOF).
	Stdin io.Reader
	// Stdout and Stderr receive the command's output as it is produced, kept
	// apart. If nil, the output is discarded.
	Stdout io.Writer
	Stderr io.Writer

	ctx       context.Context
	sb        *Sandbox
	err       error // from Command
	started   bool
	finished  bool
	cancel    context.CancelFunc
	execID    string
	hijack    types.HijackedResponse
	mark      string
	pid       chan int
	copyDone  chan error
	killed    chan struct{} // closed when the kill goroutine has killed the tree
	killErr   error         // ctx.Err() that caused the kill
	watchDone chan struct{}
	closers   []io.Closer // pipes closed after the streams end
	start     time.Time
	stdoutN   counter
	stderrN   counter
	result    *execOutcome
}

// execOutcome is what Wait learnt about the finished command.
type execOutcome struct {
	code      int
	oom       bool
	timedOut  bool
	duration  time.Duration
	killCause error
}

// ExitError reports a command that ran and did not exit successfully.
type ExitError struct {
	// Code is the exit status: 128+N for a command ended by signal N (137
	// after a kill).
	Code int
	// Stderr holds up to Limits.OutputBytes of standard error when it was
	// captured by Output.
	Stderr []byte
	// OOMKilled is set when the kernel's OOM killer ended the command
	// because the sandbox ran out of memory.
	OOMKilled bool

	cause error // context error when the library killed the command
}

func (e *ExitError) Error() string {
	switch {
	case e.cause != nil:
		return fmt.Sprintf("sandbox: command killed (%v): exit status %d", e.cause, e.Code)
	case e.OOMKilled:
		return fmt.Sprintf("sandbox: command killed by the OOM killer: exit status %d", e.Code)
	}
	return fmt.Sprintf("sandbox: exit status %d", e.Code)
}

// Unwrap returns the context error (context.DeadlineExceeded or
// context.Canceled) when the command was killed because its context ended
// or its ExecTimeout passed.
func (e *ExitError) Unwrap() error { return e.cause }

// Command returns a Cmd to run name with args in the sandbox. The context
// bounds the command's run: when it is done, the command's process tree is
// killed.
func (s *Sandbox) Command(ctx context.Context, name string, arg ...string) *Cmd {
	c := &Cmd{Args: append([]string{name}, arg...), ctx: ctx, sb: s}
	if ctx == nil {
		c.err = errors.New("sandbox: nil Context")
	}
	return c
}

// Run starts the command and waits for it to finish.
func (c *Cmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output runs the command and returns its standard output, of which it keeps
// at most Limits.OutputBytes; beyond that the rest is dropped and the error
// wraps ErrOutputTruncated. Standard error, if not redirected, is kept (as
// much) in the *ExitError.
func (c *Cmd) Output() ([]byte, error) {
	if c.Stdout != nil {
		return nil, errors.New("sandbox: Stdout already set")
	}
	limit := c.sb.cfg.limits.OutputBytes
	out := newCapture(limit)
	c.Stdout = out
	var errb *capture
	if c.Stderr == nil {
		errb = newCapture(limit)
		c.Stderr = errb
	}
	err := c.Run()
	var ee *ExitError
	if errb != nil && errors.As(err, &ee) {
		ee.Stderr = errb.Bytes()
	}
	if err == nil && out.truncated {
		err = fmt.Errorf("%w: more than %d bytes on stdout", ErrOutputTruncated, limit)
	}
	return out.Bytes(), err
}

// CombinedOutput runs the command and returns standard output and standard
// error interleaved, at most Limits.OutputBytes of it (see Output).
func (c *Cmd) CombinedOutput() ([]byte, error) {
	if c.Stdout != nil || c.Stderr != nil {
		return nil, errors.New("sandbox: Stdout or Stderr already set")
	}
	out := newCapture(c.sb.cfg.limits.OutputBytes)
	c.Stdout, c.Stderr = out, out
	err := c.Run()
	if err == nil && out.truncated {
		err = fmt.Errorf("%w: more than %d bytes of output", ErrOutputTruncated, out.limit)
	}
	return out.Bytes(), err
}

// StdinPipe returns a pipe connected to the command's standard input. Close
// it to send EOF. Call before Start.
func (c *Cmd) StdinPipe() (io.WriteCloser, error) {
	if c.Stdin != nil || c.started {
		return nil, errors.New("sandbox: Stdin already set or command started")
	}
	pr, pw := io.Pipe()
	c.Stdin = pr
	c.closers = append(c.closers, pr)
	return pw, nil
}

// StdoutPipe returns a pipe that yields the command's standard output. As
// with os/exec, read it to EOF before calling Wait; output that is not read
// holds the command back. Call before Start.
func (c *Cmd) StdoutPipe() (io.ReadCloser, error) {
	if c.Stdout != nil || c.started {
		return nil, errors.New("sandbox: Stdout already set or command started")
	}
	pr, pw := io.Pipe()
	c.Stdout = pw
	c.closers = append(c.closers, pw)
	return pr, nil
}

// StderrPipe is StdoutPipe for standard error.
func (c *Cmd) StderrPipe() (io.ReadCloser, error) {
	if c.Stderr != nil || c.started {
		return nil, errors.New("sandbox: Stderr already set or command started")
	}
	pr, pw := io.Pipe()
	c.Stderr = pw
	c.closers = append(c.closers, pw)
	return pr, nil
}

// wrapper prints the shell's pid (which exec keeps for the command) on the
// first line of stdout, where the library takes it off, then runs the
// command. Docker runs every exec as its own session leader. SIGXFSZ is
// ignored (and stays ignored in everything the command runs) so that writing
// past Limits.FileSize fails with EFBIG ("File too large") instead of
// killing the writer silently.
const wrapper = `trap '' XFSZ; echo $$; exec "$@"`

// markVar is the environment variable that tags a command's processes.
const markVar = "AGENTSANDBOX_EXEC"

// Start starts the command and returns without waiting for it.
func (c *Cmd) Start() error {
	if c.err != nil {
		return c.err
	}
	if c.started {
		return errors.New("sandbox: already started")
	}
	if len(c.Args) == 0 || c.Args[0] == "" {
		return errors.New("sandbox: empty command")
	}
	s := c.sb
	if err := s.check(); err != nil {
		return err
	}
	c.started = true
	ctx := c.ctx
	if t := s.cfg.limits.ExecTimeout; t > 0 {
		ctx, c.cancel = context.WithTimeout(ctx, t)
	} else {
		ctx, c.cancel = context.WithCancel(ctx)
	}
	if err := ctx.Err(); err != nil {
		c.cancel()
		return err
	}
	var b [8]byte
	rand.Read(b[:])
	c.mark = markVar + "=" + hex.EncodeToString(b[:])
	dir := s.cfg.workdir
	if c.Dir != "" {
		dir = path.Join(s.cfg.workdir, c.Dir)
		if path.IsAbs(c.Dir) {
			dir = path.Clean(c.Dir)
		}
	}
	user := c.User
	if user == "" {
		user = s.cfg.user
	}
	opts := container.ExecOptions{
		User:         user,
		AttachStdin:  c.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
		Env:          append(append([]string{}, c.Env...), c.mark),
		WorkingDir:   dir,
		Cmd:          append([]string{"/bin/sh", "-c", wrapper, "sh"}, c.Args...),
	}
	c.start = time.Now()
	created, err := s.cli.ContainerExecCreate(ctx, s.id, opts)
	if err != nil {
		c.cancel()
		return s.engineErr("exec", err)
	}
	c.execID = created.ID
	c.hijack, err = engine.Attach(ctx, s.cfg.timeout, func(ctx context.Context) (types.HijackedResponse, error) {
		return s.cli.ContainerExecAttach(ctx, c.execID, container.ExecAttachOptions{})
	})
	if err != nil {
		c.cancel()
		return s.engineErr("exec attach", err)
	}
	c.pid = make(chan int, 1)
	c.copyDone = make(chan error, 1)
	c.killed = make(chan struct{})
	c.watchDone = make(chan struct{})
	stdout := &pidTaker{w: orDiscard(c.Stdout), pid: c.pid, n: &c.stdoutN}
	stderr := &countWriter{w: orDiscard(c.Stderr), n: &c.stderrN}
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, c.hijack.Reader)
		// The output pipes reach EOF when the output ends, so that, as
		// with os/exec, they can be read to EOF before Wait is called.
		for _, cl := range c.closers {
			if pw, ok := cl.(*io.PipeWriter); ok {
				pw.Close()
			}
		}
		c.copyDone <- err
	}()
	if c.Stdin != nil {
		go func() {
			io.Copy(c.hijack.Conn, c.Stdin)
			c.hijack.CloseWrite()
		}()
	}
	go c.watch(ctx, user)
	return nil
}

// watch kills the command's tree when ctx ends before the command does.
func (c *Cmd) watch(ctx context.Context, user string) {
	defer close(c.watchDone)
	select {
	case <-c.killed: // Wait is done; nothing to do
		return
	case <-ctx.Done():
	}
	c.killErr = ctx.Err()
	s := c.sb
	var pid int
	select {
	case pid = <-c.pid:
		c.pid <- pid
	case <-c.killed: // the stream ended without a pid: nothing ran
		return
	case <-time.After(s.cfg.timeout):
		// The engine can take seconds to start an exec on a loaded host, so
		// a missing pid does not mean nothing will run; only give up on a
		// command the engine has not started in all this time.
		c.hijack.Close()
		return
	}
	if pid <= 0 { // not the wrapper's pid line: nothing to aim at
		c.hijack.Close()
		return
	}
	var err error
	if user == s.cfg.user {
		kctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.sup.Kill(kctx, pid, c.mark)
		cancel()
	}
	if user != s.cfg.user || err != nil {
		// Another user's processes, or a supervisor that did not answer:
		// a one-off exec as that user, with a budget of its own.
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = s.killByExec(kctx, user, pid, c.mark)
		cancel()
	}
	if err != nil {
		s.log.LogAttrs(context.Background(), slog.LevelWarn, "sandbox.kill", slog.String("sandbox", s.id), slog.Int("pid", pid), slog.String("error", err.Error()))
	}
	// The tree is dead, so the stream ends; if something holds it open
	// anyway (a process that escaped the sweep), stop reading after a grace.
	select {
	case <-c.killed:
	case <-time.After(500 * time.Millisecond):
		c.hijack.Close()
	}
}

// killByExec kills a tree with a one-off exec, for commands run as another
// user than the supervisor's or when the supervisor does not answer.
func (s *Sandbox) killByExec(ctx context.Context, user string, pid int, mark string) error {
	created, err := s.cli.ContainerExecCreate(ctx, s.id, container.ExecOptions{
		User: user, Cmd: supervisor.KillCommand(pid, mark),
	})
	if err != nil {
		return err
	}
	h, err := engine.Attach(ctx, s.cfg.timeout, func(ctx context.Context) (types.HijackedResponse, error) {
		return s.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	})
	if err != nil {
		return err
	}
	defer h.Close()
	defer context.AfterFunc(ctx, h.Close)() // a frozen engine never ends the stream
	_, err = io.Copy(io.Discard, h.Reader)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Wait waits for the command to exit and its output to be copied. It
// returns nil for exit status 0, an *ExitError for any other status, and
// another error if the sandbox or engine failed.
func (c *Cmd) Wait() error {
	if !c.started {
		return errors.New("sandbox: not started")
	}
	if c.finished {
		return errors.New("sandbox: Wait was already called")
	}
	c.finished = true
	s := c.sb
	copyErr := <-c.copyDone
	// The streams have ended; the process has exited or closed them. Poll
	// for its status while the watcher can still kill it on timeout.
	code, err := c.exitCode()
	close(c.killed)
	<-c.watchDone
	c.cancel()
	c.hijack.Close()
	for _, cl := range c.closers {
		cl.Close()
	}
	out := &execOutcome{duration: time.Since(c.start), killCause: c.killErr}
	c.result = out
	if err != nil {
		return err
	}
	out.code = code
	if out.killCause == nil && copyErr != nil && s.check() != nil {
		return s.check()
	}
	switch {
	case out.killCause != nil:
	case code == 137:
		// SIGKILL: the OOM killer, or the container going away under the
		// command (killed or removed behind the library's back, its
		// Lifetime over) — that is the sandbox failing, not the command.
		var gone bool
		if out.oom, gone = s.oomKilled(); gone {
			return fmt.Errorf("%w: exec: %s ended while the command ran", ErrSandboxGone, shortID(s.id))
		}
	case code == 126 || code > 128:
		// The runtime's "could not exec" (126) when the container stopped
		// as the command started, or another signal: the same question.
		if s.goneNow() {
			return fmt.Errorf("%w: exec: %s ended as the command started", ErrSandboxGone, shortID(s.id))
		}
	}
	out.timedOut = errors.Is(out.killCause, context.DeadlineExceeded)
	s.log.LogAttrs(c.ctx, slog.LevelInfo, "sandbox.exec",
		slog.String("sandbox", s.id), slog.Any("args", c.Args), slog.String("user", c.User),
		slog.String("dir", c.Dir), slog.Int("exit_code", code), slog.Duration("duration", out.duration),
		slog.Int64("stdout_bytes", c.stdoutN.n), slog.Int64("stderr_bytes", c.stderrN.n),
		slog.Bool("timed_out", out.timedOut), slog.Bool("killed", out.killCause != nil), slog.Bool("oom_killed", out.oom))
	if code != 0 || out.killCause != nil {
		return &ExitError{Code: code, OOMKilled: out.oom, cause: out.killCause}
	}
	return nil
}

// exitCode waits for the engine to record the exec's exit status. A
// command that keeps running after closing its output is waited for as long
// as it runs (its ExecTimeout and context still kill it); once the watcher
// has killed it, the engine gets the sandbox's timeout to report the end
// before Wait gives up with an error saying why (a paused container, an
// unresponsive sandbox).
func (c *Cmd) exitCode() (int, error) {
	s := c.sb
	var giveUp <-chan time.Time
	watchDone := c.watchDone
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		// After Close the client must not be used: a request would open a
		// connection that nothing closes any more.
		if err := s.check(); err != nil {
			return 0, err
		}
		info, err := s.cli.ContainerExecInspect(context.Background(), c.execID)
		if err != nil {
			if err := s.check(); err != nil {
				return 0, err
			}
			return 0, s.engineErr("exec inspect", err)
		}
		if !info.Running {
			return info.ExitCode, nil
		}
		select {
		case <-watchDone: // the kill is over, yet the command runs
			watchDone = nil
			switch s.stateNow() {
			case statePaused:
				return 0, s.pausedErr("exec: the command could not be killed")
			case stateGone:
				return 0, fmt.Errorf("%w: exec: %s", ErrSandboxGone, shortID(s.id))
			}
			giveUp = time.After(s.cfg.timeout)
		case <-giveUp:
			return 0, fmt.Errorf("%w: exec: the engine still reports the command running %v after it was killed", ErrUnresponsive, s.cfg.timeout)
		case <-time.After(delay):
		}
	}
}

// oomKilled reports whether the OOM killer has struck since last asked, and
// whether the container is gone (its init does not answer and the engine
// says it stopped).
func (s *Sandbox) oomKilled() (oom, gone bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	n, err := s.sup.OOMKills(ctx)
	if err != nil {
		return false, errors.Is(err, supervisor.ErrGone) || s.goneNow()
	}
	if n < 0 {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.oomSeen {
		s.oomSeen = n
		return true, false
	}
	return false, false
}

// Result is what Exec returns: the command's output and how it ended.
type Result struct {
	Stdout, Stderr string
	ExitCode       int
	Duration       time.Duration
	TimedOut       bool // killed by the context's deadline or Limits.ExecTimeout
	Truncated      bool // output beyond Limits.OutputBytes was dropped
	OOMKilled      bool // ended by the kernel's OOM killer
}

// Exec runs script with /bin/sh -c in the sandbox's working directory and
// returns its output, at most Limits.OutputBytes of each stream. A non-zero
// exit, a timeout and an OOM kill are data in the Result, not errors: the
// error is for the sandbox or engine failing, or ctx being cancelled (then
// the Result describes what ran until the kill).
func (s *Sandbox) Exec(ctx context.Context, script string) (*Result, error) {
	limit := s.cfg.limits.OutputBytes
	stdout, stderr := newCapture(limit), newCapture(limit)
	c := s.Command(ctx, "/bin/sh", "-c", script)
	c.Stdout, c.Stderr = stdout, stderr
	err := c.Run()
	var ee *ExitError
	if err != nil && !errors.As(err, &ee) {
		return nil, err
	}
	r := &Result{
		Stdout:    stdout.String(),
		Stderr:    stderr.String(),
		ExitCode:  c.result.code,
		Duration:  c.result.duration,
		TimedOut:  c.result.timedOut,
		Truncated: stdout.truncated || stderr.truncated,
		OOMKilled: c.result.oom,
	}
	if errors.Is(c.result.killCause, context.Canceled) {
		return r, fmt.Errorf("sandbox: exec: %w", context.Canceled)
	}
	return r, nil
}

// pidTaker takes the wrapper's first line (the pid) off stdout.
type pidTaker struct {
	w    io.Writer
	pid  chan int
	line []byte
	done bool
	n    *counter
}

func (p *pidTaker) Write(b []byte) (int, error) {
	total := len(b)
	if !p.done {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(p.line)+len(b) > 32 { // not a pid line; give up
				p.done = true
				p.pid <- 0
			} else {
				p.line = append(p.line, b...)
				return total, nil
			}
		} else {
			p.line = append(p.line, b[:i]...)
			b = b[i+1:]
			p.done = true
			pid, _ := strconv.Atoi(string(p.line))
			p.pid <- pid
		}
	}
	if len(b) == 0 {
		return total, nil
	}
	p.n.add(len(b))
	if _, err := p.w.Write(b); err != nil {
		return 0, err
	}
	return total, nil
}

type counter struct {
	mu sync.Mutex
	n  int64
}

func (c *counter) add(n int) { c.mu.Lock(); c.n += int64(n); c.mu.Unlock() }

type countWriter struct {
	w io.Writer
	n *counter
}

func (c *countWriter) Write(b []byte) (int, error) {
	c.n.add(len(b))
	return c.w.Write(b)
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// capture keeps the first limit bytes written to it and counts the rest.
type capture struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	limit     int64
	truncated bool
}

func newCapture(limit int64) *capture { return &capture{limit: limit} }

func (c *capture) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(b)
	if c.limit >= 0 {
		room := c.limit - int64(c.buf.Len())
		if int64(len(b)) > room {
			b = b[:max(room, 0)]
			c.truncated = true
		}
	}
	c.buf.Write(b)
	return n, nil
}

func (c *capture) Bytes() []byte  { c.mu.Lock(); defer c.mu.Unlock(); return bytes.Clone(c.buf.Bytes()) }
func (c *capture) String() string { c.mu.Lock(); defer c.mu.Unlock(); return c.buf.String() }
