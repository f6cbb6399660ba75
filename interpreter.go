package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentsandbox/sandbox/internal/interp"
)

// interruptGrace is how long a run interrupted at its timeout may take to
// stop before its interpreter is killed.
const interruptGrace = 500 * time.Millisecond

// Interpreter is a persistent interpreter process in a sandbox, for code
// run step by step the way a notebook runs cells: variables, imports,
// functions and the working directory stay from one Run to the next.
// Several interpreters in one sandbox are independent processes.
//
// Start one with Sandbox.Interpreter. Runs of one Interpreter take turns;
// it is safe for concurrent use.
type Interpreter struct {
	// Stdout and Stderr, if set, receive each run's output as it is
	// produced, besides Execution.Stdout and Stderr. Set them before Run.
	Stdout, Stderr io.Writer

	sb     *Sandbox
	lang   string     // "python", "bash" or "sh"
	argv   []string   // how the process starts
	mu     sync.Mutex // held by Run
	closed atomic.Bool
	pmu    sync.Mutex  // guards p
	p      *interpProc // nil: started by the next Run
}

// Execution is what one Run of an Interpreter produced.
type Execution struct {
	// Stdout and Stderr are the run's output, at most Limits.OutputBytes
	// of each (Truncated tells when more was dropped).
	Stdout, Stderr string
	// Outputs are the run's rich results, in order: the value of a
	// trailing expression, every object passed to display(), every
	// matplotlib figure the code made or showed. One object may give
	// several Outputs, one per MIME type (a pandas DataFrame gives
	// text/html and text/plain), richest first. Everything the host keeps
	// of them — MIME names and data, and 64 bytes for each — adds up to at
	// most 4 × Limits.OutputBytes, and there are at most 1000. Shell
	// interpreters have none.
	Outputs []Output
	// Error is the exception the code raised (Python) or its non-zero
	// exit status (shells); nil when the run succeeded.
	Error *CodeError
	// Truncated reports that output or Outputs were dropped: beyond the
	// bounds, or malformed (a MIME type that is not "type/subtype", data
	// that does not decode).
	Truncated bool
	// TimedOut reports that the run was stopped at Limits.ExecTimeout or
	// its context's deadline.
	TimedOut bool
	// StateLost reports that the interpreter process ended during this
	// run: it ignored the interrupt at a timeout and was killed with every
	// process it started, the kernel's OOM killer ended it, or the code
	// exited it. The next Run starts a fresh process: variables, imports
	// and the working directory of earlier runs are gone.
	StateLost bool
	// Duration is how long the run took.
	Duration time.Duration
}

// Output is one rich result of a run, such as a PNG image
// ("image/png") or an HTML table ("text/html").
type Output struct {
	MIME string
	Data []byte
}

// CodeError is an error in the code a run executed, as the language
// reports it: for Python the exception's class name (Name: "KeyError"),
// its message (Value: "'revenue'") and the traceback, holding only the
// run's own frames (and those of modules it called) with its line numbers
// ("<cell 3>", line 2). For shells, Name is "ExitStatus" and Value the
// status. The library's own outcomes use these names: "TimeoutError" (the
// run was stopped), "MemoryError" (the OOM killer ended the interpreter),
// "InterpreterExited".
type CodeError struct {
	Name, Value, Traceback string
}

