package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// Cmd is a command to run in a sandbox. It mirrors os/exec.Cmd: fill in the
// fields, then call Run, or Start and Wait, or Output. A Cmd cannot be
// reused.
//
// When the context passed to Command is done, or Limits.ExecTimeout passes,
// the command and every process it started, directly or not, are killed
// with SIGKILL inside the sandbox, and Wait returns promptly with an
// *ExitError that also matches the context's error with errors.Is. Nothing
// escapes: each command's processes carry a supplementary group of their
// own, which they cannot drop (new sessions, double forks, cleared
// environments do not matter), and the sandbox's agent kills by it until
// none is left. Processes of other commands, and background processes a
// command left running after it exited normally, are not touched.
//
// Unlike os/exec, a program that is not found is reported by Wait as an
// *ExitError with Code 127 (the shell's answer), not by Start.
type Cmd struct {
	// Args holds the command name and its arguments. The name is looked up
	// in the sandbox's PATH.
	Args []string
	// Env is added to the sandbox's environment for this command; later
	// entries win. Unlike os/exec's it does not replace the environment,
	// so it must not start from os.Environ(): an Env holding this
	// process's whole environment is refused by Start, as it would copy
	// the host's variables into the sandbox.
	Env []string
	// Dir is the working directory; relative to the sandbox's working
	// directory if not absolute. Empty means the sandbox's working directory.
	Dir string
	// User is the user to run as: "uid", "uid:gid", "name" or "name:group"
	// (see WithUser). Empty means the sandbox's user.
	User string
	// Stdin, if not nil, is copied to the command's standard input, which is
	// closed at its end. If nil, the command reads no input (EOF).
	Stdin io.Reader
	// Stdout and Stderr receive the command's output as it is produced, kept
	// apart. If nil, the output is discarded. If they are the same writer
	// (==), at most one goroutine at a time calls its Write, as in os/exec.
	Stdout io.Writer
	Stderr io.Writer

	// TTY, if set before Start, runs the command on a pseudo-terminal
	// inside the sandbox, made by its agent: the terminal is the
	// command's stdin, stdout, stderr and controlling terminal (it leads
	// a session of its own, so job control works in a shell), it belongs
	// to the command's user, and TERM is set. Everything the command
	// writes goes to Stdout, as a terminal shows it (with its line
	// discipline: "\n" becomes "\r\n", input is echoed); a Stderr set
	// too is refused by Start (ErrTTYStderr). Bytes from Stdin are typed
	// on the terminal: a C-c (0x03) interrupts its foreground process
	// group with SIGINT, as a keyboard's does. Stdin's end is the
	// terminal's end-of-file character (VEOF, normally C-d: twice after
	// a partial line), not a closed descriptor; without Stdin, that
	// character is typed at the start. Resize changes the terminal's
	// size. Kills, ExecTimeout, limits and the output's bounds are as for
	// any command. A sandbox that cannot make a pseudo-terminal refuses
	// the command with ErrTTYUnsupported.
	TTY *TTY

	// ProcessState describes the finished command; Wait sets it when the
	// command ran to its end (nil if the sandbox or engine failed).
	ProcessState *ProcessState

	ctx       context.Context
	sb        *Sandbox
	noTimeout bool          // the library's own long-lived process: no ExecTimeout
	keep      bool          // kept in a leased sandbox even with noTimeout (a Terminal's program)
	group     bool          // what the command leaves is killed when it exits (a Terminal's program)
	quiet     bool          // no sandbox.exec record (the caller logs its own)
	liveDone  chan struct{} // closed when logLive has logged the last activity event; nil: no logLive
	err       error         // from Command
	started   bool
	finished  bool
	cancel    context.CancelFunc
	proc      *agentconn.Proc
	stuck     error // why a kill did not take effect
	copyDone  chan error
	outEnded  atomic.Bool   // the output was copied to its end
	killed    chan struct{} // closed when the kill goroutine has killed the tree
	killErr   error         // ctx.Err() that caused the kill
	watchDone chan struct{}
	closers   []io.Closer // pipes closed after the streams end
	start     time.Time
	stdoutN   counter
	stderrN   counter
	attached  bool // made by AttachCommand
	activity  *Activity
}

// ProcessState describes a finished command, as os.ProcessState does for a
// local one.
type ProcessState struct {
	code      int
	oom       bool
	duration  time.Duration
	killCause error
	exit      wire.Exit
}

// ExitCode returns the exit status: 128+N for a command ended by signal N
// (137 after a kill).
func (p *ProcessState) ExitCode() int { return p.code }

// Success reports whether the command exited with status 0.
func (p *ProcessState) Success() bool { return p.code == 0 && p.killCause == nil }

