package term

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	uv "github.com/charmbracelet/ultraviolet"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/vt"
)

// The fields harden reaches are found in the vt this module builds with.
func TestHardened(t *testing.T) {
	s := newScreen(t, 24, 80)
	if s.vt == nil {
		t.Fatal("vt's unexported fields were not found: scrollback, sequence data and line feeds are not bounded")
	}
	for i, scr := range s.vt.scrs {
		if scr.Scrollback() != nil {
			t.Errorf("screen %d keeps a scrollback", i)
		}
	}
	write(t, s, strings.Repeat("line\r\n", 100))
	if n := s.em.ScrollbackLen(); n != 0 {
		t.Errorf("%d lines in the scrollback", n)
	}
	write(t, s, "\x1b]0;"+strings.Repeat("t", 200<<10)+"\x07")
	if n := len(s.vt.parser.Data()); n > maxSequenceData {
		t.Errorf("parser kept %d bytes of an OSC", n)
	}
}

// Should vt panic on some output, the screen starts afresh and the host
// goes on.
func TestEmulatorPanics(t *testing.T) {
	s := newScreen(t, 24, 80)
	write(t, s, "\x1b[?1hbefore")
	s.em.RegisterCsiHandler('y', func(ansi.Params) bool { panic("a bug in vt") })
	write(t, s, "\x1b[y")
	if s.panics != 1 || s.Text() != "" || s.appCursor {
		t.Fatalf("after a panic: %d panics, Text %q, app cursor keys %v; want a new screen", s.panics, s.Text(), s.appCursor)
	}
	write(t, s, "after\x1b[6n")
	b := make([]byte, 6)
	if _, err := io.ReadFull(s.Input(), b); err != nil || string(b) != "\x1b[1;6R" {
		t.Errorf("reply from the new emulator: %q, %v", b, err)
	}
	if got := s.Text(); got != "after" {
		t.Errorf("Text = %q", got)
	}
}

// reference is vt's emulator as it is, to compare a Screen with.
func reference(rows, cols int) (*vt.Emulator, func()) {
	e := vt.NewEmulator(cols, rows)
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, e)
		close(done)
	}()
	return e, func() {
		e.InputPipe().(io.Closer).Close()
		<-done
	}
}

// ops is output that exercises scrolling in all its forms: lines, wraps,
// line feeds in a region, reverse index, the alternate screen, colored
// backgrounds, margins, line feed/new line mode, origin mode.
var ops = []string{
	"plain text ", "more text that is longer than a short line, to wrap at forty ",
	"\r\n", "\n", "\r", "\v", "\f", "\b", "\t", "x", "日本", "e\u0301",
	"\x1b[41m", "\x1b[44;1m", "\x1b[m", "\x1b[7m",
	"\x1b[3;8r", "\x1b[1;3r", "\x1b[r", "\x1b[5;5r",
	"\x1b[H", "\x1b[8;1H", "\x1b[12;40H", "\x1b[99;99H", "\x1b[3A", "\x1b[2B",
	"\x1bM", "\x1bD", "\x1bE", "\x1b[2S", "\x1b[T", "\x1b[L", "\x1b[M",
	"\x1b[?1049h", "\x1b[?1049l", "\x1b[?47h", "\x1b[?47l",
	"\x1b[20h", "\x1b[20l", "\x1b[?6h", "\x1b[?6l", "\x1b[?7l", "\x1b[?7h",
	"\x1b[?69h\x1b[2;5s", "\x1b[?69h\x1b[3s", "\x1b[?69l", "\x1b[s", "\x1b[u", "\x1b7", "\x1b8",
	"\x1b[2J", "\x1b[K", "\x1b[1J", "\x1b[4@", "\x1b[3P", "\x1b[5X", "x\x1b[7b",
	"\x1bc", "\x1b[99Gx", "\x1b[99Gx\x1b[44m", "\x1b[99Gxé",
	"\x1b(0", "\x1b(B", "\x1b)0\x0e", "\x0f", "\x1bN", "\x1b[$",
	plainFlood(40, "line %d of a flood\r\n"),
	plainFlood(40, "%d\tmore words on a line that is long enough to wrap more than once at 40 columns\r\n"),
	plainFlood(40, "x%d\r\n"),
	plainFlood(40, "%d bare line feeds\n"),
	plainFlood(30, "%d back\b\bspaces and\rreturns\r\n"),
	plainFlood(30, "lqk%d\r\n"),
	plainFlood(30, "abc$%d\r\n") + "xyz\x1b[b",
	"\x1b(0" + plainFlood(30, "A%d\r\n") + plainFlood(20, "lqk\r\n") + "\x1b[3b\x1b(B",
	plainFlood(30, "A%d\r\n") + plainFlood(20, "\r\n") + "\x1b[3b",
	"\x1b*0\x8e" + plainFlood(20, "\r\n") + plainFlood(30, "q%d\r\n") + plainFlood(20, "\r\n") + "q\r\n",
	plainFlood(30, "\r\n"),
}