// Error returns "Name: Value".
func (e *CodeError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// interpProc is one interpreter process.
type interpProc struct {
	cmd    *Cmd
	cancel context.CancelFunc
	stdin  io.WriteCloser
	events chan interpEvent
	quit   chan struct{} // closed to stop the readers
	once   sync.Once
	done   chan struct{} // closed when the process has ended and been waited for
	errOut *capture      // its own stderr (python: the driver's, before it takes over)
	state  *ProcessState
	err    error // from Wait, besides an exit status
	rest   [3][]byte
}

// interpEvent is a message of the Python driver or output of a shell.
type interpEvent struct {
	msg    *interp.Message
	stream int // shells: 1 or 2
	data   []byte
	tooBig bool // a message over the bound was dropped
}

// Interpreter starts a persistent interpreter in the sandbox: "python"
// (python3 from the image's PATH, or python) or "bash" (bash, or sh where
// the image has no bash); "sh" asks for sh.
//
// For Python the library runs a small driver of its own (standard library
// only, so any image with python3 works) that executes each Run like a
// notebook cell, with a headless matplotlib backend whose figures become
// image/png Outputs; display(obj) is a builtin. Code reads EOF on stdin
// (input() raises EOFError). At Limits.ExecTimeout or the context's end a
// Python run is interrupted (KeyboardInterrupt, state kept); code that does
// not stop within half a second is killed with everything it started, and
// the Execution says state was lost. A shell run that times out is killed
// the same way.
//
// A shell interpreter runs each Run's code with eval in one shell process
// (input from /dev/null), so cd, exported variables and functions stay;
// its Error carries a non-zero exit status. Code that runs exit, or fails
// under set -e, ends the shell: StateLost.
//
// The process runs as the sandbox user in its working directory; Close
// ends it. Closing the sandbox ends it too.
//
// What an Execution can be trusted for: everything in it is produced by
// code in the sandbox, so it says what that code chose to say. The driver
// runs in the same process as the code, which can reach the driver's
// descriptor and memory and make a run report any output, value or error
// (or none). What the library guarantees is that an Execution is bounded
// (see its fields), that it belongs to its own Run (each run has a random
// ID, so a message of an earlier run, or one written blindly to the
// driver's descriptor, is dropped), and that timeouts, kills and a lost
// state are the library's own findings. To grade what code did, run a
// fresh command (Sandbox.Exec, Command): its exit status and output come
// from the agent, which observes the process itself.
func (s *Sandbox) Interpreter(ctx context.Context, lang string) (_ *Interpreter, err error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	in := &Interpreter{sb: s, lang: lang}
	start := time.Now()
	defer func() {
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.interpreter.start", slog.String("sandbox", s.id),
			slog.String("lang", lang), slog.Duration("duration", time.Since(start)), errAttr(err))
	}()
	var candidates [][]string
	switch lang {
	case "python":
		candidates = [][]string{{"python3", "-c", interp.Driver}, {"python", "-c", interp.Driver}}
	case "bash":
		candidates = [][]string{{"bash", "--noprofile", "--norc"}, {"sh"}}
	case "sh":
		candidates = [][]string{{"sh"}}
	default:
		return nil, fmt.Errorf("sandbox: Interpreter: unknown language %q (want python, bash or sh)", lang)
	}
	var names []string
	for _, argv := range candidates {
		in.argv = argv
		err := in.start(ctx)
		if err == nil {
			return in, nil
		}
		var nf notFoundError
		if !errors.As(err, &nf) {
			return nil, err
		}
		names = append(names, argv[0])
	}
	return nil, fmt.Errorf("sandbox: Interpreter(%q): no %s in the sandbox's PATH", lang, strings.Join(names, " or "))
}

// notFoundError is an interpreter program missing from the image.
type notFoundError struct{ name string }

func (e notFoundError) Error() string { return e.name + " not found in the sandbox's PATH" }

func (in *Interpreter) python() bool { return in.lang == "python" }

