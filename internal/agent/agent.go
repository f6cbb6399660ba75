//go:build linux

package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/ident"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// tagBase is the first supplementary group ID given to commands as their
// tag; command n gets tagBase+n. The range is far from any real group.
const tagBase = 1_900_000_000

// tagSpan is how many tags there are in a user namespace that maps too few
// IDs for tagBase (a rootless engine's 65536): the top tagSpan of them,
// each reused once no process carries it.
const tagSpan = 8192

// instance is what every session of the agent shares: the processes it
// reaps, the tags, the file workers, the freeze, egress and the lease.
type instance struct {
	mu       sync.Mutex   // guards the maps, the instance's and every session's; held while starting and reaping
	freezing sync.RWMutex // held by a capture (write) and around starts (read)
	keep     []int        // processes a capture never stops: the relays carrying the sessions' frames (pod.go)
	byPID    map[int]*proc
	nextTag  uint32
	tags     tagRange // where tags come from
	// owners (leased instances only) is the session of each tag given
	// out that a process may still carry: a session's end kills its
	// commands by them. Tags no process carries are dropped once it
	// holds pruneAt.
	owners  map[uint32]*agent
	pruneAt int
	over    bool // the lease ended: nothing starts any more

	relayUID uint32 // the user and group of the library's relays (see relayUID), which no command may take

	fs      *workers  // run file operations as the sandbox user
	oom     *oomScore // the agent's own oom_score_adj, raised around forks
	env     []string  // the agent's environment: every command's, before its own
	devNull int       // /dev/null, the stdin of commands without one

	greeting wire.Greeting    // what each session is greeted with
	egress   *egress          // the relay port; nil without one
	lease    *lease           // nil: the instance is tethered
	seq      uint64           // sessions accepted so far
	nextID   uint64           // commands given an ID so far
	cmds     map[string]*proc // commands by ID: those running, and the last wire.MaxEnded that ended (attach.go)
	ended    []*proc          // the commands of cmds that ended, oldest first
	sessions int              // sessions open (leased instances)
	execOnly bool             // sessions only from processes the engine exec'd (see execd)
	usage    usageMeter       // what the sandbox uses (usage.go)
	mon      *monitor         // the activity record's monitor; nil: none (gVisor, tests)
	acts     activityTracker  // the records it fills, by command tag
	nwatches int              // watches running, over all sessions (at most wire.MaxWatches)
}

// agent is one session: a stream from and to the library (the only one
// of a tethered instance) and the channels it opened, which are its own.
type agent struct {
	*instance
	w   *wire.Writer
	out io.Writer // what w writes to: a *batcher but in some tests

	seq      uint64 // the session's order: later sessions have higher ones
	relayPID int    // the process carrying its frames (pod.go), 0 if none
	broken   func() // the stream to the library broke: what then

	// Under mu:
	byChan  map[uint32]*proc
	files   map[uint32]*fileOp
	relays  map[uint32]*relay
	watches map[uint32]*dirWatch
	ended   bool // the session ended: nothing new starts in it
}

// proc is one command.
type proc struct {
	// s and ch are the session attached to it (the one that started it,
	// or the last to attach) and its channel there; s is nil while the
	// command is detached (see wire.ExecRequest.Keep). Under mu.
	s     *agent
	ch    uint32
	in    *instance
	pid   int
	tag   uint32
	stdin *inbox  // nil without stdin; set before the command is known
	out   *window // output credit granted by the session attached (under mu; nil while detached)
	keep  bool    // outlives its session (wire.ExecRequest.Keep, leased instances)
	group bool    // what it left is killed when its process exits (wire.ExecRequest.Group)
	act   *actRec // its activity record; nil: none kept
	noAct bool    // an activity record was asked for and the agent has no monitor

	args    []string
	started time.Time

	id   string   // the command's ID (wire.Start.ID)
	tty  *os.File // a PTY command's terminal (master side), else nil
	veof byte     // the terminal's end-of-file character

	mu      sync.Mutex
	streams int // output streams not yet at their end
	reaped  bool
	killed  bool
	forgot  bool // the command was forgotten (its stdin dropped, not ended)

	rings [2]ring // stdout, stderr while detached
	// recent is a terminal's last output, attached or not: what a
	// reattach replays, so that the new screen shows what the terminal
	// showed (a shell's prompt and lines, not only what came after).
	recent ring
	ends   [2]bool    // the streams that ended
	exit   *wire.Exit // how it ended, once it did
}

