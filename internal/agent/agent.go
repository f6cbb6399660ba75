//go:build linux

package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

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

type agent struct {
	w   *wire.Writer
	out io.Writer // what w writes to: a *batcher but in some tests

	mu       sync.Mutex   // guards the maps; held while starting and reaping
	freezing sync.RWMutex // held by a capture (write) and around starts (read)
	keep     []int        // processes a capture never stops: the relay carrying the frames (pod.go)
	byChan   map[uint32]*proc
	byPID    map[int]*proc
	files    map[uint32]*fileOp
	relays   map[uint32]*relay
	nextTag  uint32
	tags     tagRange    // where tags come from
	accepts  chan *relay // Accept requests waiting for a connection; nil without a relay port

	fs      *workers  // run file operations as the sandbox user
	oom     *oomScore // the agent's own oom_score_adj, raised around forks
	env     []string  // the agent's environment: every command's, before its own
	devNull int       // /dev/null, the stdin of commands without one
}

// proc is one command.
type proc struct {
	ch    uint32
	pid   int
	tag   uint32
	stdin *inbox  // nil without stdin; set before the command is known
	out   *window // output credit granted by the library

	mu      sync.Mutex
	streams int // output streams not yet at their end
	reaped  bool
	killed  bool
}

func newAgent(out io.Writer, fs *workers, oom *oomScore) *agent {
	null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		null = -1 // commands without stdin then fail to start, saying so
	}
	return &agent{
		w: wire.NewWriter(out), out: out, byChan: map[uint32]*proc{}, byPID: map[int]*proc{},
		files: map[uint32]*fileOp{}, relays: map[uint32]*relay{}, fs: fs, oom: oom, env: os.Environ(), devNull: null,
	}
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

// send writes a frame; if the library is gone, the agent exits (which ends
// the container).
func (a *agent) send(kind wire.Kind, ch uint32, data []byte) {
	if err := a.w.Write(kind, ch, data); err != nil {
		os.Exit(0)
	}
}

func (a *agent) sendJSON(kind wire.Kind, ch uint32, v any) {
	if err := a.w.WriteJSON(kind, ch, v); err != nil {
		os.Exit(0)
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
		case wire.Stdin, wire.CloseStdin, wire.Ack, wire.Kill:
			if r := a.lookupRelay(f.Channel); r != nil {
				a.relayInput(r, f)
				continue
			}
			a.command(f)
		case wire.Ping:
			a.send(wire.Pong, f.Channel, nil)
		case wire.OOM:
			a.sendJSON(wire.OOMCount, f.Channel, oomKills())
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
				p.out.give(int(n))
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
	p := &proc{ch: ch, out: newWindow(wire.Window), streams: 2}
	if req.Stdin {
		p.stdin = newInbox()
	}
	uid, gid, err := ident.Resolve(req.User, "/etc/passwd", "/etc/group")
	if err != nil {
		a.fail(ch, fmt.Errorf("agent: %w", err))
		return
	}
	env := mergeEnv(a.env, req.Env)
	path, err := lookPath(req.Args[0], env)
	if err != nil {
		// As a shell would: the command runs, says why on stderr, and
		// exits 127 (not found) or 126 (found, cannot run).
		code := 127
		if !errors.Is(err, fs.ErrNotExist) {
			code = 126
		}
		a.sendJSON(wire.Started, ch, wire.Start{})
		a.send(wire.Stderr, ch, []byte(fmt.Sprintf("%s: %v\n", req.Args[0], err)))
		a.send(wire.Stdout, ch, nil)
		a.send(wire.Stderr, ch, nil)
		a.sendJSON(wire.Exited, ch, wire.Exit{Code: code})
		return
	}
	// Raw pipes: the command's ends are plain blocking descriptors handed
	// to it, never the Go runtime's; the agent's ends are non-blocking
	// files read (or written) through its poller.
	var fds pipes
	defer fds.close()
	stdout, err1 := fds.pipe(true)
	stderr, err2 := fds.pipe(true)
	var stdinW *os.File
	var err3 error
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
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   env,
		Files: []uintptr{stdin, fds.child[0], fds.child[1]},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	a.freezing.RLock() // no command starts while the sandbox is frozen
	defer a.freezing.RUnlock()
	a.mu.Lock()
	if _, dup := a.byChan[ch]; dup {
		a.mu.Unlock()
		stdout.Close()
		stderr.Close()
		a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return
	}
	p.tag = a.newTag()
	attr.Sys.Credential = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid, p.tag}}
	// Under a.mu: the reaper cannot collect the child before it is known
	// (and forks, which change the agent's oom_score_adj, take turns).
	a.oom.forking(func() { p.pid, err = syscall.ForkExec(path, req.Args, attr) })
	if err == nil {
		a.byChan[ch] = p
		a.byPID[p.pid] = p
	}
	a.mu.Unlock()
	fds.close() // the command's ends: the command has them now
	if err != nil {
		stdout.Close()
		stderr.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		a.fail(ch, fmt.Errorf("agent: start %s: %w", req.Args[0], err))
		return
	}
	a.sendJSON(wire.Started, ch, wire.Start{PID: p.pid})
	if stdinW != nil {
		go a.writeStdin(p, stdinW)
	}
	go a.pump(p, stdout, wire.Stdout)
	go a.pump(p, stderr, wire.Stderr)
}