func plainFlood(n int, format string) string {
	var b strings.Builder
	for i := range n {
		if strings.Contains(format, "%") {
			fmt.Fprintf(&b, format, i)
		} else {
			b.WriteString(format)
		}
	}
	return b.String()
}

// randomOutput returns n ops picked with r, in strings of one to ten.
func randomOutput(r *rand.Rand, n int) []string {
	var out []string
	for range n {
		var b strings.Builder
		for range 1 + r.IntN(10) {
			b.WriteString(ops[r.IntN(len(ops))])
		}
		out = append(out, b.String())
	}
	return out
}

// A Screen shows what vt as it is shows for any output but the bounded
// cases: the fast line feed changes nothing but speed.
func TestSameAsVT(t *testing.T) {
	r := rand.New(rand.NewChaCha8([32]byte{4}))
	for round := range vtRounds {
		rows, cols := 8+r.IntN(8), 6+r.IntN(40) // vt panics on margins past the screen
		s := New(rows, cols)
		e, stop := reference(rows, cols)
		var sent strings.Builder
		for _, out := range randomOutput(r, 60) {
			if r.IntN(20) == 0 {
				// A resize to the size it has is nothing (vt's would reset
				// the margins); one to fewer rows than the cursor's differs
				// from vt's (see TestResizeKeepsCursorRow).
				r2, c2 := 8+r.IntN(8), 6+r.IntN(40)
				if y := s.em.CursorPosition().Y; r2 <= y {
					r2 = y + 1
				}
				if r2 != rows || c2 != cols {
					rows, cols = r2, c2
					s.Resize(rows, cols)
					e.Resize(cols, rows)
					fmt.Fprintf(&sent, "<resize %d×%d>", rows, cols)
				}
			}
			sent.WriteString(out)
			s.Write([]byte(out))
			e.Write([]byte(out))
			if got, want := s.em.Render(), e.Render(); got != want {
				t.Fatalf("round %d, %d×%d, after %q:\nscreen\n%s\nvt\n%s", round, rows, cols, sent.String(), got, want)
			}
			if got, want := s.em.CursorPosition(), e.CursorPosition(); got != want {
				t.Fatalf("round %d, %d×%d, after %q: cursor %v, vt %v", round, rows, cols, sent.String(), got, want)
			}
		}
		stop()
		s.Close()
	}
}

