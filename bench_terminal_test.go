package sandbox_test

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// rawCat is a program that echoes each key as it reads it, as a REPL in
// raw mode does: the terminal's own echo off, bytes passed through.
var rawCat = []string{"sh", "-c", "stty raw -echo && echo ready && exec cat"}

// BenchmarkTerminalEcho measures keystroke-to-echo latency: a key typed,
// until the screen shows it, through a program that echoes what it reads
// (rawCat). impl=terminal is a sandbox's Terminal; impl=host-terminal the
// same Terminal over a pseudo-terminal of the host (the emulator's share);
// impl=host-pty the host's pseudo-terminal alone, a byte written to its
// master until it is read back (the floor); impl=exec is Exec of `true`,
// a round trip into the sandbox for comparison. ns/op is the latency.
func BenchmarkTerminalEcho(b *testing.B) {
	b.Run("impl=host-pty", func(b *testing.B) {
		c, m, err := sandbox.StartHostPTY(24, 80, nil, rawCat...)
		if err != nil {
			b.Skip(err)
		}
		defer func() { c.Process.Kill(); c.Wait(); m.Close() }()
		buf := make([]byte, 64)
		readUntil(b, m, "ready")
		for b.Loop() {
			if _, err := m.Write([]byte{'k'}); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadAtLeast(m, buf[:1], 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=host-terminal", func(b *testing.B) {
		term, err := sandbox.NewHostTerminal(rawCat...)
		if err != nil {
			b.Skip(err)
		}
		defer term.Close()
		echoLoop(b, term)
	})
	sb := newSandbox(b)
	b.Run("impl=terminal", func(b *testing.B) {
		term, err := sb.Terminal(b.Context(), rawCat...)
		if err != nil {
			b.Fatal(err)
		}
		defer term.Close()
		echoLoop(b, term)
	})
	b.Run("impl=exec", func(b *testing.B) {
		for b.Loop() {
			if r, err := sb.Exec(b.Context(), "true"); err != nil || r.ExitCode != 0 {
				b.Fatal(r, err)
			}
		}
	})
}

// readUntil reads r until what it read holds s.
func readUntil(b *testing.B, r io.Reader, s string) {
	var got []byte
	buf := make([]byte, 256)
	for !strings.Contains(string(got), s) {
		n, err := r.Read(buf)
		if err != nil {
			b.Fatalf("reading until %q: %v (read %q)", s, err, got)
		}
		got = append(got, buf[:n]...)
	}
}

// echoLoop types letters into a rawCat terminal, each until the screen
// ends with it (consecutive letters differ).
func echoLoop(b *testing.B, term *sandbox.Terminal) {
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	if err := term.WaitMatch(ctx, regexp.MustCompile(`ready`)); err != nil {
		b.Fatal(err, term.Screen())
	}
	var ends [26]*regexp.Regexp
	for i := range ends {
		ends[i] = regexp.MustCompile(string(rune('a'+i)) + `\z`)
	}
	i := 0
	for b.Loop() {
		if err := term.Type(string(rune('a' + i))); err != nil {
			b.Fatal(err)
		}
		if err := term.WaitMatch(ctx, ends[i]); err != nil {
			b.Fatalf("%v; the screen:\n%s", err, term.Screen())
		}
		i = (i + 1) % len(ends)
	}
}

// BenchmarkTerminalOutput measures output throughput out of a sandbox: 64
// MiB of 80-byte lines of text from one command, to io.Discard through a
// plain pipe (impl=pipe), through a pseudo-terminal (impl=pty, Cmd.TTY),
// and through a Terminal, whose emulator draws it (impl=terminal). MB/s
// is the throughput.
func BenchmarkTerminalOutput(b *testing.B) {
	const size = 64 << 20
	script := fmt.Sprintf("yes %s | head -c %d", strings.Repeat("y", 79), size)
	sb := newSandbox(b)
	for _, impl := range []string{"pipe", "pty"} {
		b.Run("impl="+impl, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				c := sb.Command(b.Context(), "sh", "-c", script)
				var n countingWriter
				c.Stdout = &n
				if impl == "pty" {
					c.TTY = &sandbox.TTY{}
				}
				if err := c.Run(); err != nil {
					b.Fatal(err)
				}
				// A terminal turns each "\n" into "\r\n".
				if want := int64(size); n.n() != want && n.n() != want+want/80 {
					b.Fatalf("%d bytes of output, want %d", n.n(), want)
				}
			}
		})
	}
	b.Run("impl=terminal", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			term, err := sb.Terminal(b.Context(), "sh", "-c", script+"; echo; echo output-end")
			if err != nil {
				b.Fatal(err)
			}
			<-term.Done()
			if err := term.Err(); err != nil || !strings.HasSuffix(term.Screen(), "\noutput-end") {
				b.Fatalf("%v; the screen:\n%s", err, term.Screen())
			}
			term.Close()
		}
	})
}

// BenchmarkTerminalScreen measures Screen on a full 60 × 200 screen.
func BenchmarkTerminalScreen(b *testing.B) {
	term, err := sandbox.NewHostTerminal("sh", "-c", `stty -echo; read x; i=0; while [ $i -lt 60 ]; do printf '%0200d' $i; i=$((i+1)); done; exec cat`)
	if err != nil {
		b.Skip(err)
	}
	defer term.Close()
	if err := term.Resize(60, 200); err != nil {
		b.Fatal(err)
	}
	if err := term.Type("\r"); err != nil { // draw
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), time.Minute)
	defer cancel()
	if err := term.WaitMatch(ctx, regexp.MustCompile(`(?m)^0{198}59$`)); err != nil {
		b.Fatal(err, term.Screen())
	}
	b.ReportAllocs()
	for b.Loop() {
		if len(term.Screen()) != 60*201-1 {
			b.Fatal("not a full screen")
		}
	}
}
