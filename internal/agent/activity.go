//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// actRec is a command's activity record as the monitor fills it: events
// in the order they happened, at most max, the rest counted.
type actRec struct {
	mu      sync.Mutex
	max     int // events kept at most
	budget  int // bytes of paths and arguments kept at most
	events  []wire.Act
	sent    int // events[:sent] went to the library as they happened
	dropped int
	closed  bool // taken: later events are not kept

	// live, if set, sends what is unsent to the session attached to the
	// command (proc.sendActivity): called after each event kept.
	live func()
}

// Bounds of one command's record: maxActivity events at most whatever the
// request asks, and activityBudget bytes of paths and arguments.
const (
	maxActivity    = 1 << 20
	activityBudget = 8 << 20
)

// add keeps ev or counts it, and has what is kept sent as it happens.
func (r *actRec) add(ev wire.Act) {
	r.mu.Lock()
	size := 64 + len(ev.Path) + len(ev.From)
	for _, a := range ev.Args {
		size += len(a) + 3
	}
	kept := false
	switch {
	case r.closed:
	case len(r.events) >= r.max || size > r.budget:
		r.dropped++
	default:
		r.budget -= size
		r.events = append(r.events, ev)
		kept = true
	}
	live := r.live
	r.mu.Unlock()
	if kept && live != nil {
		live()
	}
}

// unsent returns the events not sent yet and counts them sent.
func (r *actRec) unsent() []wire.Act {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events[r.sent:]
	r.sent = len(r.events)
	return ev
}

// take closes the record and returns what it holds that was not sent yet,
// and how many events it dropped.
func (r *actRec) take() ([]wire.Act, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	ev := r.events[r.sent:]
	r.events, r.sent = nil, 0
	return ev, r.dropped
}

// activityTracker finds the command a monitored process belongs to by
// the tag among its supplementary groups (which it cannot drop).
type activityTracker struct {
	mu    sync.Mutex
	byTag map[uint32]*actRec
}

// track starts p's record.
func (t *activityTracker) track(tag uint32, r *actRec) {
	t.mu.Lock()
	if t.byTag == nil {
		t.byTag = map[uint32]*actRec{}
	}
	t.byTag[tag] = r
	t.mu.Unlock()
}

// untrack ends the record of tag.
func (t *activityTracker) untrack(tag uint32) {
	t.mu.Lock()
	delete(t.byTag, tag)
	t.mu.Unlock()
}

// add files ev under the command whose tag is among groups; events of
// processes outside every tracked command are dropped.
func (t *activityTracker) add(ev actEvent) {
	t.mu.Lock()
	var r *actRec
	for g := range bytes.FieldsSeq(ev.groups) {
		n, err := strconv.ParseUint(string(g), 10, 32)
		if err != nil {
			continue
		}
		if r = t.byTag[uint32(n)]; r != nil {
			break
		}
	}
	t.mu.Unlock()
	if r == nil {
		return
	}
	r.add(ev.wire())
}

// wire turns an event into its wire form.
func (ev actEvent) wire() wire.Act {
	a := wire.Act{PID: ev.pid, PPID: ev.ppid, UID: ev.uid, Time: ev.time.UnixNano()}
	switch ev.kind {
	case actExec:
		a.Kind, a.Path, a.Args = "exec", ev.path, ev.args
	case actExit:
		a.Kind, a.Code, a.Signal, a.CPUNS, a.MaxRSS = "exit", ev.code, ev.signal, ev.cpu.Nanoseconds(), ev.maxRSS
	case actConnect:
		a.Kind, a.Net, a.Addr, a.Port = "connect", ev.network, ev.addr, ev.port
	case actFile:
		f := ev.file
		a.Kind, a.Op, a.Path, a.From, a.Size, a.Mode, a.Refused = "file", f.op, f.path, f.from, f.size, uint32(goMode(f.mode)), f.refused
	}
	return a
}

// activityBatches splits events into JSON payloads that each fit a frame.
func activityBatches(events []wire.Act) [][]byte {
	var out [][]byte
	var cur []json.RawMessage
	size := 2
	flush := func() {
		if len(cur) > 0 {
			b, _ := json.Marshal(cur)
			out = append(out, b)
			cur, size = nil, 2
		}
	}
	for _, ev := range events {
		b, err := json.Marshal(ev)
		if err != nil || len(b)+2 > wire.MaxData {
			continue
		}
		if size+len(b)+1 > wire.MaxData {
			flush()
		}
		cur = append(cur, b)
		size += len(b) + 1
	}
	flush()
	return out
}