// start starts the process and waits until it is ready.
func (in *Interpreter) start(ctx context.Context) error {
	s := in.sb
	pctx, cancel := context.WithCancel(context.Background())
	c := s.Command(pctx, in.argv[0], in.argv[1:]...)
	c.noTimeout, c.quiet = true, true
	p := &interpProc{
		cmd: c, cancel: cancel, events: make(chan interpEvent, 4),
		quit: make(chan struct{}), done: make(chan struct{}), errOut: newCapture(4 << 10),
	}
	stdin, err := c.StdinPipe()
	if err != nil {
		cancel()
		return err
	}
	stdout, err := c.StdoutPipe()
	if err != nil {
		cancel()
		return err
	}
	var stderr io.Reader
	if in.python() {
		c.Stderr = p.errOut
	} else if stderr, err = c.StderrPipe(); err != nil {
		cancel()
		return err
	}
	p.stdin = stdin
	if err := c.Start(); err != nil {
		cancel()
		return err
	}
	var readers sync.WaitGroup
	if in.python() {
		readers.Go(func() { p.readMessages(stdout, in.messageLimit()) })
	} else {
		readers.Go(func() { p.readStream(1, stdout) })
		readers.Go(func() { p.readStream(2, stderr) })
	}
	go func() {
		readers.Wait()
		err := c.Wait()
		var ee *ExitError
		if errors.As(err, &ee) {
			err = nil
		}
		p.state, p.err = c.ProcessState, err
		stdin.Close() // a request still being written fails
		close(p.done)
	}()
	in.setProc(p)

	// Ready: the driver says so; a shell answers an empty run.
	rctx, rcancel := context.WithTimeout(ctx, s.cfg.timeout)
	defer rcancel()
	var ready error
	if in.python() {
		ready = in.awaitReady(rctx)
	} else {
		var ex *Execution
		if ex, ready = in.run(rctx, ":", true); ready == nil && (ex.StateLost || ex.Error != nil) {
			ready = fmt.Errorf("the shell failed: %v", ex.Error)
		}
	}
	if ready != nil {
		p.kill(2 * s.cfg.timeout)
		in.setProc(nil)
		if p.state != nil && p.state.ExitCode() == 127 {
			return notFoundError{in.argv[0]}
		}
		if msg := p.errOut.String(); msg != "" {
			return fmt.Errorf("sandbox: Interpreter(%q): %s did not start: %w: %s", in.lang, in.argv[0], ready, msg)
		}
		return fmt.Errorf("sandbox: Interpreter(%q): %s did not start: %w", in.lang, in.argv[0], ready)
	}
	return nil
}

func (in *Interpreter) awaitReady(ctx context.Context) error {
	p := in.proc()
	for {
		select {
		case ev := <-p.events:
			if ev.msg != nil && ev.msg.T == "ready" {
				return nil
			}
		case <-p.done:
			if p.err != nil {
				return p.err
			}
			return fmt.Errorf("exited with status %d", p.state.ExitCode())
		case <-ctx.Done():
			if err := in.sb.check(); err != nil {
				return err
			}
			return ctx.Err()
		}
	}
}

// messageLimit bounds one line of the driver's.
func (in *Interpreter) messageLimit() int {
	if l := in.sb.cfg.limits.OutputBytes; l > 0 {
		return int(min(l*6, 1<<30)) + 64<<10 // 4 × the bound, in base64
	}
	return 256 << 20
}

// send passes an event to the run, unless the process is being stopped.
func (p *interpProc) send(ev interpEvent) bool {
	select {
	case p.events <- ev:
		return true
	case <-p.quit:
		return false
	}
}

// readMessages reads the Python driver's lines. A line longer than limit
// is dropped (and reported) without being held whole.
func (p *interpProc) readMessages(r io.Reader, limit int) {
	interp.ReadLines(r, limit, func(line []byte, tooBig bool) bool {
		ev := interpEvent{tooBig: tooBig}
		if !tooBig {
			if m, err := interp.Decode(line); err == nil {
				ev.msg = &m
			} else {
				ev.tooBig = true // garbage: counted as dropped
			}
		}
		return p.send(ev)
	})
	io.Copy(io.Discard, r)
}

// readStream reads a shell's output stream.
func (p *interpProc) readStream(stream int, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && !p.send(interpEvent{stream: stream, data: slices.Clone(buf[:n])}) {
			io.Copy(io.Discard, r)
			return
		}
		if err != nil {
			return
		}
	}
}

func (in *Interpreter) setProc(p *interpProc) {
	in.pmu.Lock()
	in.p = p
	in.pmu.Unlock()
}

func (in *Interpreter) proc() *interpProc {
	in.pmu.Lock()
	defer in.pmu.Unlock()
	return in.p
}