// newInstance returns an instance with no session yet.
func newInstance(fs *workers, oom *oomScore) *instance {
	null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		null = -1 // commands without stdin then fail to start, saying so
	}
	mapped, _ := mappedIDs()
	return &instance{byPID: map[int]*proc{}, relayUID: relayUID(mapped), fs: fs, oom: oom, env: os.Environ(), devNull: null,
		usage: usageMeter{root: cgroupRoot, self: "/proc/self/cgroup"}}
}

// newAgent returns the only session of a new tethered instance: a
// broken stream ends the agent.
func newAgent(out io.Writer, fs *workers, oom *oomScore) *agent {
	return newInstance(fs, oom).newSession(out, 0, nil)
}

// newSession begins a session writing to out, carried by process
// relayPID (0: none). broken is what a failed write does; nil exits (the
// only session of a tethered instance).
func (in *instance) newSession(out io.Writer, relayPID int, broken func()) *agent {
	in.mu.Lock()
	in.seq++
	seq := in.seq
	in.mu.Unlock()
	return in.newSessionAt(seq, out, relayPID, broken)
}

// newSessionAt is newSession of the session numbered seq (see
// serveSessions).
func (in *instance) newSessionAt(seq uint64, out io.Writer, relayPID int, broken func()) *agent {
	if broken == nil {
		broken = func() { os.Exit(0) }
	}
	a := &agent{
		instance: in, w: wire.NewWriter(out), out: out, seq: seq, relayPID: relayPID, broken: broken,
		byChan: map[uint32]*proc{}, files: map[uint32]*fileOp{}, relays: map[uint32]*relay{},
		watches: map[uint32]*dirWatch{},
	}
	in.mu.Lock()
	if relayPID > 0 {
		in.keep = append(in.keep, relayPID)
	}
	in.mu.Unlock()
	return a
}

// pipes makes the pipes between the agent and a command, and holds the
// command's ends until they are handed over.
type pipes struct {
	child []uintptr // the command's ends, in the order made
}

// pipe makes a pipe. If toAgent, the command writes and the agent reads;
// else the agent writes (stdin). It returns the agent's end.
func (p *pipes) pipe(toAgent bool) (*os.File, error) {
	var fd [2]int
	if err := syscall.Pipe2(fd[:], syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	mine, theirs := fd[0], fd[1]
	if !toAgent {
		mine, theirs = fd[1], fd[0]
	}
	if err := syscall.SetNonblock(mine, true); err != nil {
		syscall.Close(mine)
		syscall.Close(theirs)
		return nil, err
	}
	p.child = append(p.child, uintptr(theirs))
	return os.NewFile(uintptr(mine), "|"), nil
}

// close closes the command's ends (once).
func (p *pipes) close() {
	for _, fd := range p.child {
		syscall.Close(int(fd))
	}
	p.child = nil
}

// send writes a frame; if the library is gone, the session breaks (the
// only session of a tethered instance: the agent exits, which ends the
// container).
func (a *agent) send(kind wire.Kind, ch uint32, data []byte) {
	if err := a.w.Write(kind, ch, data); err != nil {
		a.broken()
	}
}

func (a *agent) sendJSON(kind wire.Kind, ch uint32, v any) {
	if err := a.w.WriteJSON(kind, ch, v); err != nil {
		a.broken()
	}
}

func (a *agent) fail(ch uint32, err error) { a.send(wire.Failed, ch, []byte(err.Error())) }

// flush writes the frames the batcher holds back, now.
func (a *agent) flush() {
	if b, ok := a.out.(*batcher); ok {
		b.flushNow()
	}
}

func (a *agent) lookup(ch uint32) *proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byChan[ch]
}

