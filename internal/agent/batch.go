//go:build linux

package main

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Frames to the library go out in batches: every write the agent makes is
// also a read and a write for the engine's relays (the container's shim,
// dockerd) and a read for the library, so a short command's frames —
// Started, its output, the two ends of stream, Exited — are better sent in
// one write than in five. Frames that answer a request or end one
// (Exited, Done, Pong...) are written at once, with every frame before
// them; the others (Started, output, acknowledgements) wait at most
// batchDelay for company, or until batchSize bytes are pending. Order is
// kept.
const (
	batchDelay = 2 * time.Millisecond
	batchSize  = 64 << 10
)

// batcher is the agent's output: an io.Writer of whole frames (as
// wire.Writer writes them) that batches them onto w. The write happens in
// the goroutine of the frame that calls for it (or of the delay's timer):
// no goroutine is woken for it, and a writer waits while w is busy, as it
// would for a full pipe.
type batcher struct {
	w io.Writer
	t *time.Timer // flushes lazy frames after batchDelay

	mu      sync.Mutex // held while pending is written: order is kept
	pending []byte
	armed   bool
}

func newBatcher(w io.Writer) *batcher {
	b := &batcher{w: w}
	b.t = time.AfterFunc(time.Hour, b.flush)
	b.t.Stop()
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
		b.t.Reset(batchDelay)
	}
	return len(p), nil
}

// flush writes what is pending (the delay is over).
func (b *batcher) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writeLocked()
}

// writeLocked writes what is pending. If the library is gone, the agent
// exits (which ends the container).
func (b *batcher) writeLocked() {
	if b.armed {
		b.t.Stop()
		b.armed = false
	}
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
