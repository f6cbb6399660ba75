package term

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/charmbracelet/x/vt"
)

// MaxInput bounds the bytes that wait in Input for the program to read.
const MaxInput = 1 << 20

// ErrInputFull is returned by Type and Press when the bytes they would add
// do not fit in the MaxInput bytes of Input not yet read: the program (or
// whatever copies Input to it) is not reading its input.
var ErrInputFull = errors.New("term: input not read: the program is not reading what was typed")

// input is the queue of bytes for the program's input: typed text, keys
// and the emulator's replies, in the order they came.
type input struct {
	mu      sync.Mutex
	cond    *sync.Cond
	buf     bytes.Buffer
	closed  bool
	dropped int64 // bytes of replies dropped for want of room
	mute    bool  // replies are dropped, not counted (WriteReplayed)
}

func (in *input) init() { in.cond = sync.NewCond(&in.mu) }

// add queues p whole, or nothing and an error.
func (in *input) add(p []byte) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return ErrClosed
	}
	if in.buf.Len()+len(p) > MaxInput {
		return fmt.Errorf("%w (%d bytes wait; %d more would pass the bound of %d)",
			ErrInputFull, in.buf.Len(), len(p), MaxInput)
	}
	in.buf.Write(p)
	in.cond.Broadcast()
	return nil
}

// reply queues what fits of p and counts the rest as dropped: the emulator
// must never wait for the program to read.
func (in *input) reply(p []byte) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed || in.mute {
		return
	}
	n := min(len(p), MaxInput-in.buf.Len())
	in.buf.Write(p[:n])
	in.dropped += int64(len(p) - n)
	if n > 0 {
		in.cond.Broadcast()
	}
}

func (in *input) Read(p []byte) (int, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for in.buf.Len() == 0 && !in.closed {
		in.cond.Wait()
	}
	if in.closed {
		return 0, io.EOF
	}
	return in.buf.Read(p)
}

func (in *input) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.closed = true
	in.buf = bytes.Buffer{}
	in.cond.Broadcast()
}

// collectReplies moves what the emulator writes back to the program
// (replies to queries such as a cursor position report) into the input
// queue. The emulator writes them to an io.Pipe inside Write, so this
// reader must keep reading: it never waits for room.
func (s *Screen) collectReplies(em *vt.Emulator) {
	buf := make([]byte, 4096)
	for {
		n, err := em.Read(buf)
		if n > 0 {
			s.in.reply(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// Input returns the reader of the bytes for the program's input: what Type
// and Press add and the emulator's replies to the program's queries (some
// programs, vim among them, wait for these), in order. Copy it to the
// program's input as long as the program runs. Read blocks until there are
// bytes and returns io.EOF after Close. Replies that find MaxInput bytes
// unread are dropped and counted (InputDropped).
func (s *Screen) Input() io.Reader { return &s.in }

// InputDropped returns how many bytes of the emulator's replies were
// dropped because Input was not read.
func (s *Screen) InputDropped() int64 {
	s.in.mu.Lock()
	defer s.in.mu.Unlock()
	return s.in.dropped
}

// Type adds text to the program's input as is: "\r" is the Enter key,
// "\n" a line feed (C-j), and any byte is sent unchanged. It returns an
// error wrapping ErrInputFull, having added nothing, when text does not fit
// (see MaxInput), and ErrClosed after Close.
func (s *Screen) Type(text string) error {
	return s.in.add([]byte(text))
}

// Press adds the bytes of the named keys to the program's input, in order
// (see KeyNames for the names). Cursor keys follow the program's cursor key
// mode (DECCKM) as it is when Press is called. An unknown name is an error
// wrapping ErrUnknownKey and nothing is added; so it is when the keys do
// not fit (ErrInputFull).
func (s *Screen) Press(keys ...string) error {
	s.mu.Lock()
	app := s.appCursor
	s.mu.Unlock()
	var b []byte
	for _, k := range keys {
		seq, err := keyBytes(k, app)
		if err != nil {
			return err
		}
		b = append(b, seq...)
	}
	return s.in.add(b)
}