// Duration returns how long the command ran, from Start to its end.
func (p *ProcessState) Duration() time.Duration { return p.duration }

// OOMKilled reports whether the kernel's OOM killer ended the command.
func (p *ProcessState) OOMKilled() bool { return p.oom }

// UserTime returns the user CPU time of the command's process and of the
// descendants it waited for (a shell's commands, say), as wait4 gives it
// and os.ProcessState.UserTime does on the host. Processes the command
// left behind to end on their own are not counted.
func (p *ProcessState) UserTime() time.Duration { return time.Duration(p.exit.UserNS) }

// SystemTime returns the system CPU time counted as UserTime is.
func (p *ProcessState) SystemTime() time.Duration { return time.Duration(p.exit.SystemNS) }

// MaxRSS returns the largest peak resident set size, in bytes, of the
// command's process and of the descendants it waited for.
func (p *ProcessState) MaxRSS() int64 { return p.exit.MaxRSS }

// TimedOut reports whether the command was killed because its context's
// deadline or Limits.ExecTimeout passed.
func (p *ProcessState) TimedOut() bool { return errors.Is(p.killCause, context.DeadlineExceeded) }

// Killed reports whether the library killed the command because its
// context ended (TimedOut, or cancelled).
func (p *ProcessState) Killed() bool { return p.killCause != nil }

