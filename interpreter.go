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
	"github.com/agentsandbox/sandbox/internal/wire"
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
	// Activity is what the run did inside (with WithActivity(true)): the
	// programs its code executed and the connections it attempted, from
	// the events the agent sent between the run's start and its end (a
	// program still running then has no End). The interpreter's own
	// process is not in it; one record bounds all the interpreter's runs
	// (10,000 events), and Dropped is not counted per run. nil when the
	// record is off or the backend keeps none.
	Activity *Activity
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

// run executes one run on the live process: it sends the run's request
// in the process's protocol (pythonRun, shellRun) and takes the process's
// events until the protocol says the run is done, the process ends, or
// the run is stopped (Limits.ExecTimeout, ctx) and, at the protocol's
// grace, killed.
func (in *Interpreter) run(ctx context.Context, code string, internal bool) (*Execution, error) {
	p := in.proc()
	start := time.Now()
	out := in.newRunOutput(internal)
	acts := p.cmd.proc.ActivityLen()
	nonce := runNonce()
	var proto runProtocol
	if in.python() {
		proto = &pythonRun{p: p, out: out, nonce: nonce}
	} else {
		proto = newShellRun(p, out, nonce)
	}

	// Writing the request may block while the process runs earlier
	// output's writers; it is bounded like the rest of the run.
	werr := make(chan error, 1)
	go func() {
		_, err := p.stdin.Write(proto.request(code))
		werr <- err
	}()

	var deadline <-chan time.Time
	if timeout := in.sb.cfg.limits.ExecTimeout; timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	var grace <-chan time.Time
	var cause error // why the run was stopped
	stop := func(why error) {
		if cause == nil {
			cause = why
			out.ex.TimedOut = !errors.Is(why, context.Canceled)
			grace = proto.interrupt()
		}
	}
	ctxDone := ctx.Done()
	for finished := false; !finished; {
		select {
		case <-werr:
			werr = nil // a write that failed: the process ended, and its end says more
		case ev := <-p.events:
			finished = proto.event(ev)
		case <-p.done:
			proto.ended()
			if err := in.lost(p, cause != nil, proto, out); err != nil {
				return nil, err
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
	ex := out.finish(start)
	if s := in.sb; s.cfg.activity && !s.noActs {
		ex.Activity = s.activityOf(p.cmd.proc.ID, p.cmd.proc.ActivityFrom(acts), wire.Exit{}, 0, time.Now())
	}
	if errors.Is(cause, context.Canceled) {
		return ex, fmt.Errorf("sandbox: interpreter run: %w", context.Canceled)
	}
	return ex, nil
}

// lost handles the end of the process during a run: the interpreter's
// state is lost, and the run's error says why — the OOM killer, a kill
// after the run did not stop (stopped), or the process's own exit. It
// returns an error instead when the end is the interpreter's or the
// sandbox's.
func (in *Interpreter) lost(p *interpProc, stopped bool, proto runProtocol, out *runOutput) error {
	in.setProc(nil)
	out.ex.StateLost = true
	if in.closed.Load() {
		return errInterpreterClosed
	}
	if p.err != nil {
		return p.err
	}
	if err := in.sb.check(); err != nil {
		return err
	}
	switch {
	case p.state.OOMKilled():
		out.ex.Error = &CodeError{Name: "MemoryError", Value: "the interpreter was killed by the out-of-memory killer (Limits.Memory); its state is lost"}
	case stopped:
		out.ex.Error = &CodeError{Name: "TimeoutError", Value: "the run did not stop when interrupted and was killed with every process it started; the interpreter's state is lost"}
	default:
		out.ex.Error = proto.exited(p.state)
	}
	return nil
}

// runNonce is a run's own random ID: the process tags the run's messages
// (Python) or its end marker (shells) with it, and messages of another
// run (late, or forged by code writing to the driver's descriptor) are
// dropped.
func runNonce() string {
	var b [12]byte
	rand.Read(b[:])
	return "as" + hex.EncodeToString(b[:])
}

// runOutput gathers what one run produced.
type runOutput struct {
	ex             Execution
	stdout, stderr *capture     // at most Limits.OutputBytes each
	sinks          [3]io.Writer // by stream number: 1 stdout, 2 stderr (the captures, and the Interpreter's writers)
	outputs        *interp.Outputs
}

// newRunOutput makes a run's output; an internal run (the readiness
// probe) is not copied to the Interpreter's writers.
func (in *Interpreter) newRunOutput(internal bool) *runOutput {
	limit := in.sb.cfg.limits.OutputBytes
	o := &runOutput{stdout: newCapture(limit), stderr: newCapture(limit)}
	outLimit := int64(-1)
	if limit >= 0 {
		outLimit = 4 * limit
	}
	o.outputs = interp.NewOutputs(outLimit)
	o.sinks[1], o.sinks[2] = o.stdout, o.stderr
	if !internal {
		if in.Stdout != nil {
			o.sinks[1] = io.MultiWriter(o.stdout, in.Stdout)
		}
		if in.Stderr != nil {
			o.sinks[2] = io.MultiWriter(o.stderr, in.Stderr)
		}
	}
	return o
}

// finish returns the run's Execution, started at start.
func (o *runOutput) finish(start time.Time) *Execution {
	ex := &o.ex
	ex.Stdout, ex.Stderr = o.stdout.String(), o.stderr.String()
	for _, out := range o.outputs.List {
		ex.Outputs = append(ex.Outputs, Output(out))
	}
	ex.Truncated = ex.Truncated || o.outputs.Truncated || o.stdout.truncated || o.stderr.truncated
	ex.Duration = time.Since(start)
	if ex.TimedOut && ex.Error == nil {
		ex.Error = &CodeError{Name: "TimeoutError", Value: "the run was stopped at its timeout"}
	}
	return ex
}

// runProtocol is one run as an interpreter process's protocol carries
// it: Python's driver speaks in messages, a shell in its output streams.
type runProtocol interface {
	// request is what the process reads to run code.
	request(code string) []byte
	// event takes one of the process's events and says whether the run
	// is done.
	event(ev interpEvent) (done bool)
	// interrupt asks the process to stop the run, and returns when to
	// kill it if the run has not ended by then.
	interrupt() <-chan time.Time
	// ended takes the end of the process during the run.
	ended()
	// exited is the run's error when the process exited by itself.
	exited(ps *ProcessState) *CodeError
}

// pythonRun is a run of the Python driver: a JSON request; the driver's
// messages tagged with the run's nonce carry its output, displays and
// end; an interrupt raises KeyboardInterrupt, the state kept.
type pythonRun struct {
	p     *interpProc
	out   *runOutput
	nonce string
}

func (r *pythonRun) request(code string) []byte { return pythonRequest("run", r.nonce, code) }

func (r *pythonRun) event(ev interpEvent) bool {
	switch {
	case ev.tooBig:
		r.out.ex.Truncated = true
	case ev.msg == nil || ev.msg.ID != r.nonce: // another run's, or forged
	case ev.msg.T == "out":
		r.out.sinks[ev.msg.S].Write(ev.msg.B)
	case ev.msg.T == "display":
		r.out.outputs.Add(ev.msg.Data)
	case ev.msg.T == "done":
		if e := ev.msg.Error; e != nil {
			r.out.ex.Error = &CodeError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
		}
		return true
	}
	return false
}

func (r *pythonRun) interrupt() <-chan time.Time {
	go r.p.stdin.Write(pythonRequest("interrupt", r.nonce, "")) // fails once the process ends
	return time.After(interruptGrace)
}

func (r *pythonRun) ended() {}

func (r *pythonRun) exited(ps *ProcessState) *CodeError {
	return &CodeError{Name: "InterpreterExited", Value: fmt.Sprintf("the interpreter exited with status %d; its state is lost", ps.ExitCode())}
}

// shellRun is a run of a shell: the code is eval'ed, and the run's end is
// a marker with its exit status on each output stream; what follows the
// markers (background output) is kept for the next run. A stopped run is
// killed at once.
type shellRun struct {
	p       *interpProc
	out     *runOutput
	nonce   string
	markers [3]*interp.Marker // by stream number
}

func newShellRun(p *interpProc, out *runOutput, nonce string) *shellRun {
	r := &shellRun{p: p, out: out, nonce: nonce}
	for i := 1; i <= 2; i++ {
		r.markers[i] = interp.NewMarker(nonce, func(b []byte) { out.sinks[i].Write(b) })
		if len(p.rest[i]) > 0 { // background output after the last run
			r.markers[i].Write(p.rest[i])
			p.rest[i] = nil
		}
	}
	return r
}

func (r *shellRun) request(code string) []byte { return []byte(interp.ShellRun(code, r.nonce)) }

func (r *shellRun) event(ev interpEvent) bool {
	if ev.stream != 1 && ev.stream != 2 {
		return false
	}
	r.markers[ev.stream].Write(ev.data)
	status, ok1 := r.markers[1].Done()
	_, ok2 := r.markers[2].Done()
	if !ok1 || !ok2 {
		return false
	}
	if status != 0 {
		r.out.ex.Error = &CodeError{Name: "ExitStatus", Value: strconv.Itoa(status)}
	}
	r.p.rest[1], r.p.rest[2] = r.markers[1].Rest(), r.markers[2].Rest()
	return true
}

func (r *shellRun) interrupt() <-chan time.Time { return closedTime }

func (r *shellRun) ended() {
	r.markers[1].Flush()
	r.markers[2].Flush()
}

func (r *shellRun) exited(ps *ProcessState) *CodeError {
	return &CodeError{Name: "ExitStatus", Value: strconv.Itoa(ps.ExitCode())}
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