// serve reads the library's frames until its stream ends.
func (a *agent) serve(r io.Reader) {
	for {
		f, err := wire.ReadFrame(r)
		if err != nil {
			return
		}
		switch f.Kind {
		case wire.Exec:
			var req wire.ExecRequest
			if err := json.Unmarshal(f.Data, &req); err != nil {
				a.fail(f.Channel, fmt.Errorf("agent: bad exec request: %w", err))
				continue
			}
			go a.start(f.Channel, req)
		case wire.File:
			var req wire.FileRequest
			if err := json.Unmarshal(f.Data, &req); err != nil {
				a.fail(f.Channel, fmt.Errorf("agent: bad file request: %w", err))
				continue
			}
			a.startFile(f.Channel, req)
		case wire.Dial:
			a.dial(f.Channel, f.Data)
		case wire.Accept:
			a.accept(f.Channel)
		case wire.Watch:
			a.startWatch(f.Channel, f.Data)
		case wire.Stdin, wire.CloseStdin, wire.Ack, wire.Kill:
			if w := a.lookupWatch(f.Channel); w != nil {
				a.watchInput(w, f)
				continue
			}
			if r := a.lookupRelay(f.Channel); r != nil {
				a.relayInput(r, f)
				continue
			}
			a.command(f)
		case wire.Resize:
			a.resize(f)
		case wire.Attach:
			a.attach(f.Channel, f.Data)
		case wire.List:
			a.list(f.Channel)
		case wire.UsageQuery:
			var req wire.UsageRequest
			if err := json.Unmarshal(f.Data, &req); err != nil || len(req.Dirs) > maxUsageDirs {
				a.fail(f.Channel, fmt.Errorf("agent: bad usage request (at most %d places)", maxUsageDirs))
				continue
			}
			go a.sendUsage(f.Channel, req.Dirs)
		case wire.Ping:
			a.send(wire.Pong, f.Channel, nil)
		case wire.OOM:
			a.sendJSON(wire.OOMCount, f.Channel, oomKills())
		case wire.Lease:
			var req wire.LeaseRequest
			if err := json.Unmarshal(f.Data, &req); err != nil {
				a.fail(f.Channel, fmt.Errorf("agent: bad lease request: %w", err))
				continue
			}
			a.sendJSON(wire.LeaseState, f.Channel, a.lease.query(req.Renew))
		}
	}
}

// command takes a frame of the library's for a command or a file
// operation.
func (a *agent) command(f wire.Frame) {
	switch f.Kind {
	case wire.Stdin, wire.CloseStdin:
		if op := a.lookupFile(f.Channel); op != nil {
			a.fileInput(op, f)
			return
		}
		p := a.lookup(f.Channel)
		if p == nil || p.stdin == nil {
			return
		}
		if f.Kind == wire.CloseStdin {
			p.stdin.close()
		} else {
			p.stdin.feed(f.Data)
		}
	case wire.Ack:
		if n, err := wire.Count(f.Data); err == nil {
			if p := a.lookup(f.Channel); p != nil {
				if w := p.window(); w != nil && p.attachedTo(a, f.Channel) {
					w.give(int(n))
				}
			} else if op := a.lookupFile(f.Channel); op != nil {
				op.out.give(int(n))
			}
		}
	case wire.Kill:
		if op := a.lookupFile(f.Channel); op != nil {
			a.abortFile(op)
			return
		}
		go a.kill(f.Channel)
	}
}

