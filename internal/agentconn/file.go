package agentconn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// FileOp is a file operation in progress (see wire.FileOp): its input is
// written with Write and ended with CloseInput, its output read with Read,
// and its outcome returned by Result. Every wait is bounded by the context
// given to File and by the Conn's timeout, counted from the last sign of
// progress.
type FileOp struct {
	c   *Conn
	ctx context.Context
	id  uint32
	ch  *channel

	outEnded bool // Read saw the end of the output
}

// File sends a file operation's request. Operations with input (wire.Write,
// wire.Untar) then take it through Write and CloseInput.
func (c *Conn) File(ctx context.Context, req wire.FileRequest) (*FileOp, error) {
	ch := &channel{end: make(chan struct{})}
	c.mu.Lock()
	c.next++
	id := c.next
	ack := func(n int) { c.w.WriteCount(wire.Ack, id, uint32(n)) }
	ch.out = [2]*stream{newStream(ack, wire.Window), nil}
	if req.Op == wire.Write || req.Op == wire.Untar {
		ch.stdin = newCredit(wire.Window)
	}
	c.chans[id] = ch
	c.mu.Unlock()
	op := &FileOp{c: c, ctx: ctx, id: id, ch: ch}
	if err := c.w.WriteJSON(wire.File, id, req); err != nil {
		op.Close()
		return nil, c.writeErr(err)
	}
	return op, nil
}

// Write sends input. It returns an error once the operation has ended (its
// result then says why), the context ended, or the agent took nothing for
// the Conn's timeout.
func (o *FileOp) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		if o.Ended() {
			return done, errEnded
		}
		if err := o.ctx.Err(); err != nil {
			return done, err
		}
		n, err := o.ch.stdin.takeWithin(o.ctx, min(len(b)-done, wire.MaxData), o.c.timeout, o.ch.end)
		if err != nil {
			return done, o.c.wrapWait(err, "input taken")
		}
		if err := o.c.w.Write(wire.Stdin, o.id, b[done:done+n]); err != nil {
			return done, o.c.writeErr(err)
		}
		done += n
	}
	return done, nil
}

// errEnded is returned by Write when the operation has ended early.
var errEnded = errors.New("agentconn: file operation ended")

// Ended reports whether the operation's result has come.
func (o *FileOp) Ended() bool {
	select {
	case <-o.ch.end:
		return true
	default:
		return false
	}
}

// CloseInput ends the input.
func (o *FileOp) CloseInput() error {
	if err := o.c.w.Write(wire.CloseStdin, o.id, nil); err != nil {
		return o.c.writeErr(err)
	}
	return nil
}

// Read reads output; io.EOF at its end.
func (o *FileOp) Read(p []byte) (int, error) {
	n, err := o.ch.out[0].readWithin(o.ctx, p, o.c.timeout, o.c.done)
	if err == io.EOF {
		o.outEnded = true
	} else if err != nil {
		err = o.c.wrapWait(err, "output")
	}
	return n, err
}

// Finishing reports whether the operation has ended or is about to: its
// result has come, or its output has ended (the result follows at once).
func (o *FileOp) Finishing() bool { return o.outEnded || o.Ended() }

// ReadAll reads the output to its end. More than limit bytes (0: no
// limit) is ErrTooMuch.
func (o *FileOp) ReadAll(limit int64) ([]byte, error) {
	first := make([]byte, 32<<10)
	n, err := io.ReadFull(o, first)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return first[:n], nil
	case err != nil:
		return nil, err
	}
	// A Read's announced size came before its data: room for all of it.
	// The size is the agent's word: it is believed up to limit and
	// maxSizeHint, beyond which the buffer grows with what comes.
	size := min(max(o.ch.size.Load(), int64(n)), maxSizeHint)
	if limit > 0 {
		size = min(size, limit)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+1))
	buf.Write(first)
	var r io.Reader = o
	if limit > 0 {
		r = io.LimitReader(o, limit+1-int64(n))
	}
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, err
	}
	if limit > 0 && int64(buf.Len()) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrTooMuch, limit)
	}
	return buf.Bytes(), nil
}

// maxSizeHint is the most ReadAll allocates ahead of the data on the
// strength of the size a Read announced (Limits.FileSize by default). A
// variable for FuzzConn, which cannot afford such allocations.
var maxSizeHint int64 = 256 << 20

// ErrTooMuch is returned by ReadAll for output over its limit.
var ErrTooMuch = errors.New("agentconn: output over the limit")

// Result waits for the operation's outcome.
func (o *FileOp) Result() (wire.FileResult, error) {
	if _, err := await(o.c, o.ctx, o.ch.end, "file operation"); err != nil {
		return wire.FileResult{}, err
	}
	f := o.ch.endFrame
	if f.Kind == wire.Failed {
		return wire.FileResult{}, errors.New(string(f.Data))
	}
	var res wire.FileResult
	if err := json.Unmarshal(f.Data, &res); err != nil {
		return wire.FileResult{}, fmt.Errorf("agentconn: bad file result %q", f.Data)
	}
	return res, nil
}

// Close forgets the operation; one that has not ended is aborted.
func (o *FileOp) Close() {
	if !o.Ended() {
		o.c.w.Write(wire.Kill, o.id, nil)
	}
	o.c.release(o.id)
	o.ch.out[0].end(io.ErrClosedPipe)
	if o.ch.stdin != nil {
		o.ch.stdin.end()
	}
}

// errIdle is a wait that saw no progress for the Conn's timeout.
var errIdle = errors.New("no progress")

// wrapWait turns the reason a wait ended into the Conn's errors.
func (c *Conn) wrapWait(err error, what string) error {
	switch {
	case errors.Is(err, errIdle):
		return fmt.Errorf("%w: %s: none within %v", ErrNoAnswer, what, c.timeout)
	case errors.Is(err, errGoneWait):
		return c.doneErr
	}
	return err
}

// errGoneWait is a wait ended by the end of the stream.
var errGoneWait = errors.New("stream ended")

// readWithin is Read bounded by ctx, by idle (no data for that long) and
// by done.
func (s *stream) readWithin(ctx context.Context, p []byte, idle time.Duration, done <-chan struct{}) (int, error) {
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		if n, ok, err := s.tryRead(p); ok {
			return n, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
			return 0, errIdle
		case <-done:
			if n, ok, err := s.tryRead(p); ok {
				return n, err
			}
			return 0, errGoneWait
		}
	}
}

// takeWithin is take bounded by ctx, by idle (no credit for that long) and
// by end being closed.
func (c *credit) takeWithin(ctx context.Context, max int, idle time.Duration, end <-chan struct{}) (int, error) {
	t := time.NewTimer(idle)
	defer t.Stop()
	for {
		if n, ok, done := c.tryTake(max); done {
			if !ok {
				return 0, errGoneWait
			}
			return n, nil
		}
		select {
		case <-c.wake:
		case <-end:
			return 0, errEnded
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
			return 0, errIdle
		}
	}
}