// hostile is output meant to hurt: each must leave the screen usable, its
// size as it was and memory bounded.
var hostile = map[string]string{
	"invalid UTF-8":             "a\xff\xfe\xc0\xaf\xed\xa0\x80\xf8\x88\x80\x80\x80\xf4\x90\x80\x80\x80\xbfz",
	"truncated UTF-8 then ESC":  "\xe2\x82\x1b[31mred",
	"all bytes":                 allBytes(),
	"CSI huge count":            hugeCounts(),
	"CSI overflowing count":     "\x1b[99999999999999999999999999999X\x1b[99999999999999999999999999b",
	"CSI many params":           "\x1b[" + strings.Repeat("1;", 100_000) + "m",
	"CSI many subparams":        "\x1b[38:2:" + strings.Repeat("255:", 100_000) + "m",
	"CSI resize":                "\x1b[8;9999;9999t\x1b[4;99999;99999t\x1b[?3h",
	"CSI huge margins":          "\x1b[2000000000;1r\x1b[1;2000000000r\x1b[?69h\x1b[1;2000000000s",
	"REP huge":                  "x\x1b[2147483646b",
	"tab huge":                  "\x1b[2147483646I\x1b[2147483646Z",
	"OSC megabytes":             "\x1b]0;" + strings.Repeat("t", 8<<20) + "\x07",
	"OSC of separators":         "\x1b]0;" + strings.Repeat(";", 8<<20) + "\x1b\\",
	"OSC unterminated":          "\x1b]2;" + strings.Repeat("u", 8<<20),
	"OSC color queries":         strings.Repeat("\x1b]10;?\x07\x1b]11;?\x1b\\", 10_000),
	"DCS megabytes":             "\x1bP1$r" + strings.Repeat("d", 8<<20) + "\x1b\\",
	"APC PM SOS":                "\x1b_G" + strings.Repeat("a", 1<<20) + "\x1b\\\x1b^" + strings.Repeat("p", 1<<20) + "\x1b\\\x1bX" + strings.Repeat("s", 1<<20) + "\x1b\\",
	"nested ESC":                strings.Repeat("\x1b[\x1b]\x1bP", 100_000),
	"nested unterminated":       strings.Repeat("\x1b]8;;", 100_000) + strings.Repeat("\x1bP", 100_000),
	"hyperlink per cell":        hyperlinks(),
	"combining marks":           "a" + strings.Repeat("\u0301", 1<<20),
	"combining marks per cell":  strings.Repeat("a"+strings.Repeat("\u0301", 300), 2000),
	"zero width joiners":        strings.Repeat("👩\u200d", 100_000),
	"cursor reports":            strings.Repeat("\x1b[6n", 200_000),
	"alt screen toggles":        strings.Repeat("\x1b[?1049hx\r\n\x1b[?1049l", 10_000),
	"in-band resize mode":       "\x1b[?2048h",
	"reset midway":              "\x1b[?1049h\x1b[5;10r\x1b[?1h\x1bc",
	"scroll in a region":        "\x1b[2;3r\x1b[3H" + strings.Repeat("y\n", 100_000),
	"insert delete huge":        "\x1b[2000000000@\x1b[2000000000P\x1b[2000000000L\x1b[2000000000M\x1b[2000000000S\x1b[2000000000T",
	"cursor moves huge":         "\x1b[2000000000A\x1b[2000000000B\x1b[2000000000C\x1b[2000000000D\x1b[2000000000E\x1b[2000000000F\x1b[2000000000G\x1b[2000000000d\x1b[2000000000e\x1b[2000000000a\x1b[2000000000`",
	"erase huge":                "\x1b[2000000000X\x1b[2000000000K\x1b[2000000000J",
	"SGR junk":                  "\x1b[38;5;99999999m\x1b[48;2;999;999;999m\x1b[58:5:2147483647m",
	"charsets":                  "\x1b(0\x1b)0\x0e\x1bn\x1bo\x1b~\x1b}\x1b|\x8e\x8fabc\x0f\x1b(B",
	"mouse and focus modes":     "\x1b[?1000h\x1b[?1003h\x1b[?1006h\x1b[?1004h\x1b[?2004h",
	"requests of modes":         "\x1b[?2147483647$p\x1b[2147483647$p",
	"kitty keyboard and others": "\x1b[>1u\x1b[?u\x1b[>4;2m\x1b[=5u\x1b[22;0;0t\x1b[23;0;0t",
}

