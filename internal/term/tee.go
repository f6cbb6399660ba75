package term

import (
	"io"
	"sync"
)

// MaxTee bounds the output bytes that wait for a Tee writer.
const MaxTee = 1 << 20

// Tee has the raw output fed by Write from now on copied to w, by a
// goroutine of its own, so a slow w never holds Write up: the bytes wait in
// a buffer of MaxTee bytes, and what finds it full is dropped and counted
// (TeeDropped). w gets the output until the next call of Tee or Close; what
// waits for it then is still written to it, and the goroutine ends. A write
// error of w ends the copy to w (its bytes are counted as dropped).
// Tee(nil) stops copying. A w that never returns keeps its goroutine.
func (s *Screen) Tee(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		w = nil
	}
	s.tee.set(w)
}

// TeeDropped returns how many bytes of output were not copied to a Tee
// writer because its buffer was full or it failed.
func (s *Screen) TeeDropped() int64 {
	s.tee.mu.Lock()
	defer s.tee.mu.Unlock()
	return s.tee.dropped
}

type tee struct {
	mu      sync.Mutex
	cur     *sink
	dropped int64
}

// sink is the buffer of one Tee writer: a ring of MaxTee bytes.
type sink struct {
	t      *tee
	w      io.Writer
	cond   *sync.Cond    // on t.mu
	done   chan struct{} // closed when run returns
	ring   []byte
	start  int
	n      int
	ended  bool // no more bytes will come
	failed bool // w returned an error
}

func (t *tee) set(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur != nil {
		t.cur.ended = true
		t.cur.cond.Signal()
		t.cur = nil
	}
	if w == nil {
		return
	}
	k := &sink{t: t, w: w, cond: sync.NewCond(&t.mu), ring: make([]byte, MaxTee), done: make(chan struct{})}
	t.cur = k
	go k.run()
}

// write queues what fits of p for the current writer, without waiting.
func (t *tee) write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := t.cur
	if k == nil || len(p) == 0 {
		return
	}
	if k.failed {
		t.dropped += int64(len(p))
		return
	}
	n := min(len(p), len(k.ring)-k.n)
	t.dropped += int64(len(p) - n)
	end := (k.start + k.n) % len(k.ring)
	c := copy(k.ring[end:], p[:n])
	copy(k.ring, p[c:n])
	k.n += n
	if n > 0 {
		k.cond.Signal()
	}
}

func (k *sink) run() {
	defer close(k.done)
	t := k.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		for k.n == 0 && !k.ended {
			k.cond.Wait()
		}
		if k.n == 0 {
			return
		}
		// The bytes from start to the end of the ring or of the data: Write
		// does not touch them while they count in n.
		seg := k.ring[k.start:min(k.start+k.n, len(k.ring))]
		t.mu.Unlock()
		_, err := k.w.Write(seg)
		t.mu.Lock()
		k.start = (k.start + len(seg)) % len(k.ring)
		k.n -= len(seg)
		if err != nil {
			t.dropped += int64(k.n)
			k.n = 0
			k.failed = true
			return
		}
	}
}
