//go:build linux

package main

import (
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Frames to the library go out in batches: every write the agent makes is
// also a read and a write for the engine's relays (the container's shim,
// dockerd) and a read for the library, so frames that come together — at
// a command's end the two ends of stream and Exited, with Started when the
// command was short — are better sent in one write than in four. Three
// classes of frame:
//
//   - Frames that answer a request or end one (Exited, Done, Pong...) are
//     written at once, with every frame before them.
//   - Output is written as soon as the agent has nothing else it can do
//     right away: a flusher goroutine yields to every goroutine that can
//     run before it writes. Output is also a reply (an interpreter's
//     result is a line of output), so it must not wait for a timer: the
//     runtime's poller sleeps in whole milliseconds.
//   - Frames nobody waits for — Started, the ends of stream, which Exited
//     always follows, acknowledgements, and activity events as they
//     happen — wait up to batchDelay for company.
//
// Order is kept; batchSize bytes pending are written at once.
const (
	batchDelay = 2 * time.Millisecond
	batchSize  = 64 << 10
)

// batcher is the agent's output: an io.Writer of whole frames (as
// wire.Writer writes them) that batches them onto w. A writer waits while
// w is busy, as it would for a full pipe.
type batcher struct {
	w    io.Writer
	kick chan struct{} // wakes the flusher
	quit chan struct{} // closed by stop: the flusher returns
	t    *time.Timer   // flushes after batchDelay
	fail func()        // what a failed write does (once)

	mu      sync.Mutex // held while pending is written: order is kept
	pending []byte
	kicked  bool // the flusher was kicked and has not flushed yet
	timed   bool // the timer runs
	dead    bool // a write failed, or stop: frames are dropped
}

// newBatcher returns the batcher of a tethered agent's only stream: if
// the library is gone, the agent exits (which ends the container).
func newBatcher(w io.Writer) *batcher { return newSessionBatcher(w, func() { os.Exit(0) }) }

// newSessionBatcher returns a batcher whose first failed write calls fail
// (which ends the session); what comes after is dropped.
func newSessionBatcher(w io.Writer, fail func()) *batcher {
	b := &batcher{w: w, kick: make(chan struct{}, 1), quit: make(chan struct{}), fail: fail}
	b.t = time.AfterFunc(time.Hour, b.flush)
	b.t.Stop()
	go b.flusher()
	return b
}

// stop ends the batcher: its flusher returns and frames are dropped.
func (b *batcher) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.dead {
		b.dead = true
		b.pending = nil
	}
	b.t.Stop()
	select {
	case <-b.quit:
	default:
		close(b.quit)
	}
}

// Write takes one whole frame.
func (b *batcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead {
		return len(p), nil
	}
	b.pending = append(b.pending, p...)
	var k wire.Kind
	if len(p) > 0 {
		k = wire.Kind(p[0])
	}
	output := (k == wire.Stdout || k == wire.Stderr) && len(p) > wire.HeaderSize
	switch {
	case len(b.pending) >= batchSize || !(output || k == wire.Started || k == wire.Stdout || k == wire.Stderr || k == wire.Ack || k == wire.Activity):
		b.writeLocked()
	case output && !b.kicked:
		b.kicked = true
		select {
		case b.kick <- struct{}{}:
		default:
		}
	case !output && !b.timed && !b.kicked:
		b.timed = true
		b.t.Reset(batchDelay)
	}
	return len(p), nil
}

// flusher writes output once every goroutine that could add to it has had
// its turn.
func (b *batcher) flusher() {
	for {
		select {
		case <-b.kick:
		case <-b.quit:
			return
		}
		runtime.Gosched()
		runtime.Gosched()
		b.mu.Lock()
		if b.kicked {
			b.writeLocked()
		}
		b.mu.Unlock()
	}
}

// flushNow writes what is pending at once: for a frame the library waits
// for that is of a class that would wait (a relay's Started and end of
// stream).
func (b *batcher) flushNow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writeLocked()
}

// flush writes what is pending (the delay is over).
func (b *batcher) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timed {
		b.writeLocked()
	}
}

// writeLocked writes what is pending. If the library is gone, the batcher
// fails (see newBatcher and newSessionBatcher).
func (b *batcher) writeLocked() {
	b.kicked = false
	if b.timed {
		b.t.Stop()
		b.timed = false
	}
	if len(b.pending) == 0 || b.dead {
		return
	}
	if _, err := b.w.Write(b.pending); err != nil {
		b.dead, b.pending = true, nil
		b.fail()
		return
	}
	if cap(b.pending) > 4*batchSize {
		b.pending = nil
	} else {
		b.pending = b.pending[:0]
	}
}