// stop ends the process and everything it started (the Cmd's context
// kills the whole tree) and stops its readers.
func (p *interpProc) stop() {
	p.once.Do(func() {
		close(p.quit)
		p.cancel()
		p.stdin.Close()
	})
}

// kill stops the process and waits up to wait for its end.
func (p *interpProc) kill(wait time.Duration) {
	p.stop()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}

// Run executes code in the interpreter and returns what it produced. The
// code's own failures (an exception, a non-zero exit status, a timeout,
// an OOM kill) are in the Execution; the error is for a closed
// interpreter or sandbox, a failing sandbox or engine, or ctx being
// cancelled (then the Execution describes what ran until the interrupt).
func (in *Interpreter) Run(ctx context.Context, code string) (_ *Execution, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.sb
	var ex *Execution
	defer func() {
		attrs := []slog.Attr{slog.String("sandbox", s.id), slog.String("lang", in.lang), slog.Int("code_bytes", len(code))}
		if ex != nil {
			attrs = append(attrs, slog.Duration("duration", ex.Duration), slog.Int("stdout_bytes", len(ex.Stdout)),
				slog.Int("stderr_bytes", len(ex.Stderr)), slog.Int("outputs", len(ex.Outputs)),
				slog.Bool("timed_out", ex.TimedOut), slog.Bool("state_lost", ex.StateLost))
			if ex.Error != nil {
				attrs = append(attrs, slog.String("code_error", ex.Error.Name))
			}
		}
		s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.interpreter.run", append(attrs, errAttr(err))...)
	}()
	if in.closed.Load() {
		return nil, errInterpreterClosed
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	if in.proc() == nil {
		if err := in.start(ctx); err != nil {
			return nil, err
		}
	}
	ex, err = in.run(ctx, code, false)
	return ex, err
}

// run executes one run on the live process.
func (in *Interpreter) run(ctx context.Context, code string, internal bool) (*Execution, error) {
	s, p := in.sb, in.proc()
	start := time.Now()
	limit := s.cfg.limits.OutputBytes
	stdout, stderr := newCapture(limit), newCapture(limit)
	ex := &Execution{}
	outLimit := int64(-1)
	if limit >= 0 {
		outLimit = 4 * limit
	}
	outputs := interp.NewOutputs(outLimit)
	var sinks [3]io.Writer
	sinks[1], sinks[2] = io.Writer(stdout), io.Writer(stderr)
	if !internal {
		if in.Stdout != nil {
			sinks[1] = io.MultiWriter(stdout, in.Stdout)
		}
		if in.Stderr != nil {
			sinks[2] = io.MultiWriter(stderr, in.Stderr)
		}
	}

	// The request.
	// The run's own random ID: the driver tags its messages with it, and
	// messages of another run (late, or forged by code writing to the
	// driver's descriptor) are dropped.
	var b [12]byte
	rand.Read(b[:])
	nonce := "as" + hex.EncodeToString(b[:])
	var markers [3]*interp.Marker
	var req []byte
	if in.python() {
		req = pythonRequest("run", nonce, code)
	} else {
		for i := 1; i <= 2; i++ {
			markers[i] = interp.NewMarker(nonce, func(b []byte) { sinks[i].Write(b) })
			if len(p.rest[i]) > 0 { // background output after the last run
				markers[i].Write(p.rest[i])
				p.rest[i] = nil
			}
		}
		req = []byte(interp.ShellRun(code, nonce))
	}
	// Writing the request may block while the process runs earlier
	// output's writers; it is bounded like the rest of the run.
	werr := make(chan error, 1)
	go func() {
		_, err := p.stdin.Write(req)
		werr <- err
	}()

	timeout := s.cfg.limits.ExecTimeout
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	var grace <-chan time.Time
	var cause error // why the run was stopped
	stop := func(why error) {
		if cause != nil {
			return
		}
		cause = why
		ex.TimedOut = !errors.Is(why, context.Canceled)
		if in.python() {
			go p.stdin.Write(pythonRequest("interrupt", nonce, "")) // fails once the process ends
			grace = time.After(interruptGrace)
			return
		}
		grace = closedTime
	}
	ctxDone := ctx.Done()
	finished := false
	for !finished {
		select {
		case err := <-werr:
			werr = nil
			if err != nil {
				// The process ended; its end says more.
				continue
			}
		case ev := <-p.events:
			switch {
			case ev.tooBig:
				ex.Truncated = true
			case ev.msg != nil && ev.msg.ID == nonce:
				m := ev.msg
				switch m.T {
				case "out":
					sinks[m.S].Write(m.B)
				case "display":
					outputs.Add(m.Data)
				case "done":
					if m.Error != nil {
						ex.Error = &CodeError{Name: m.Error.Name, Value: m.Error.Value, Traceback: m.Error.Traceback}
					}
					finished = true
				}
			case ev.msg != nil: // another run's, or forged
			default:
				markers[ev.stream].Write(ev.data)
				st1, ok1 := markers[1].Done()
				_, ok2 := markers[2].Done()
				if ok1 && ok2 {
					if st1 != 0 {
						ex.Error = &CodeError{Name: "ExitStatus", Value: strconv.Itoa(st1)}
					}
					p.rest[1], p.rest[2] = markers[1].Rest(), markers[2].Rest()
					finished = true
				}
			}
		case <-p.done:
			// The process ended during the run.
			for _, m := range markers[1:] {
				if m != nil {
					m.Flush()
				}
			}
			in.setProc(nil)
			ex.StateLost = true
			if in.closed.Load() {
				return nil, errInterpreterClosed
			}
			if p.err != nil {
				return nil, p.err
			}
			if err := s.check(); err != nil {
				return nil, err
			}
			switch {
			case p.state.OOMKilled():
				ex.Error = &CodeError{Name: "MemoryError", Value: "the interpreter was killed by the out-of-memory killer (Limits.Memory); its state is lost"}
			case cause != nil:
				ex.Error = &CodeError{Name: "TimeoutError", Value: "the run did not stop when interrupted and was killed with every process it started; the interpreter's state is lost"}
			default:
				ex.Error = &CodeError{Name: "InterpreterExited", Value: fmt.Sprintf("the interpreter exited with status %d; its state is lost", p.state.ExitCode())}
				if !in.python() {
					ex.Error = &CodeError{Name: "ExitStatus", Value: strconv.Itoa(p.state.ExitCode())}
				}
			}
			finished = true
		case <-deadline:
			deadline = nil
			stop(context.DeadlineExceeded)
		case <-ctxDone:
			ctxDone = nil
			stop(ctx.Err())
		case <-grace:
			grace = nil
			p.stop() // p.done follows
		}
	}
	ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
	for _, o := range outputs.List {
		ex.Outputs = append(ex.Outputs, Output(o))
	}
	ex.Truncated = ex.Truncated || outputs.Truncated || stdout.truncated || stderr.truncated
	ex.Duration = time.Since(start)
	if ex.TimedOut && ex.Error == nil {
		ex.Error = &CodeError{Name: "TimeoutError", Value: "the run was stopped at its timeout"}
	}
	if errors.Is(cause, context.Canceled) {
		return ex, fmt.Errorf("sandbox: interpreter run: %w", context.Canceled)
	}
	return ex, nil
}

// closedTime is a channel that is always ready.
var closedTime = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()

// pythonRequest is a request to the driver: t "run" (code) or
// "interrupt", for the run id.
func pythonRequest(t, id, code string) []byte {
	b, _ := json.Marshal(map[string]string{"t": t, "id": id, "code": code})
	return append(b, '\n')
}

// Close ends the interpreter's process and everything it started.
// Further Runs fail. Close is idempotent.
// A Run in progress returns an error at once.
func (in *Interpreter) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	if p := in.proc(); p != nil {
		p.stop() // ends a Run in progress
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if p := in.proc(); p != nil {
		p.kill(2 * in.sb.cfg.timeout)
		in.setProc(nil)
	}
	return nil
}

var errInterpreterClosed = fmt.Errorf("%w: interpreter closed", ErrClosed)
