//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// ring keeps the last wire.RingSize bytes written to it and counts the
// rest, dropped. Its buffer is circular: a write costs its own length,
// however full the ring.
type ring struct {
	buf     []byte // wire.RingSize bytes once written to
	start   int    // where the oldest byte kept is
	n       int    // how many bytes are kept
	dropped int64
}

func (r *ring) write(b []byte) {
	if len(b) == 0 {
		return
	}
	if r.buf == nil {
		r.buf = make([]byte, wire.RingSize)
	}
	if over := len(b) - len(r.buf); over > 0 { // only its end fits
		r.dropped += int64(over)
		b = b[over:]
	}
	if over := r.n + len(b) - len(r.buf); over > 0 { // the oldest go
		r.dropped += int64(over)
		r.start = (r.start + over) % len(r.buf)
		r.n -= over
	}
	end := (r.start + r.n) % len(r.buf)
	c := copy(r.buf[end:], b)
	copy(r.buf, b[c:])
	r.n += len(b)
}

// bytes returns the bytes kept, oldest first, in a slice of their own.
func (r *ring) bytes() []byte {
	out := make([]byte, 0, r.n)
	if r.n == 0 {
		return out
	}
	first := r.buf[r.start:min(len(r.buf), r.start+r.n)]
	out = append(out, first...)
	return append(out, r.buf[:r.n-len(first)]...)
}

// emit sends output of the command to the session attached to it, or
// keeps it in the stream's ring while none is (an empty b is the
// stream's end).
func (p *proc) emit(kind wire.Kind, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := kind - wire.Stdout
	if len(b) == 0 {
		p.ends[i] = true
	} else if p.tty != nil {
		p.recent.write(b)
	}
	switch {
	case p.s != nil:
		p.s.send(kind, p.ch, b)
	case len(b) > 0:
		p.rings[i].write(b)
	}
}

// window returns the output credit of the session attached, nil while
// none is.
func (p *proc) window() *window {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out
}

// ack acknowledges n bytes of stdin to the session attached, if any.
func (p *proc) ack(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s != nil {
		var b [4]byte
		b[0], b[1], b[2], b[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
		p.s.send(wire.Ack, p.ch, b[:])
	}
}

// exitWith reports the command's exit to the session attached, or keeps
// it for the next one.
func (p *proc) exitWith(e wire.Exit, acts []wire.Act) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exit = &e
	if p.s != nil {
		for _, b := range activityBatches(acts) {
			p.s.w.Write(wire.Activity, p.ch, b)
		}
		p.s.sendJSON(wire.Exited, p.ch, e)
	}
}

// sendActivity sends the activity events of the command not sent yet to
// the session attached, as they happen (the library logs them live); the
// rest go with its exit (exitWith). Detached, they wait.
func (p *proc) sendActivity() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s == nil || p.exit != nil {
		return
	}
	for _, b := range activityBatches(p.act.unsent()) {
		p.s.w.Write(wire.Activity, p.ch, b)
	}
}

// detach lets the command run on with no session (its session ended):
// output goes to the rings, stdin stays open. With p.mu held.
func (p *proc) detachLocked() {
	p.s = nil
	if p.out != nil {
		p.out.close()
		p.out = nil
	}
}

// register records a command in the instance's registry (a.mu held).
func (in *instance) register(p *proc) {
	if in.cmds == nil {
		in.cmds = map[string]*proc{}
	}
	in.cmds[p.id] = p
}

// retire notes that command p ended and was reported (a.mu held): the
// registry keeps the wire.MaxEnded most recent such commands.
func (in *instance) retire(p *proc) {
	if in.cmds[p.id] != p || slices.Contains(in.ended, p) {
		return
	}
	in.ended = append(in.ended, p)
	for len(in.ended) > wire.MaxEnded {
		old := in.ended[0]
		in.ended = in.ended[1:]
		if in.cmds[old.id] == old {
			delete(in.cmds, old.id)
		}
	}
}

