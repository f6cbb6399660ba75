package agentconn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// discardStream is the library's end of the connection for FuzzConn: what
// the library sends to the agent goes nowhere.
type discardStream struct{}

func (discardStream) Write(p []byte) (int, error)      { return len(p), nil }
func (discardStream) SetWriteDeadline(time.Time) error { return nil }
func (discardStream) CloseWrite() error                { return nil }

// fuzzFrames decodes a fuzz input into frames from the agent: each is a
// kind byte (with the high bit, the payload is repeated up to MaxData
// bytes, for output that fills buffers), a channel byte (taken modulo 8:
// the channels FuzzConn opens and a few it does not), a length byte and
// that many bytes of payload. What is left after the last whole frame
// follows as raw bytes: a cut frame.
func fuzzFrames(b []byte) (frames []wire.Frame, tail []byte) {
	for len(b) >= 3 {
		kind, ch, n := b[0], b[1], int(b[2])
		b = b[3:]
		data := b[:min(n, len(b))]
		b = b[len(data):]
		if kind&0x80 != 0 && len(data) > 0 {
			data = bytes.Repeat(data, wire.MaxData/len(data))
		}
		frames = append(frames, wire.Frame{Kind: wire.Kind(kind &^ 0x80), Channel: uint32(ch % 8), Data: data})
	}
	return frames, b
}

// fuzzInput encodes frames as fuzzFrames decodes them, for seeds.
func fuzzInput(frames ...wire.Frame) []byte {
	var b []byte
	for _, f := range frames {
		if len(f.Data) > 255 {
			panic("fuzzInput: payload over 255 bytes")
		}
		b = append(b, byte(f.Kind), byte(f.Channel), byte(len(f.Data)))
		b = append(b, f.Data...)
	}
	return b
}

func jsonFrame(kind wire.Kind, ch uint32, v any) wire.Frame {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return wire.Frame{Kind: kind, Channel: ch, Data: b}
}

// The channels FuzzConn opens, in order.
const (
	chRead    = 1 + iota // File Read, output taken with ReadAll without limit
	chWrite              // File Write, with input
	chReadDir            // File ReadDir, output taken with ReadAll(1000)
	chExec               // Exec with stdin
	chPing               // Ping
	chOOM                // OOMKills
)

// fuzzTimeout is the Conn's timeout in FuzzConn: every wait must end with
// the stream, long before it.
const fuzzTimeout = 5 * time.Second