// start runs a command and reports on it.
func (a *agent) start(ch uint32, req wire.ExecRequest) {
	if len(req.Args) == 0 {
		a.fail(ch, errors.New("agent: no command"))
		return
	}
	if req.TTY != nil {
		if err := wire.CheckTTY(*req.TTY); err != nil {
			a.fail(ch, fmt.Errorf("agent: %w", err))
			return
		}
	}
	p := &proc{in: a.instance, s: a, ch: ch, out: newWindow(wire.Window), streams: 2, args: req.Args, started: time.Now()}
	p.keep = req.Keep && a.lease != nil
	p.group = req.Group
	if req.TTY != nil {
		p.streams = 1 // the terminal's output; stderr ends at once
	}
	if req.Stdin {
		p.stdin = newInbox()
	}
	uid, gid, err := ident.Resolve(req.User, "/etc/passwd", "/etc/group")
	if err == nil && (uid == a.relayUID || gid == a.relayUID) {
		err = fmt.Errorf("user %d:%d: ID %d is the agent's relay's", uid, gid, a.relayUID)
	}
	if err != nil {
		a.fail(ch, fmt.Errorf("agent: %w", err))
		return
	}
	add := req.Env
	if req.TTY != nil {
		add = append([]string{"TERM=" + cmp.Or(req.TTY.Term, wire.DefaultTerm)}, req.Env...)
	}
	env := mergeEnv(a.env, add)
	path, err := lookPath(req.Args[0], env)
	if err != nil {
		// As a shell would: the command runs, says why on stderr (the
		// terminal, for a PTY command), and exits 127 (not found) or 126
		// (found, cannot run).
		code := 127
		if !errors.Is(err, fs.ErrNotExist) {
			code = 126
		}
		why := wire.Stderr
		if req.TTY != nil {
			why = wire.Stdout
		}
		a.sendJSON(wire.Started, ch, wire.Start{ID: a.newID()})
		a.send(why, ch, []byte(fmt.Sprintf("%s: %v\n", req.Args[0], err)))
		a.send(wire.Stdout, ch, nil)
		a.send(wire.Stderr, ch, nil)
		a.sendJSON(wire.Exited, ch, wire.Exit{Code: code})
		return
	}
	// Raw pipes (or a terminal's descriptors): the command's ends are
	// plain blocking descriptors handed to it, never the Go runtime's; the
	// agent's ends are non-blocking files read (or written) through its
	// poller.
	var fds pipes
	defer fds.close()
	var stdout, stderr, stdinW *os.File
	sys := &syscall.SysProcAttr{Setsid: true}
	var files []uintptr
	if req.TTY != nil {
		var t *os.File
		t, p.veof, err = a.openPTY(&fds, uid, gid, *req.TTY)
		if err != nil {
			a.fail(ch, fmt.Errorf("agent: %w", err))
			return
		}
		stdout, p.tty = t, t
		if req.Stdin {
			stdinW = t
		}
		sys.Setctty, sys.Ctty = true, 0
		files = []uintptr{fds.child[0], fds.child[0], fds.child[0]}
	} else {
		var err1, err2, err3 error
		stdout, err1 = fds.pipe(true)
		stderr, err2 = fds.pipe(true)
		if req.Stdin {
			stdinW, err3 = fds.pipe(false)
		} else if a.devNull < 0 {
			err3 = errors.New("no /dev/null")
		}
		if err := errors.Join(err1, err2, err3); err != nil {
			stdout.Close()
			stderr.Close()
			a.fail(ch, fmt.Errorf("agent: pipes: %w", err))
			return
		}
		stdin := uintptr(a.devNull)
		if req.Stdin {
			stdin = fds.child[2]
		}
		files = []uintptr{stdin, fds.child[0], fds.child[1]}
	}
	closeAll := func() {
		for _, f := range []*os.File{stdout, stderr, stdinW} {
			if f != nil {
				f.Close()
			}
		}
	}
	attr := &syscall.ProcAttr{Dir: req.Dir, Env: env, Files: files, Sys: sys}
	a.freezing.RLock() // no command starts while the sandbox is frozen
	defer a.freezing.RUnlock()
	a.mu.Lock()
	_, dup := a.byChan[ch]
	if dup || a.ended || a.over {
		ended := a.ended || a.over
		a.mu.Unlock()
		closeAll()
		if !ended { // else nobody hears it
			a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		}
		return
	}
	p.tag = a.newTag()
	p.id = a.newIDLocked()
	attr.Sys.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid, p.tag}}
	// Under a.mu: the reaper cannot collect the child before it is known
	// (and forks, which change the agent's oom_score_adj, take turns).
	fork := func() { a.oom.forking(func() { p.pid, err = syscall.ForkExec(path, req.Args, attr) }) }
	switch {
	case req.NoActivity:
		fork()
	case a.mon == nil:
		p.noAct = true
		fork()
	default:
		p.act = &actRec{max: min(cmp.Or(req.MaxActivity, wire.DefaultMaxActivity), maxActivity), budget: activityBudget}
		p.act.live = p.sendActivity
		a.acts.track(p.tag, p.act)
		a.mon.fork(path, req.Args, p.tag, fork)
		if err != nil {
			a.acts.untrack(p.tag)
		}
	}
	if err == nil {
		a.byChan[ch] = p
		a.byPID[p.pid] = p
		a.register(p)
	}
	a.mu.Unlock()
	fds.close() // the command's ends: the command has them now
	if err != nil {
		closeAll()
		a.fail(ch, fmt.Errorf("agent: start %s: %w", req.Args[0], err))
		return
	}
	a.sendJSON(wire.Started, ch, wire.Start{PID: p.pid, ID: p.id})
	if p.tty != nil {
		p.emit(wire.Stderr, nil) // merged into the terminal
		if !req.Stdin {
			p.tty.Write([]byte{p.veof}) // no input: end of file at once
		}
	}
	if stdinW != nil {
		go a.writeStdin(p, stdinW)
	}
	go a.pump(p, stdout, wire.Stdout)
	if stderr != nil {
		go a.pump(p, stderr, wire.Stderr)
	}
}