// list answers a List frame.
func (a *agent) list(ch uint32) {
	a.mu.Lock()
	procs := make([]*proc, 0, len(a.cmds))
	for _, p := range a.cmds {
		procs = append(procs, p)
	}
	a.mu.Unlock()
	slices.SortFunc(procs, func(x, y *proc) int { return y.started.Compare(x.started) })
	out := []wire.Session{}
	size := 2
	for _, p := range procs {
		p.mu.Lock()
		s := wire.Session{ID: p.id, Terminal: p.tty != nil, Started: p.started.UnixNano(), Running: p.exit == nil, Attached: p.s != nil}
		p.mu.Unlock()
		for i, arg := range p.args {
			if i == wire.MaxArgs {
				break
			}
			if len(arg) > wire.MaxArgBytes {
				arg = arg[:wire.MaxArgBytes]
			}
			s.Args = append(s.Args, arg)
		}
		b, _ := json.Marshal(s)
		if size+len(b)+1 > wire.MaxData {
			break // the newest that fit
		}
		size += len(b) + 1
		out = append(out, s)
	}
	a.sendJSON(wire.SessionList, ch, out)
}

// attach attaches the session to a command on channel ch (an Attach
// frame; see wire.AttachRequest).
func (a *agent) attach(ch uint32, data []byte) {
	var req wire.AttachRequest
	if err := json.Unmarshal(data, &req); err != nil {
		a.fail(ch, fmt.Errorf("agent: bad attach request: %w", err))
		return
	}
	a.mu.Lock()
	p := a.cmds[req.ID]
	_, dup := a.byChan[ch]
	switch {
	case a.ended || a.over:
		a.mu.Unlock()
		return
	case dup:
		a.mu.Unlock()
		a.fail(ch, fmt.Errorf("agent: channel %d is in use", ch))
		return
	case p == nil:
		a.mu.Unlock()
		a.fail(ch, fmt.Errorf("agent: no command %q", req.ID))
		return
	case !p.keep:
		a.mu.Unlock()
		a.fail(ch, fmt.Errorf("agent: command %q cannot be attached: it ends with its session (a tethered sandbox's, or started without Keep)", req.ID))
		return
	}
	a.byChan[ch] = p
	if a.owners != nil {
		// The session that attached owns it now: the end of the one it
		// was taken from must not kill it by its tag (it did, when that
		// end came after the takeover).
		a.owners[p.tag] = a
	}
	a.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.s; old != nil {
		old.send(wire.Taken, p.ch, nil)
		old.mu.Lock()
		if old.byChan[p.ch] == p {
			delete(old.byChan, p.ch)
		}
		old.mu.Unlock()
	}
	if p.out != nil {
		p.out.close()
	}
	replay := [2][]byte{p.rings[0].bytes(), p.rings[1].bytes()}
	if p.tty != nil {
		replay[0] = p.recent.bytes() // what it showed last, attached or not
	}
	kept := len(replay[0]) + len(replay[1])
	// The window counts what the replay sends, and what a pump that read
	// while none was attached may still send.
	p.s, p.ch, p.out = a, ch, newWindow(wire.Window-kept-pumpBuf)
	var said []byte
	if d0, d1 := p.rings[0].dropped, p.rings[1].dropped; d0+d1 > 0 {
		said = fmt.Appendf(nil, "[sandbox: %d bytes of output dropped while detached (stdout %d, stderr %d); what follows is the last %d bytes of each stream]\n",
			d0+d1, d0, d1, wire.RingSize)
	}
	st := wire.Start{PID: p.pid, ID: p.id, Replay: int64(len(replay[0]))}
	if p.tty != nil {
		st.Replay += int64(len(said))
	}
	a.sendJSON(wire.Started, ch, st)
	if len(said) > 0 {
		kind := wire.Stderr
		if p.tty != nil {
			kind = wire.Stdout
		}
		a.send(kind, ch, said)
	}
	for i, kind := range []wire.Kind{wire.Stdout, wire.Stderr} {
		for b := replay[i]; len(b) > 0; b = b[min(len(b), wire.MaxData):] {
			a.send(kind, ch, b[:min(len(b), wire.MaxData)])
		}
		p.rings[i] = ring{}
		if p.ends[i] {
			a.send(kind, ch, nil)
		}
	}
	if p.exit != nil {
		a.sendJSON(wire.Exited, ch, *p.exit)
		if p.ends[0] && p.ends[1] { // nothing more will come
			a.mu.Lock()
			if a.byChan[ch] == p {
				delete(a.byChan, ch)
			}
			a.mu.Unlock()
		}
	}
}

// pumpBuf is the most a pump reads at once.
const pumpBuf = 32 << 10

// running reports whether the command's process has not exited yet.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit == nil
}

// attachedTo reports whether session a, on channel ch, is the one
// attached to the command.
func (p *proc) attachedTo(a *agent, ch uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.s == a && p.ch == ch
}

// closeWindow closes the output window of session a, if a is attached.
func (p *proc) closeWindow(a *agent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.s == a && p.out != nil {
		p.out.close()
	}
}