// String describes how the command ended and after how long:
// "exit status 1 after 2ms", or the kill and its cause.
func (p *ProcessState) String() string {
	switch {
	case p.TimedOut():
		return fmt.Sprintf("timed out after %v: exit status %d", p.duration, p.code)
	case p.killCause != nil:
		return fmt.Sprintf("killed (%v) after %v: exit status %d", p.killCause, p.duration, p.code)
	case p.oom:
		return fmt.Sprintf("OOM-killed after %v: exit status %d", p.duration, p.code)
	}
	return fmt.Sprintf("exit status %d after %v", p.code, p.duration)
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

// Error says how the command ended and why, if the library or the OOM
// killer ended it.
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
	if c.sb == nil {
		return nil, errNoSandbox
	}
	if c.Stdout != nil {
		return nil, errors.New("sandbox: Stdout already set")
	}
	limit := c.sb.cfg.limits.OutputBytes
	out := newCapture(limit)
	c.Stdout = out
	var errb *capture
	if c.Stderr == nil && c.TTY == nil {
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
	if c.sb == nil {
		return nil, errNoSandbox
	}
	if c.Stdout != nil || c.Stderr != nil {
		return nil, errors.New("sandbox: Stdout or Stderr already set")
	}
	out := newCapture(c.sb.cfg.limits.OutputBytes)
	c.Stdout = out
	if c.TTY == nil {
		c.Stderr = out
	}
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

// errNoSandbox is the error of a Cmd that Sandbox.Command did not make.
var errNoSandbox = errors.New("sandbox: Cmd not made by Sandbox.Command")

// Start starts the command and returns without waiting for it.
func (c *Cmd) Start() error {
	if c.sb == nil {
		return errNoSandbox
	}
	if c.err != nil {
		return c.err
	}
	if c.started {
		return errors.New("sandbox: already started")
	}
	if len(c.Args) == 0 || c.Args[0] == "" {
		return errors.New("sandbox: empty command")
	}
	if err := checkHostEnv("Cmd.Env", c.Env); err != nil {
		return err
	}
	var tty *wire.TTY
	if c.TTY != nil {
		if c.Stderr != nil {
			return ErrTTYStderr
		}
		var err error
		if tty, err = c.TTY.request(); err != nil {
			return err
		}
	}
	s := c.sb
	if err := s.check(); err != nil {
		return err
	}
	c.started = true
	ctx := c.ctx
	if t := s.cfg.limits.ExecTimeout; t > 0 && !c.noTimeout {
		ctx, c.cancel = context.WithTimeout(ctx, t)
	} else {
		ctx, c.cancel = context.WithCancel(ctx)
	}
	if err := ctx.Err(); err != nil {
		c.cancel()
		return err
	}
	dir := s.cfg.workdir
	if c.Dir != "" {
		dir = path.Join(s.cfg.workdir, c.Dir)
		if path.IsAbs(c.Dir) {
			dir = path.Clean(c.Dir)
		}
	}
	user := c.User
	if user == "" {
		user = s.userIDs()
	}
	c.start = time.Now()
	p, err := s.agent.Exec(ctx, wire.ExecRequest{
		Args: c.Args, Env: c.Env, Dir: dir, User: user, Stdin: c.Stdin != nil, TTY: tty,
		Keep: s.lease > 0 && (!c.noTimeout || c.keep), Group: c.group, NoActivity: !s.cfg.activity, MaxActivity: s.cfg.activityMax,
	})
	if err != nil {
		c.cancel()
		if errors.Is(err, agentconn.ErrGone) || errors.Is(err, agentconn.ErrNoAnswer) {
			return s.initErr("exec", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("sandbox: exec: %w", err)
		}
		return ttyFailure(fmt.Errorf("sandbox: exec %s: %w", c.Args[0], err))
	}
	c.begin(ctx, p, c.Stdin != nil)
	return nil
}

// begin copies the output of the started (or attached) command p and
// watches ctx; with stdin, Stdin is copied to it (its end is the
// command's stdin's end unless the command was attached).
func (c *Cmd) begin(ctx context.Context, p *agentconn.Proc, stdin bool) {
	c.proc = p
	c.copyDone = make(chan error, 1)
	c.killed = make(chan struct{})
	c.watchDone = make(chan struct{})
	outW, errW := orDiscard(c.Stdout), orDiscard(c.Stderr)
	if c.Stdout != nil && sameWriter(c.Stdout, c.Stderr) {
		lw := &lockedWriter{w: c.Stdout}
		outW, errW = lw, lw
	}
	stdout := &countWriter{w: outW, n: &c.stdoutN}
	stderr := &countWriter{w: errW, n: &c.stderrN}
	go func() {
		var wg sync.WaitGroup
		var errs [2]error
		wg.Go(func() { errs[0] = drain(stdout, p.Stdout) })
		wg.Go(func() { errs[1] = drain(stderr, p.Stderr) })
		wg.Wait()
		// The output pipes reach EOF when the output ends, so that, as
		// with os/exec, they can be read to EOF before Wait is called.
		for _, cl := range c.closers {
			if pw, ok := cl.(*io.PipeWriter); ok {
				pw.Close()
			}
		}
		c.outEnded.Store(true)
		c.copyDone <- cmp.Or(errs[0], errs[1])
	}()
	if stdin {
		go func() {
			w := p.Stdin()
			io.Copy(w, c.Stdin)
			if !c.attached {
				w.Close()
			}
		}()
	}
	go c.watch(ctx)
	if c.sb.cfg.activity {
		c.liveDone = make(chan struct{})
		go c.logLive()
	}
}

// drain copies the command's output stream r to w. If w fails, the rest is
// read and dropped, so that the command is not held back, and w's error is
// returned.
func drain(w io.Writer, r io.Reader) error {
	_, err := io.Copy(w, r)
	if err != nil && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, agentconn.ErrGone) && !errors.Is(err, agentconn.ErrTaken) {
		io.Copy(io.Discard, r)
		return err
	}
	return err
}

// watch kills the command and everything it started when ctx ends before
// the command does. If the kill cannot take effect (the container paused
// from outside, its agent silent), it stops the wait for the output after
// the sandbox's timeout, so that Wait returns with an error saying why.
func (c *Cmd) watch(ctx context.Context) {
	defer close(c.watchDone)
	select {
	case <-c.killed: // Wait is done; nothing to do
		return
	case <-ctx.Done():
	}
	c.killErr = ctx.Err()
	s := c.sb
	kctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout)
	_, err := c.proc.Kill(kctx)
	cancel()
	if err == nil {
		// Every process is dead, so the output ends and the exit comes.
		t := time.NewTimer(s.cfg.timeout)
		defer t.Stop()
		select {
		case <-c.killed:
			return
		case <-t.C:
			err = fmt.Errorf("the output did not end within %v of the kill", s.cfg.timeout)
			if c.outEnded.Load() {
				err = fmt.Errorf("the output ended, and no exit was reported within %v of the kill", s.cfg.timeout)
			}
		}
	}
	c.stuck = err
	s.log.LogAttrs(context.Background(), slog.LevelWarn, "sandbox.kill", slog.String("sandbox", s.id),
		slog.Int("pid", c.proc.PID), slog.String("error", err.Error()))
	c.proc.Close() // ends the output streams: Wait goes on
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
	if c.proc == nil { // Start failed
		return errors.New("sandbox: the command did not start")
	}
	copyErr := <-c.copyDone
	exit, err := c.exit()
	close(c.killed)
	<-c.watchDone
	if c.liveDone != nil {
		<-c.liveDone
	}
	c.cancel()
	c.proc.Close()
	for _, cl := range c.closers {
		cl.Close()
	}
	out := &ProcessState{duration: time.Since(c.start), killCause: c.killErr}
	if err != nil {
		return err
	}
	code := exit.Code
	out.code, out.exit = code, exit
	if errors.Is(copyErr, agentconn.ErrGone) {
		if err := s.check(); errors.Is(err, ErrClosed) {
			return err
		}
		return s.initErr("exec", copyErr)
	}
	switch {
	case out.killCause != nil:
	case code == 137:
		// SIGKILL: the OOM killer, or the container going away under the
		// command (killed or removed behind the library's back, its
		// Lifetime over) — that is the sandbox failing, not the command.
		var gone bool
		if out.oom, gone = s.oomKilled(); gone {
			return s.goneErr("exec", errors.New("it ended while the command ran"))
		}
	}
	c.ProcessState = out
	if s.cfg.activity {
		c.activity = s.activityOf(c.proc.ID, c.proc.Activity(), exit, c.proc.PID, time.Now())
	}
	if !c.quiet {
		c.logExec(code, out)
		c.logDropped(c.activity)
	}
	if code != 0 || out.killCause != nil {
		return &ExitError{Code: code, OOMKilled: out.oom, cause: out.killCause}
	}
	return nil
}

func (c *Cmd) logExec(code int, out *ProcessState) {
	c.sb.log.LogAttrs(c.ctx, slog.LevelInfo, "sandbox.exec",
		slog.String("sandbox", c.sb.id), slog.Any("args", c.Args), slog.String("user", c.User),
		slog.String("dir", c.Dir), slog.Int("exit_code", code), slog.Duration("duration", out.duration),
		slog.Int64("stdout_bytes", c.stdoutN.n), slog.Int64("stderr_bytes", c.stderrN.n),
		slog.Bool("timed_out", out.TimedOut()), slog.Bool("killed", out.Killed()), slog.Bool("oom_killed", out.oom),
		slog.Bool("tty", c.TTY != nil), slog.String("id", c.ID()), slog.Bool("attached", c.attached))
}

// exit waits for the agent to report the command's exit. A command that
// keeps running after closing its output is waited for as long as it runs
// (its ExecTimeout and context still kill it); if the kill could not take
// effect, the agent gets the sandbox's timeout to report the end before
// exit gives up with an error saying why (a paused container, an
// unresponsive sandbox).
func (c *Cmd) exit() (wire.Exit, error) {
	s := c.sb
	var giveUp <-chan time.Time
	watchDone := c.watchDone
	for {
		select {
		case <-c.proc.Exited():
			return c.proc.Exit(), nil
		case <-c.proc.Taken():
			return wire.Exit{}, ErrTakenOver
		case <-s.agent.Done():
			select {
			case <-c.proc.Exited():
				return c.proc.Exit(), nil
			default:
			}
			if err := s.check(); errors.Is(err, ErrClosed) {
				return wire.Exit{}, err
			}
			return wire.Exit{}, s.initErr("exec", s.agent.Err())
		case <-watchDone:
			watchDone = nil
			if c.stuck != nil {
				switch s.stateNow() {
				case driver.StatePaused:
					return wire.Exit{}, s.pausedErr("exec: the command could not be killed")
				case driver.StateGone:
					return wire.Exit{}, s.goneErr("exec", nil)
				}
			}
			t := time.NewTimer(s.cfg.timeout)
			defer t.Stop()
			giveUp = t.C
		case <-giveUp:
			return wire.Exit{}, fmt.Errorf("%w: exec: the command still runs %v after it was killed (%v)", ErrUnresponsive, s.cfg.timeout, c.stuck)
		}
	}
}

// oomKilled reports whether the OOM killer has struck since last asked, and
// whether the container is gone (its init does not answer and the engine
// says it stopped).
func (s *Sandbox) oomKilled() (oom, gone bool) {
	ctx, cancel := context.WithTimeout(context.Background(), min(oomAskTimeout, s.cfg.timeout))
	defer cancel()
	n, err := s.agent.OOMKills(ctx)
	if err != nil {
		return false, errors.Is(err, agentconn.ErrGone) || s.goneNow()
	}
	if n < 0 {
		return false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if int64(n) > s.oomSeen {
		s.oomSeen = int64(n)
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
	// Activity is what the command did inside (see Activity); nil when
	// the record is off (the default for now: WithActivity) or the
	// backend keeps none.
	Activity *Activity
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
	ps := c.ProcessState
	r := &Result{
		Stdout:    stdout.String(),
		Stderr:    stderr.String(),
		ExitCode:  ps.ExitCode(),
		Duration:  ps.Duration(),
		TimedOut:  ps.TimedOut(),
		Truncated: stdout.truncated || stderr.truncated,
		OOMKilled: ps.OOMKilled(),
		Activity:  c.Activity(),
	}
	if errors.Is(ps.killCause, context.Canceled) {
		return r, fmt.Errorf("sandbox: exec: %w", context.Canceled)
	}
	return r, nil
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

// sameWriter reports a == b, false where the writers' types cannot be
// compared.
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// lockedWriter serialises the writes of a command's two streams into one
// writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
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