// writeStdin writes the command's stdin as it arrives and acknowledges
// it. A command that exits or closes its stdin ends the writing; the rest
// is acknowledged and dropped.
func (a *agent) writeStdin(p *proc, w *os.File) {
	broken := false
	for {
		b, ok := p.stdin.next()
		if !ok {
			break
		}
		if !broken {
			if _, err := w.Write(b); err != nil {
				broken = true
				w.Close()
			}
		}
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		a.send(wire.Ack, p.ch, n[:])
	}
	if !broken {
		w.Close()
	}
}

// pump sends a command's output stream, no more than the library's credit
// allows, then the end-of-stream marker.
func (a *agent) pump(p *proc, r *os.File, kind wire.Kind) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n := p.out.take(len(buf))
		if n == 0 {
			break // closed
		}
		m, err := r.Read(buf[:n])
		if m > 0 {
			a.send(kind, p.ch, buf[:m])
		}
		p.out.give(n - m)
		if err != nil {
			break
		}
	}
	a.send(kind, p.ch, nil)
	p.mu.Lock()
	p.streams--
	done := p.streams == 0 && p.reaped
	p.mu.Unlock()
	if done {
		a.forget(p)
	}
}

// forget drops a command whose process was reaped and whose output ended.
func (a *agent) forget(p *proc) {
	a.mu.Lock()
	if a.byChan[p.ch] == p {
		delete(a.byChan, p.ch)
	}
	a.mu.Unlock()
	if p.stdin != nil {
		p.stdin.close() // ends writeStdin if the library never closed it
	}
}

// reap collects every child that ends (the agent is PID 1: orphans of the
// whole container come to it) and reports the commands' own exits.
func (a *agent) reap() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	for range sig {
		a.mu.Lock()
		var ended []*proc
		var statuses []syscall.WaitStatus
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if p := a.byPID[pid]; p != nil {
				delete(a.byPID, pid)
				ended = append(ended, p)
				statuses = append(statuses, ws)
			}
		}
		a.mu.Unlock()
		for i, p := range ended {
			a.exited(p, statuses[i])
		}
	}
}

func (a *agent) exited(p *proc, ws syscall.WaitStatus) {
	p.mu.Lock()
	p.reaped = true
	done := p.streams == 0
	e := wire.Exit{Code: ws.ExitStatus(), Killed: p.killed}
	p.mu.Unlock()
	if ws.Signaled() {
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	}
	a.sendJSON(wire.Exited, p.ch, e)
	if done {
		a.forget(p)
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
	return tagRange{base: uint32(mapped - tagSpan), span: tagSpan}
}

// newTag returns the next command's tag (a.mu held). A reused tag is one
// no live process carries: a kill by it takes only its own command's
// processes.
func (a *agent) newTag() uint32 {
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