// FuzzConn plays an agent that sends arbitrary frames, on the channels of
// requests in flight and on others, to a Conn that has a file Read, a file
// Write, a ReadDir, a command with stdin, a Ping and an OOM count going,
// and then ends the stream. Whatever the agent sends, the library must not
// panic, every call must return once the stream has ended (not after the
// Conn's timeout), what output the library holds is what the agent sent,
// and no goroutine is left once everything is closed.
func FuzzConn(f *testing.F) {
	defer func(n int64) { maxSizeHint = n }(maxSizeHint)
	maxSizeHint = 1 << 20
	f.Add([]byte{})
	f.Add(fuzzInput(
		jsonFrame(wire.Hello, 0, wire.Greeting{Version: "2", PID: 1}),
		jsonFrame(wire.Started, chRead, wire.Start{Size: 5}),
		wire.Frame{Kind: wire.Stdout, Channel: chRead, Data: []byte("hello")},
		wire.Frame{Kind: wire.Stdout, Channel: chRead},
		jsonFrame(wire.Done, chRead, wire.FileResult{Bytes: 5}),
		wire.Frame{Kind: wire.Ack, Channel: chWrite, Data: []byte{0, 1, 0, 0}},
		jsonFrame(wire.Done, chWrite, wire.FileResult{Bytes: 100}),
		wire.Frame{Kind: wire.Stdout, Channel: chReadDir, Data: wire.AppendDirRecord(nil, []byte("a"), wire.FileInfo{Mode: 0o644})},
		wire.Frame{Kind: wire.Stdout, Channel: chReadDir},
		jsonFrame(wire.Done, chReadDir, wire.FileResult{Err: &wire.FileError{Errno: 2, Path: []byte("/x"), Text: "gone"}}),
		jsonFrame(wire.Started, chExec, wire.Start{PID: 42}),
		wire.Frame{Kind: wire.Stdout, Channel: chExec, Data: []byte("out")},
		wire.Frame{Kind: wire.Stderr, Channel: chExec, Data: []byte("err")},
		wire.Frame{Kind: wire.Ack, Channel: chExec, Data: []byte{0, 0, 0, 9}},
		wire.Frame{Kind: wire.Stdout, Channel: chExec},
		wire.Frame{Kind: wire.Stderr, Channel: chExec},
		jsonFrame(wire.Exited, chExec, wire.Exit{Code: 137, Signal: 9, Killed: true}),
		jsonFrame(wire.Killed, chExec, wire.KillResult{Processes: 2, Rounds: 1}),
		wire.Frame{Kind: wire.Pong, Channel: chPing},
		jsonFrame(wire.OOMCount, chOOM, 3),
	))
	f.Add(fuzzInput(
		wire.Frame{Kind: wire.Failed, Channel: chRead, Data: []byte("no such file")},
		wire.Frame{Kind: wire.Failed, Channel: chExec, Data: []byte("bad user")},
		wire.Frame{Kind: wire.OOMCount, Channel: chOOM, Data: []byte("not json")},
		wire.Frame{Kind: wire.Stdout, Channel: chPing, Data: []byte("output on a ping")},
		wire.Frame{Kind: wire.Ack, Channel: chRead, Data: []byte{0xff, 0xff, 0xff, 0xff}},
		wire.Frame{Kind: wire.Ack, Channel: chWrite, Data: []byte{1, 2, 3}},
		wire.Frame{Kind: wire.Exited, Channel: 7, Data: []byte("{}")},
		wire.Frame{Kind: wire.Done, Channel: chWrite, Data: []byte("{")},
	))
	// A Read whose agent announces a size of 2^63-1 bytes, then sends more
	// than ReadAll's first buffer.
	big := fuzzInput(jsonFrame(wire.Started, chRead, wire.Start{Size: 1<<63 - 1}))
	f.Add(append(big, byte(wire.Stdout|0x80), chRead, 1, 'x'))
	// Answers of the wrong kind where a command's are expected.
	f.Add(fuzzInput(jsonFrame(wire.Exited, chRead, wire.Exit{}), jsonFrame(wire.Killed, chRead, wire.KillResult{}),
		jsonFrame(wire.Exited, chPing, wire.Exit{}), wire.Frame{Kind: wire.Started, Channel: chPing}))
	f.Add(append(fuzzInput(wire.Frame{Kind: wire.Stdout, Channel: chExec, Data: []byte("cut")}), byte(wire.Exited), chExec))

	f.Fuzz(func(t *testing.T, input []byte) {
		frames, tail := fuzzFrames(input)
		// What the library should hold of each output, as sent.
		var sent [8][2]bytes.Buffer
		var ended [8][2]bool
		for _, fr := range frames {
			if fr.Kind != wire.Stdout && fr.Kind != wire.Stderr {
				continue
			}
			i := fr.Kind - wire.Stdout
			if len(fr.Data) == 0 {
				ended[fr.Channel][i] = true
			} else if !ended[fr.Channel][i] {
				sent[fr.Channel][i].Write(fr.Data)
			}
		}

		before := goleak.IgnoreCurrent()
		start := time.Now()
		pr, pw := io.Pipe()
		c := Start(discardStream{}, pr, fuzzTimeout)
		ctx := context.Background()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []string
		check := func(format string, args ...any) {
			mu.Lock()
			errs = append(errs, fmt.Sprintf(format, args...))
			mu.Unlock()
		}

		// opened waits until the Conn has given out channel id.
		opened := func(id uint32) {
			for {
				c.mu.Lock()
				n := c.next
				c.mu.Unlock()
				if n >= id {
					return
				}
				runtime.Gosched()
			}
		}
		fileOp := func(id uint32, op wire.FileOp, limit int64, body func(*FileOp)) {
			o, err := c.File(ctx, wire.FileRequest{Op: op, Path: []byte("/w/f")})
			if err != nil {
				t.Fatalf("%s: %v", op, err)
			}
			if o.id != id {
				t.Fatalf("%s on channel %d, want %d", op, o.id, id)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer o.Close()
				if body != nil {
					body(o)
				}
				o.Result()
			}()
		}
		fileOp(chRead, wire.Read, 0, func(o *FileOp) {
			out, err := o.ReadAll(0)
			if err == nil && !bytes.Equal(out, sent[chRead][0].Bytes()) {
				check("Read: %d bytes out, %d sent", len(out), sent[chRead][0].Len())
			}
		})
		fileOp(chWrite, wire.Write, 0, func(o *FileOp) {
			o.Write(make([]byte, 2*wire.MaxData))
			o.CloseInput()
		})
		fileOp(chReadDir, wire.ReadDir, 1000, func(o *FileOp) {
			if out, err := o.ReadAll(1000); err == nil && len(out) > 1000 {
				check("ReadDir: %d bytes out, limit 1000", len(out))
			}
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := c.Exec(ctx, wire.ExecRequest{Args: []string{"x"}, Stdin: true})
			if err != nil {
				return
			}
			defer p.Close()
			var rw sync.WaitGroup
			for i, r := range []io.Reader{p.Stdout, p.Stderr} {
				rw.Add(1)
				go func() {
					defer rw.Done()
					out, _ := io.ReadAll(r)
					if !bytes.HasPrefix(sent[chExec][i].Bytes(), out) {
						check("exec output %d: %q is not what was sent, %q", i, out, sent[chExec][i].Bytes())
					}
				}()
			}
			p.Stdin().Write(make([]byte, wire.MaxData+1))
			p.Stdin().Close()
			p.Wait(ctx)
			p.Kill(ctx)
			rw.Wait()
		}()
		opened(chExec)
		wg.Add(1)
		go func() { defer wg.Done(); c.Ping(ctx) }()
		opened(chPing)
		wg.Add(1)
		go func() { defer wg.Done(); c.OOMKills(ctx) }()
		opened(chOOM)
		wg.Add(1)
		go func() { defer wg.Done(); c.Ready(ctx) }()

		w := wire.NewWriter(pw)
		for _, fr := range frames {
			if w.Write(fr.Kind, fr.Channel, fr.Data) != nil {
				break
			}
		}
		pw.Write(tail)
		pw.Close()

		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(2 * fuzzTimeout):
			buf := make([]byte, 1<<20)
			t.Fatalf("calls still waiting %v after the stream ended:\n%s", 2*fuzzTimeout, buf[:runtime.Stack(buf, true)])
		}
		if d := time.Since(start); d >= fuzzTimeout {
			t.Errorf("calls took %v: some waited for the Conn's timeout, not for the stream's end", d)
		}
		c.Close()
		<-c.Done()
		for _, e := range errs {
			t.Error(e)
		}
		if err := goleak.Find(before); err != nil {
			t.Fatal(err)
		}
	})
}