// newID returns a new command ID (see wire.Start.ID).
func (a *agent) newID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.newIDLocked()
}

// newIDLocked is newID with a.mu held.
func (a *agent) newIDLocked() string {
	a.nextID++
	return "c" + strconv.FormatUint(a.nextID, 10)
}

// writeStdin writes the command's stdin as it arrives and acknowledges
// it. A command that exits or closes its stdin ends the writing; the rest
// is acknowledged and dropped. The end of a PTY command's stdin is the
// terminal's end-of-file character, written once, or twice after a
// partial line (the first ends the line, as a user's C-d does): the
// terminal itself stays open, for its output.
func (a *agent) writeStdin(p *proc, w *os.File) {
	broken := false
	last := byte('\n')
	for {
		b, ok := p.stdin.next()
		if !ok {
			break
		}
		if !broken {
			if _, err := w.Write(b); err != nil {
				broken = true
				if p.tty == nil {
					w.Close()
				}
			} else if len(b) > 0 {
				last = b[len(b)-1]
			}
		}
		p.ack(len(b))
	}
	switch {
	case broken:
	case p.tty == nil:
		w.Close()
	case p.stdinEOF():
		eof := []byte{p.veof}
		if last != '\n' && last != p.veof {
			eof = append(eof, p.veof)
		}
		w.Write(eof)
	}
}

