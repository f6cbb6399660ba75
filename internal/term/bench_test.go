package term

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkText reads a full 200 × 60 screen.
func BenchmarkText(b *testing.B) {
	s := newScreen(b, 60, 200)
	var out strings.Builder
	for y := range 60 {
		fmt.Fprintf(&out, "\x1b[%dH", y+1)
		for x := range 200 {
			out.WriteByte('!' + byte((x+y)%90))
		}
	}
	write(b, s, out.String())
	if n := len(s.Text()); n != 60*201-1 {
		b.Fatalf("Text is %d bytes, want a full screen", n)
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	n := 0
	for b.Loop() {
		s.Text()
		n++
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/op")
}

// plainLines is n bytes of lines of text as a program prints them through
// a PTY (CRLF), of varied lengths up to 100 columns.
func plainLines(n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{1}))
	var b []byte
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "%6d ", i)
		for range r.IntN(93) {
			b = append(b, byte('a'+r.IntN(26)))
		}
		b = append(b, '\r', '\n')
	}
	return b[:n]
}

// vimLike is n bytes of what a full-screen editor sends: cursor
// addressing, colors, text, erases.
func vimLike(n int, rows, cols int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{2}))
	var b []byte
	for len(b) < n {
		y := r.IntN(rows) + 1
		b = fmt.Appendf(b, "\x1b[%d;1H", y)
		for x := 0; x < cols-12; {
			w := 1 + r.IntN(10)
			b = fmt.Appendf(b, "\x1b[38;5;%dm", r.IntN(256))
			if r.IntN(4) == 0 {
				b = append(b, "\x1b[1m"...)
			}
			for range w {
				b = append(b, byte('a'+r.IntN(26)))
			}
			b = append(b, "\x1b[m "...)
			x += w + 1
		}
		b = append(b, "\x1b[K"...)
		if r.IntN(8) == 0 {
			b = fmt.Appendf(b, "\x1b[%d;%dr\x1b[%dH\x1bM\x1b[r", 1, rows-1, 1)
		}
	}
	return b[:n]
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewChaCha8([32]byte{3}))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// benchWrite reports MB/s and, as the machine may be busy with other
// work, MB per second of this process's CPU time (MB/cpu-s).
func benchWrite(b *testing.B, rows, cols int, out []byte) {
	s := newScreen(b, rows, cols)
	b.SetBytes(int64(len(out)))
	cpu0 := cpuTime()
	n := 0
	for b.Loop() {
		for i := 0; i < len(out); i += 32 << 10 {
			s.Write(out[i:min(i+32<<10, len(out))])
		}
		n++
	}
	b.ReportMetric(float64(n*len(out))/1e6/(cpuTime()-cpu0).Seconds(), "MB/cpu-s")
}

// cpuTime returns the user and system CPU time of this process.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWrite measures Write's throughput (MB/s) on 24 × 80 and
// 60 × 200 screens, output given in 32 KiB writes.
func BenchmarkWrite(b *testing.B) {
	for _, size := range [][2]int{{24, 80}, {60, 200}} {
		rows, cols := size[0], size[1]
		b.Run(fmt.Sprintf("plain/%dx%d", rows, cols), func(b *testing.B) {
			benchWrite(b, rows, cols, plainLines(4<<20))
		})
		b.Run(fmt.Sprintf("vimlike/%dx%d", rows, cols), func(b *testing.B) {
			benchWrite(b, rows, cols, vimLike(4<<20, rows, cols))
		})
		b.Run(fmt.Sprintf("random/%dx%d", rows, cols), func(b *testing.B) {
			benchWrite(b, rows, cols, randomBytes(4<<20))
		})
	}
}
