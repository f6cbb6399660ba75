package term

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newScreen(t testing.TB, rows, cols int) *Screen {
	t.Helper()
	s := New(rows, cols)
	t.Cleanup(func() { s.Close() })
	return s
}

func write(t testing.TB, s *Screen, out string) {
	t.Helper()
	if _, err := s.Write([]byte(out)); err != nil {
		t.Fatal(err)
	}
}

func TestText(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
	}{
		{"empty", "", ""},
		{"crlf", "a\r\nb\r\n", "a\nb"},
		{"trailing spaces trimmed", "a   \r\n  b  ", "a\n  b"},
		{"leading empty rows kept", "\r\n\r\nc", "\n\nc"},
		{"empty rows inside kept", "a\r\n\r\n\r\nd", "a\n\n\nd"},
		{"bare line feed keeps the column", "ab\ncd", "ab\n  cd"},
		{"cursor addressing", "\x1b[3;5Hx\x1b[1;1Hy", "y\n\n    x"},
		{"erase", "abc\x1b[2J\x1b[Hz", "z"},
		{"erase line", "abcdef\r\x1b[3C\x1b[K", "abc"},
		{"colors are not text", "\x1b[1;31mred\x1b[m plain", "red plain"},
		{"wide characters", "日本語x", "日本語x"},
		{"combining mark", "e\u0301!", "e\u0301!"},
		{"wraps at the width", strings.Repeat("x", 25), strings.Repeat("x", 20) + "\nxxxxx"},
		{"scrolls", "1\r\n2\r\n3\r\n4\r\n5\r\n6\r\n7", "3\n4\n5\n6\n7"},
		{"alternate screen", "main\x1b[?1049h\x1b[Halt", "alt"},
		{"back from the alternate screen", "main\x1b[?1049halt\x1b[?1049l", "main"},
		{"line drawing charset", "\x1b(0lqk\x1b(B", "┌─┐"},
		{"tabs", "a\tb", "a       b"},
		{"backspace", "ab\bc", "ac"},
		{"invalid UTF-8 does not panic", "a\xff\xfeb", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScreen(t, 5, 20)
			write(t, s, tc.out)
			got := s.Text()
			if tc.name == "invalid UTF-8 does not panic" {
				if !strings.HasPrefix(got, "a") {
					t.Errorf("Text = %q, want it to begin with a", got)
				}
				return
			}
			if got != tc.want {
				t.Errorf("Text = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCursor(t *testing.T) {
	s := newScreen(t, 24, 80)
	if r, c := s.Cursor(); r != 0 || c != 0 {
		t.Fatalf("new screen: cursor %d,%d, want 0,0", r, c)
	}
	write(t, s, "\x1b[10;20H")
	if r, c := s.Cursor(); r != 9 || c != 19 {
		t.Errorf("after CUP 10;20: cursor %d,%d, want 9,19", r, c)
	}
	write(t, s, "ab\r\n")
	if r, c := s.Cursor(); r != 10 || c != 0 {
		t.Errorf("after text and CRLF: cursor %d,%d, want 10,0", r, c)
	}
	write(t, s, "\x1b[999;999H")
	if r, c := s.Cursor(); r != 23 || c != 79 {
		t.Errorf("after CUP past the screen: cursor %d,%d, want 23,79", r, c)
	}
}

func TestNewSizes(t *testing.T) {
	for _, tc := range []struct{ rows, cols, wantRows, wantCols int }{
		{0, 0, 24, 80},
		{60, 200, 60, 200},
		{-3, 1 << 20, 1, MaxCols},
		{1 << 20, -1, MaxRows, 1},
	} {
		s := New(tc.rows, tc.cols)
		if r, c := s.Size(); r != tc.wantRows || c != tc.wantCols {
			t.Errorf("New(%d, %d): size %d×%d, want %d×%d", tc.rows, tc.cols, r, c, tc.wantRows, tc.wantCols)
		}
		s.Close()
	}
}

func TestResize(t *testing.T) {
	s := newScreen(t, 24, 80)
	write(t, s, "hello\r\nworld")
	if err := s.Resize(10, 40); err != nil {
		t.Fatal(err)
	}
	if r, c := s.Size(); r != 10 || c != 40 {
		t.Fatalf("size %d×%d after Resize(10, 40)", r, c)
	}
	if got := s.Text(); got != "hello\nworld" {
		t.Errorf("Text after a resize = %q", got)
	}
	write(t, s, "\x1b[H"+strings.Repeat("z", 45))
	if got := s.Text(); !strings.HasPrefix(got, strings.Repeat("z", 40)+"\n") {
		t.Errorf("Text after writing 45 columns on a 40-column screen = %q", got)
	}
	for _, bad := range [][2]int{{0, 80}, {24, 0}, {MaxRows + 1, 80}, {24, MaxCols + 1}, {-1, -1}} {
		if err := s.Resize(bad[0], bad[1]); !errors.Is(err, ErrSize) {
			t.Errorf("Resize(%d, %d) = %v, want ErrSize", bad[0], bad[1], err)
		}
	}
	if r, c := s.Size(); r != 10 || c != 40 {
		t.Errorf("size %d×%d after refused resizes, want 10×40", r, c)
	}
}

// Fewer rows keep the cursor's row and those above it, as xterm does.
func TestResizeKeepsCursorRow(t *testing.T) {
	s := newScreen(t, 24, 80)
	var lines []string
	for i := 1; i <= 24; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	write(t, s, strings.Join(lines, "\r\n"))
	if err := s.Resize(10, 40); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Text(), strings.Join(lines[14:], "\n"); got != want {
		t.Errorf("Text after shrinking = %q, want the last 10 lines %q", got, want)
	}
	if r, c := s.Cursor(); r != 9 || c != 7 {
		t.Errorf("cursor %d,%d, want 9,7 (after line 24)", r, c)
	}
	// With the cursor high up, the top rows stay.
	write(t, s, "\x1b[2;1Hnew")
	s.Resize(5, 40)
	if got := s.Text(); got != "line 15\nnewe 16\nline 17\nline 18\nline 19" {
		t.Errorf("Text after shrinking with the cursor high = %q", got)
	}
}

// The program cannot resize the screen: only the host does.
func TestProgramResizeIgnored(t *testing.T) {
	s := newScreen(t, 24, 80)
	for _, seq := range []string{
		"\x1b[8;9999;9999t", // XTWINOPS resize
		"\x1b[8;10;10t",
		"\x1b[4;9999;9999t", // resize in pixels
		"\x1b[?3h",          // DECCOLM: 132 columns
		"\x1b[?3l",
		"\x1b[9;1t", // maximize
		"\x1b[?2048h",
	} {
		write(t, s, seq)
		if r, c := s.Size(); r != 24 || c != 80 {
			t.Fatalf("after %q: size %d×%d, want 24×80", seq, r, c)
		}
	}
	write(t, s, "\x1b[H"+strings.Repeat("y", 81))
	if got := s.Text(); got != strings.Repeat("y", 80)+"\ny" {
		t.Errorf("Text = %q, want 80 columns", got)
	}
}

func TestReplies(t *testing.T) {
	s := newScreen(t, 24, 80)
	in := s.Input()
	for _, tc := range []struct{ out, want string }{
		{"\x1b[5;7H\x1b[6n", "\x1b[5;7R"}, // cursor position report
		{"\x1b[5n", "\x1b[0n"},            // status report
		{"\x1b[c", "\x1b[?62;1;6;22c"},    // primary device attributes
		{"\x1b[?1$p", "\x1b[?1;2$y"},      // DECRQM: cursor keys reset
		{"\x1b[>c", "\x1b[>1;10;0c"},      // secondary device attributes
		{"\x1b]11;?\x07", "\x1b]11;rgb:0000/0000/0000\x07"},
	} {
		write(t, s, tc.out)
		got := make([]byte, len(tc.want))
		if _, err := io.ReadFull(in, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("reply to %q = %q, want %q", tc.out, got, tc.want)
		}
	}
}

// Replies that find Input full are dropped and counted; Write never waits.
func TestRepliesUnread(t *testing.T) {
	s := newScreen(t, 24, 80)
	q := strings.Repeat("\x1b[6n", 100_000) // 600 kB of replies… twice over
	write(t, s, q)
	write(t, s, q)
	if err := s.Type("x"); err == nil {
		// There may be room for one byte; then not for a large paste.
		if err := s.Type(strings.Repeat("x", MaxInput)); !errors.Is(err, ErrInputFull) {
			t.Fatalf("Type of MaxInput bytes into a full input: %v, want ErrInputFull", err)
		}
	} else if !errors.Is(err, ErrInputFull) {
		t.Fatal(err)
	}
	// Write returns once the replies to its output are queued or dropped.
	if got, want := s.InputDropped(), int64(2*100_000*len("\x1b[1;1R"))-MaxInput; got != want {
		t.Errorf("InputDropped = %d, want %d", got, want)
	}
	b := make([]byte, 6)
	if _, err := io.ReadFull(s.Input(), b); err != nil || string(b) != "\x1b[1;1R" {
		t.Errorf("first reply %q, %v", b, err)
	}
}

func TestTypeAndInput(t *testing.T) {
	s := newScreen(t, 24, 80)
	if err := s.Type("ls -l\r"); err != nil {
		t.Fatal(err)
	}
	if err := s.Press("C-c", "Up", "Enter"); err != nil {
		t.Fatal(err)
	}
	want := "ls -l\r\x03\x1b[A\r"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(s.Input(), got); err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("input %q, want %q", got, want)
	}
	// All or nothing.
	if err := s.Press("Enter", "Nope"); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("Press with an unknown key: %v", err)
	}
	if err := s.Type(strings.Repeat("a", MaxInput+1)); !errors.Is(err, ErrInputFull) {
		t.Errorf("Type past MaxInput: %v", err)
	}
	if err := s.Type("z"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 10)
	if n, err := s.Input().Read(b); err != nil || string(b[:n]) != "z" {
		t.Errorf("after refused input, read %q, %v; want only z", b[:n], err)
	}
}

func TestInputClose(t *testing.T) {
	s := New(24, 80)
	done := make(chan error)
	go func() {
		_, err := s.Input().Read(make([]byte, 1))
		done <- err
	}()
	s.Close()
	if err := <-done; err != io.EOF {
		t.Errorf("Read blocked across Close: %v, want io.EOF", err)
	}
	for name, err := range map[string]error{
		"Type":   s.Type("x"),
		"Press":  s.Press("Enter"),
		"Resize": s.Resize(10, 10),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if _, err := s.Write([]byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestWaitMatch(t *testing.T) {
	s := newScreen(t, 24, 80)
	re := regexp.MustCompile(`(?m)^ready>$`)
	done := make(chan error, 1)
	go func() { done <- s.WaitMatch(context.Background(), re) }()
	write(t, s, "loading")
	write(t, s, "\r\nready")
	write(t, s, ">")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Matches at once when it already does.
	if err := s.WaitMatch(context.Background(), re); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.WaitMatch(ctx, regexp.MustCompile("never")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitMatch with a context that ends: %v", err)
	}

	go func() { done <- s.WaitMatch(context.Background(), regexp.MustCompile("never")) }()
	s.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("WaitMatch across Close: %v, want ErrClosed", err)
	}
}

func TestWait(t *testing.T) {
	s := newScreen(t, 24, 80)
	const quiet = 30 * time.Millisecond
	write(t, s, "a")
	if err := s.Wait(context.Background(), quiet); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	still := time.Since(s.last)
	s.mu.Unlock()
	if still < quiet {
		t.Errorf("Wait returned %v after the last change, want ≥ %v", still, quiet)
	}

	// A screen that keeps changing does not settle: ctx ends the wait.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
				s.Write([]byte{'0' + byte(i%10), '\b'})
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := s.Wait(ctx, time.Hour)
	close(stop)
	wg.Wait()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on a changing screen: %v, want DeadlineExceeded", err)
	}
}

// Output that changes nothing on the screen is not a change.
func TestWaitIgnoresNoChange(t *testing.T) {
	s := newScreen(t, 24, 80)
	write(t, s, "abc")
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	write(t, s, "\x1b[1;4H")                      // the cursor where it is
	write(t, s, "\x1b[1;1Habc")                   // the same text over itself, cursor back
	write(t, s, "\x1b[31m\x1b[m\x1b]0;title\x07") // colors set and reset, a title
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != last {
		t.Errorf("output that left the screen as it was counted as a change")
	}
}

type slowWriter struct {
	release chan struct{}
	b       strings.Builder
}

func (w *slowWriter) Write(p []byte) (int, error) {
	<-w.release
	return w.b.Write(p)
}

func TestTee(t *testing.T) {
	s := newScreen(t, 24, 80)
	write(t, s, "before")
	w := &slowWriter{release: make(chan struct{})}
	s.Tee(w)
	k := s.tee.cur
	write(t, s, "one ")
	// The writer is stuck: Write goes on, and what does not fit is dropped.
	write(t, s, strings.Repeat("x", MaxTee))
	if got := s.TeeDropped(); got != 4 {
		t.Errorf("TeeDropped = %d, want 4", got)
	}
	close(w.release)
	s.Tee(nil) // what waits is still written
	<-k.done
	if got := w.b.String(); got != "one "+strings.Repeat("x", MaxTee-4) {
		t.Errorf("tee got %d bytes %q…, want the output from Tee on, up to the bound", len(got), got[:10])
	}
}

// Close ends the copy to the writer once what waits is written.
func TestTeeClose(t *testing.T) {
	s := New(24, 80)
	var b strings.Builder
	s.Tee(&b)
	k := s.tee.cur
	write(t, s, "abc")
	s.Close()
	<-k.done
	if b.String() != "abc" {
		t.Errorf("tee got %q, want abc", b.String())
	}
}

type failWriter struct{}

func (failWriter) Write(p []byte) (int, error) { return 0, errors.New("broken") }

func TestTeeWriterFails(t *testing.T) {
	s := newScreen(t, 24, 80)
	s.Tee(failWriter{})
	k := s.tee.cur
	write(t, s, "abc")
	<-k.done
	write(t, s, "defg")
	if got := s.TeeDropped(); got != 4 {
		t.Errorf("TeeDropped = %d after the writer failed, want 4", got)
	}
}

func TestConcurrent(t *testing.T) {
	s := newScreen(t, 24, 80)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Add(4)
	go func() {
		defer wg.Done()
		for i := range 2000 {
			s.Write([]byte("line " + strings.Repeat("x", i%70) + "\x1b[6n\r\n"))
		}
		s.Write([]byte("done"))
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			s.Text()
			s.Cursor()
		}
	}()
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, s.Input())
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			s.Press("Up", "C-a")
		}
	}()
	if err := s.WaitMatch(context.Background(), regexp.MustCompile(`done$`)); err != nil {
		t.Fatal(err)
	}
	cancel()
	s.Close()
	wg.Wait()
}