func allBytes() string {
	b := make([]byte, 0, 256*3)
	for i := range 256 {
		b = append(b, byte(i), 'x', byte(255-i))
	}
	return string(b)
}

func hugeCounts() string {
	var b strings.Builder
	for c := byte('@'); c <= '~'; c++ {
		if c == 'c' || c == 'n' {
			continue // replies; see "cursor reports"
		}
		fmt.Fprintf(&b, "x\x1b[2147483646%c", c)
	}
	return b.String()
}

func hyperlinks() string {
	var b strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&b, "\x1b]8;id=%d;https://example.invalid/%s\x1b\\x", i, strings.Repeat("p", 30<<10))
	}
	return b.String()
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func TestHostile(t *testing.T) {
	for name, out := range hostile {
		t.Run(name, func(t *testing.T) {
			s := newScreen(t, 24, 80)
			go io.Copy(io.Discard, s.Input())
			before := heapInUse()
			// Whole, then in pieces of a few bytes.
			write(t, s, out)
			for i := 0; i < len(out) && i < piecewise; i += 7 {
				write(t, s, out[i:min(i+7, len(out))])
			}
			if s.panics != 0 {
				t.Errorf("vt panicked %d times", s.panics)
			}
			if r, c := s.Size(); r != 24 || c != 80 {
				t.Errorf("size %d×%d, want 24×80", r, c)
			}
			if rows := strings.Count(s.Text(), "\n") + 1; rows > 24 {
				t.Errorf("Text has %d rows", rows)
			}
			// The screen still works.
			write(t, s, "\x18\x1b\\\x1bc\x1b[?1049l\x1b[2J\x1b[Hok")
			if got := s.Text(); got != "ok" {
				t.Errorf("after a reset, Text = %q, want ok", got)
			}
			runtime.KeepAlive(out)
			if grew := int64(heapInUse()) - int64(before); grew > 8<<20 {
				t.Errorf("heap grew by %d MiB", grew>>20)
			}
		})
	}
}

// FuzzWrite feeds any output: no panic, the size stays, Text fits it.
func FuzzWrite(f *testing.F) {
	for _, out := range hostile {
		if len(out) < 4096 {
			f.Add([]byte(out))
		}
	}
	for _, out := range ops {
		f.Add([]byte(out))
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "*.pty"))
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		s := New(5, 12)
		defer s.Close()
		go io.Copy(io.Discard, s.Input())
		for len(out) > 0 {
			n := min(len(out), 1+int(out[0])%64)
			s.Write(out[:n])
			out = out[n:]
		}
		if s.panics != 0 {
			t.Fatalf("vt panicked")
		}
		if r, c := s.Size(); r != 5 || c != 12 {
			t.Fatalf("size %d×%d", r, c)
		}
		text := s.Text()
		if rows := strings.Count(text, "\n") + 1; rows > 5 {
			t.Fatalf("Text has %d rows: %q", rows, text)
		}
		if row, col := s.Cursor(); row < 0 || row >= 5 || col < 0 || col >= 12 {
			t.Fatalf("cursor at %d,%d", row, col)
		}
		if bytes.ContainsAny([]byte(text), "\x1b\x00\r") {
			t.Fatalf("control characters in Text: %q", text)
		}
	})
}

// flood writes n bytes from next (which fills its buffer) to s and returns
// the most the heap grew, looked at after a GC every 10 MiB.
func flood(t *testing.T, s *Screen, n int, next func([]byte)) (grew int64) {
	go io.Copy(io.Discard, s.Input())
	before := int64(heapInUse())
	buf := make([]byte, 32<<10)
	for done := 0; done < n; done += len(buf) {
		next(buf)
		write(t, s, string(buf))
		if done%(10<<20) == 0 {
			grew = max(grew, int64(heapInUse())-before)
		}
	}
	return max(grew, int64(heapInUse())-before)
}

