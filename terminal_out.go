package sandbox

import (
	"sync"

	"github.com/agentsandbox/sandbox/internal/term"
)

// maxOutQueue bounds the program's output that waits for the emulator.
const maxOutQueue = 256 << 10

// outQueue passes a terminal's output to its screen through a goroutine of
// its own, so that the emulator draws one batch while the next arrives:
// the output is read as fast as the slower of the two, not at the sum of
// their costs. Write waits while maxOutQueue bytes wait (the program is
// held back, as by a slow terminal); the host keeps at most twice that.
type outQueue struct {
	scr  *term.Screen
	mu   sync.Mutex
	cond *sync.Cond
	buf  []byte // waiting for the screen
	end  bool   // no more writes
	done chan struct{}

	replay int64 // the first bytes written that are replayed output (see setReplay)
}

func newOutQueue(scr *term.Screen) *outQueue {
	q := &outQueue{scr: scr, done: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	return q
}

// setReplay says that the first n bytes to be written are the program's
// earlier output, replayed (an attach): they draw the screen, and the
// emulator's replies to them are dropped (Screen.WriteReplayed). Call it
// before the first Write.
func (q *outQueue) setReplay(n int64) {
	q.mu.Lock()
	q.replay = n
	q.mu.Unlock()
}

// Write queues p for the screen, waiting for room.
func (q *outQueue) Write(p []byte) (int, error) {
	n := len(p)
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(p) > 0 {
		for len(q.buf) >= maxOutQueue && !q.end {
			q.cond.Wait()
		}
		if q.end {
			return n - len(p), term.ErrClosed
		}
		k := min(len(p), maxOutQueue-len(q.buf))
		q.buf = append(q.buf, p[:k]...)
		p = p[k:]
		q.cond.Broadcast()
	}
	return n, nil
}

// run writes what is queued to the screen, a batch at a time.
func (q *outQueue) run() {
	defer close(q.done)
	var batch []byte
	for {
		q.mu.Lock()
		for len(q.buf) == 0 && !q.end {
			q.cond.Wait()
		}
		if len(q.buf) == 0 {
			q.mu.Unlock()
			return
		}
		batch, q.buf = q.buf, batch[:0]
		quiet := int(min(q.replay, int64(len(batch))))
		q.replay -= int64(quiet)
		q.cond.Broadcast()
		q.mu.Unlock()
		if quiet > 0 {
			q.scr.WriteReplayed(batch[:quiet])
		}
		if quiet < len(batch) {
			q.scr.Write(batch[quiet:])
		}
	}
}

// finish returns once everything written is on the screen; later writes
// fail.
func (q *outQueue) finish() {
	q.mu.Lock()
	q.end = true
	q.cond.Broadcast()
	q.mu.Unlock()
	<-q.done
}