// pump sends a command's output stream, no more than the library's credit
// allows, then the end-of-stream marker.
func (a *agent) pump(p *proc, r *os.File, kind wire.Kind) {
	if p.tty == nil {
		defer r.Close()
	} // else forget closes it: see there
	buf := make([]byte, pumpBuf)
	for {
		w := p.window()
		n := len(buf)
		if w != nil {
			if n = w.take(len(buf)); n == 0 {
				if p.window() != w {
					continue // detached, or attached elsewhere
				}
				break // closed: the command's session ended
			}
		}
		m, err := r.Read(buf[:n])
		if p.tty != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			m, err = recheckTTY(r, p.tag, buf[:n])
		}
		if m > 0 {
			p.emit(kind, buf[:m])
		}
		if w != nil {
			w.give(n - m)
		}
		if err != nil {
			break
		}
	}
	p.emit(kind, nil)
	p.mu.Lock()
	p.streams--
	done := p.streams == 0 && p.reaped
	p.mu.Unlock()
	if done {
		p.forget()
	}
}

// forget drops a command whose process was reaped and whose output ended
// from the session attached to it, and retires it from the registry.
func (p *proc) forget() {
	p.mu.Lock()
	s, ch := p.s, p.ch
	p.mu.Unlock()
	in := p.in
	if p.act != nil {
		in.acts.untrack(p.tag)
	}
	in.mu.Lock()
	if s != nil && s.byChan[ch] == p {
		delete(s.byChan, ch)
	}
	in.retire(p)
	in.mu.Unlock()
	if p.tty != nil {
		// Only now, the process reaped: closing the terminal hangs it up,
		// and a program that closed its descriptors before exiting (cat
		// does) would die of the SIGHUP.
		p.tty.Close()
	}
	if p.stdin != nil {
		p.mu.Lock()
		p.forgot = true
		p.mu.Unlock()
		p.stdin.close() // ends writeStdin if the library never closed it
	}
}

// stdinEOF reports whether the end of the command's stdin is the
// library's CloseStdin, rather than the command being forgotten.
func (p *proc) stdinEOF() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.forgot
}

// startReaper starts reap. It asks for SIGCHLD before it returns, and the
// reaper's first pass is at once: a SIGCHLD that comes before Go relays it
// is dropped, so a command that started before and ended quickly would
// never be reaped, its exit never reported (its Exec waiting until
// ExecTimeout, then failing). stop ends it (for an instance that is not
// the process's only one: a benchmark's, whose reapers would take each
// other's children).
func (a *instance) startReaper() (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	sig <- syscall.SIGCHLD
	go a.reap(sig)
	return func() { signal.Stop(sig); close(sig) }
}

// reap collects every child that ends (the agent is PID 1: orphans of the
// whole container come to it) and reports the commands' own exits, each
// to its session, never waiting for one (a library that does not read
// holds up its own session only): a pass on every signal from sig.
func (a *instance) reap(sig <-chan os.Signal) {
	for range sig {
		a.mu.Lock()
		var ended []*proc
		var statuses []syscall.WaitStatus
		var usages []syscall.Rusage
		for {
			var ws syscall.WaitStatus
			var ru syscall.Rusage
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
			if pid <= 0 || err != nil {
				break
			}
			if p := a.byPID[pid]; p != nil {
				delete(a.byPID, pid)
				ended = append(ended, p)
				statuses = append(statuses, ws)
				usages = append(usages, ru)
			}
		}
		a.mu.Unlock()
		for i, p := range ended {
			go p.exited(statuses[i], &usages[i])
		}
	}
}

// exited reports the end of the command's process, with its resource
// usage (ru: its own and that of the descendants it waited for).
func (p *proc) exited(ws syscall.WaitStatus, ru *syscall.Rusage) {
	if p.tty != nil {
		p.tty.SetReadDeadline(time.Now().Add(ttyRecheck)) // see recheckTTY
	}
	p.mu.Lock()
	p.reaped = true
	done := p.streams == 0
	e := wire.Exit{Code: ws.ExitStatus(), Killed: p.killed,
		UserNS: ru.Utime.Nano(), SystemNS: ru.Stime.Nano(), MaxRSS: ru.Maxrss << 10}
	p.mu.Unlock()
	if ws.Signaled() {
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	}
	if p.group {
		killTag(p.tag, os.Getpid())
	}
	var acts []wire.Act
	if p.act != nil {
		acts, e.Dropped = p.act.take()
	}
	e.NoActivity = p.noAct
	p.exitWith(e, acts)
	if done {
		p.forget()
	}
}

