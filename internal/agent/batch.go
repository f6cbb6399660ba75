//go:build linux

package main

import (
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Frames to the library go out in batches: every write the agent makes is
// also a read and a write for the engine's relays (the container's shim,
// dockerd) and a read for the library, so frames that come together — at
// a command's end its last output, the two ends of stream and Exited — are
// better sent in one write than in four. Frames that answer a request or
// end one (Exited, Done, Pong...) are written at once, with every frame
// before them. The others (Started, output, acknowledgements) are written
// as soon as the agent has nothing else it can do right away: a flusher
// goroutine yields to every goroutine that can run (those about to add
// frames of their own) before it writes. No timer is involved, so nothing
// waits longer than that (a timer would add up to a millisecond: the
// runtime's poller sleeps in whole milliseconds), which matters because
// output is also a reply: an interpreter's result is a line of output.
// Order is kept; batchSize bytes pending are written at once.
const batchSize = 64 << 10

// batcher is the agent's output: an io.Writer of whole frames (as
// wire.Writer writes them) that batches them onto w. A writer waits while
// w is busy, as it would for a full pipe.
type batcher struct {
	w    io.Writer
	kick chan struct{} // wakes the flusher

	mu      sync.Mutex // held while pending is written: order is kept
	pending []byte
	armed   bool // the flusher was kicked and has not flushed yet
}

func newBatcher(w io.Writer) *batcher {
	b := &batcher{w: w, kick: make(chan struct{}, 1)}
	go b.flusher()
	return b
}

// lazy reports whether a frame of kind k may wait for others.
func lazy(k wire.Kind) bool {
	return k == wire.Started || k == wire.Stdout || k == wire.Stderr || k == wire.Ack
}

// Write takes one whole frame.
func (b *batcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = append(b.pending, p...)
	switch {
	case len(p) == 0 || !lazy(wire.Kind(p[0])) || len(b.pending) >= batchSize:
		b.writeLocked()
	case !b.armed:
		b.armed = true
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// flusher writes lazy frames once every goroutine that could add to them
// has had its turn.
func (b *batcher) flusher() {
	for range b.kick {
		runtime.Gosched()
		runtime.Gosched()
		b.mu.Lock()
		if b.armed {
			b.writeLocked()
		}
		b.mu.Unlock()
	}
}

// writeLocked writes what is pending. If the library is gone, the agent
// exits (which ends the container).
func (b *batcher) writeLocked() {
	b.armed = false
	if len(b.pending) == 0 {
		return
	}
	if _, err := b.w.Write(b.pending); err != nil {
		os.Exit(0)
	}
	if cap(b.pending) > 4*batchSize {
		b.pending = nil
	} else {
		b.pending = b.pending[:0]
	}
}