// 100 MB of random bytes leave the heap as it was, give or take the screen.
func TestFloodRandom(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood through the emulator")
	}
	s := newScreen(t, 24, 80)
	r := rand.New(rand.NewChaCha8([32]byte{5}))
	grew := flood(t, s, floodSize, func(b []byte) {
		for i := range b {
			b[i] = byte(r.Uint32())
		}
	})
	t.Logf("%d MiB of random bytes: heap grew by at most %.1f MiB", floodSize>>20, float64(grew)/(1<<20))
	if grew > 64<<20 {
		t.Errorf("heap grew by %d MiB, want under 64 MiB", grew>>20)
	}
	write(t, s, "\x18\x1bc\x1b[?1049lend")
	if got := s.Text(); got != "end" {
		t.Errorf("after a reset, Text = %q", got)
	}
}

// 100 MB of lines, as yes prints them: the heap stays, and the screen shows
// the last lines.
func TestFloodLines(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood through the emulator")
	}
	s := newScreen(t, 24, 80)
	line := 0
	pending := ""     // what is left to write of the current line
	var cur []byte    // what is written of it, CR and LF aside
	var done []string // the last 23 lines written whole
	grew := flood(t, s, floodSize, func(b []byte) {
		for i := 0; i < len(b); {
			if pending == "" {
				pending = fmt.Sprintf("y %d the quick brown fox\r\n", line)
				line++
			}
			n := copy(b[i:], pending)
			cur = append(cur, strings.TrimRight(pending[:n], "\r\n")...)
			pending = pending[n:]
			i += n
			if pending == "" {
				done = append(done[max(0, len(done)-22):], string(cur))
				cur = cur[:0]
			}
		}
	})
	t.Logf("%d MiB of lines: heap grew by at most %.1f MiB", floodSize>>20, float64(grew)/(1<<20))
	if grew > 64<<20 {
		t.Errorf("heap grew by %d MiB, want under 64 MiB", grew>>20)
	}
	want := strings.TrimSuffix(strings.Join(append(done, string(cur)), "\n"), "\n")
	if got := s.Text(); got != want {
		t.Errorf("Text after the flood:\n%s\nwant the last lines:\n%s", got, want)
	}
}

// FuzzSameAsVT: for any output that vt as it is can take (no count of six
// digits or more, which it loops over for long; no run of non-ASCII bytes
// that feed splits; none it panics on), a Screen shows the same text and
// cursor.
func FuzzSameAsVT(f *testing.F) {
	for _, out := range ops {
		f.Add([]byte(out), uint8(5), uint8(12))
	}
	f.Fuzz(func(t *testing.T, out []byte, rows, cols uint8) {
		r, c := 1+int(rows)%20, 1+int(cols)%40
		if regexp.MustCompile(`[0-9]{6}|[\x80-\xff]{256}`).Match(out) {
			t.Skip()
		}
		want, wantPos, ok := referenceScreen(r, c, out)
		if !ok {
			t.Skip() // vt panicked
		}
		s := New(r, c)
		defer s.Close()
		go io.Copy(io.Discard, s.Input())
		s.Write(out)
		if got := s.Text(); got != want {
			t.Fatalf("%d×%d, %q:\nscreen\n%s\nvt\n%s", r, c, out, got, want)
		}
		if row, col := s.Cursor(); row != wantPos.Y || col != wantPos.X {
			t.Fatalf("%d×%d, %q: cursor %d,%d, vt %d,%d", r, c, out, row, col, wantPos.Y, wantPos.X)
		}
	})
}

// referenceScreen is the text and cursor of vt as it is after out, with
// Screen's rules for text; ok is false if vt panicked.
func referenceScreen(rows, cols int, out []byte) (text string, pos uv.Position, ok bool) {
	e, stop := reference(rows, cols)
	defer stop()
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	e.Write(out)
	// Screen.textLocked over vt's cells.
	s := &Screen{em: e, rows: rows, cols: cols}
	return s.textLocked(), e.CursorPosition(), true
}