// kill kills every process of the command on channel ch and reports when
// none is left.
func (a *agent) kill(ch uint32) {
	p := a.lookup(ch)
	if p == nil {
		a.sendJSON(wire.Killed, ch, wire.KillResult{})
		return
	}
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	n, rounds := killTag(p.tag, os.Getpid())
	a.sendJSON(wire.Killed, ch, wire.KillResult{Processes: n, Rounds: rounds})
}

// tagRange is where commands' tags come from: from tagBase up, or, in a
// small user namespace, a span of reused tags.
type tagRange struct {
	base, span uint32 // span 0: from tagBase up, never reused
}

// tagsFor returns the tags for a user namespace that maps IDs 0 to
// mapped-1.
func tagsFor(mapped uint64) tagRange {
	if mapped > tagBase+1<<30 {
		return tagRange{}
	}
	return tagRange{base: uint32(mapped - tagSpan), span: tagSpan - 1} // the top ID is the relay's (relayUID)
}

// newTag returns the next command's tag for session a (a.mu held),
// recording a as its owner in a leased instance.
func (a *agent) newTag() uint32 {
	t := a.instance.newTag()
	if a.owners != nil {
		if len(a.owners) >= a.pruneAt {
			inUse := groupsInUse(os.Getpid())
			for tag := range a.owners {
				if !inUse[tag] {
					delete(a.owners, tag)
				}
			}
			a.pruneAt = max(pruneFloor, 2*len(a.owners))
		}
		a.owners[t] = a
	}
	return t
}

// pruneFloor is the least number of tag owners an instance holds before
// it looks for tags no process carries.
const pruneFloor = 4096

// newTag returns the next command's tag (a.mu held). A reused tag is one
// no live process carries: a kill by it takes only its own command's
// processes.
func (a *instance) newTag() uint32 {
	a.nextTag++
	if a.tags.span == 0 {
		return tagBase + a.nextTag
	}
	inUse := groupsInUse(os.Getpid())
	for range a.tags.span {
		t := a.tags.base + a.nextTag%a.tags.span
		if !inUse[t] {
			return t
		}
		a.nextTag++
	}
	return a.tags.base + a.nextTag%a.tags.span // every tag taken: share one
}

// mergeEnv returns base with add applied: an entry of add replaces the
// entry of base with the same name; later entries win.
func mergeEnv(base, add []string) []string {
	out := make([]string, 0, len(base)+len(add))
	index := map[string]int{}
	for _, e := range append(append([]string{}, base...), add...) {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := index[k]; ok {
			out[i] = e
			continue
		}
		index[k] = len(out)
		out = append(out, e)
	}
	return out
}

// lookPath finds the program file as a shell would, in the PATH of env.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, executable(name)
	}
	pathVar := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar = v
		}
	}
	var found error
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		err := executable(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, fs.ErrNotExist) && found == nil {
			found = err
		}
	}
	if found != nil {
		return "", found
	}
	return "", errNotFound
}

// errNotFound is a program not found in PATH.
var errNotFound = notFound{}

type notFound struct{}

func (notFound) Error() string        { return "not found" }
func (notFound) Is(target error) bool { return target == fs.ErrNotExist }

func executable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return unwrapSyscall(err)
	case fi.IsDir():
		return errors.New("is a directory")
	case fi.Mode()&0o111 == 0:
		return errors.New("permission denied")
	}
	return nil
}

// unwrapSyscall drops the "fork/exec PATH:" and "stat PATH:" prefixes.
func unwrapSyscall(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
