package term

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestKeyBytes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		normal    string
		app       string // "" when the same as normal
		unchanged bool
	}{
		{name: "Enter", normal: "\r"},
		{name: "enter", normal: "\r"},
		{name: "Return", normal: "\r"},
		{name: "Tab", normal: "\t"},
		{name: "Escape", normal: "\x1b"},
		{name: "Esc", normal: "\x1b"},
		{name: "Backspace", normal: "\x7f"},
		{name: "Delete", normal: "\x1b[3~"},
		{name: "Insert", normal: "\x1b[2~"},
		{name: "Space", normal: " "},
		{name: "Up", normal: "\x1b[A", app: "\x1bOA"},
		{name: "Down", normal: "\x1b[B", app: "\x1bOB"},
		{name: "Right", normal: "\x1b[C", app: "\x1bOC"},
		{name: "Left", normal: "\x1b[D", app: "\x1bOD"},
		{name: "UP", normal: "\x1b[A", app: "\x1bOA"},
		{name: "Home", normal: "\x1b[H", app: "\x1bOH"},
		{name: "End", normal: "\x1b[F", app: "\x1bOF"},
		{name: "PageUp", normal: "\x1b[5~"},
		{name: "PageDown", normal: "\x1b[6~"},
		{name: "F1", normal: "\x1bOP"},
		{name: "F2", normal: "\x1bOQ"},
		{name: "F3", normal: "\x1bOR"},
		{name: "F4", normal: "\x1bOS"},
		{name: "F5", normal: "\x1b[15~"},
		{name: "F6", normal: "\x1b[17~"},
		{name: "F7", normal: "\x1b[18~"},
		{name: "F8", normal: "\x1b[19~"},
		{name: "F9", normal: "\x1b[20~"},
		{name: "F10", normal: "\x1b[21~"},
		{name: "F11", normal: "\x1b[23~"},
		{name: "F12", normal: "\x1b[24~"},
		{name: "C-a", normal: "\x01"},
		{name: "C-c", normal: "\x03"},
		{name: "C-d", normal: "\x04"},
		{name: "C-z", normal: "\x1a"},
		{name: "C-Z", normal: "\x1a"},
		{name: "c-x", normal: "\x18"},
		{name: "C-@", normal: "\x00"},
		{name: "C-[", normal: "\x1b"},
		{name: "C-\\", normal: "\x1c"},
		{name: "C-]", normal: "\x1d"},
		{name: "C-_", normal: "\x1f"},
		{name: "M-x", normal: "\x1bx"},
		{name: "M-X", normal: "\x1bX"},
		{name: "M-.", normal: "\x1b."},
		{name: "M--", normal: "\x1b-"},
		{name: "M-é", normal: "\x1bé"},
		{name: "M-Enter", normal: "\x1b\r"},
		{name: "M-C-a", normal: "\x1b\x01"},
		{name: "M-Up", normal: "\x1b\x1b[A", app: "\x1b\x1bOA"},
	} {
		for _, app := range []bool{false, true} {
			want := tc.normal
			if app && tc.app != "" {
				want = tc.app
			}
			got, err := keyBytes(tc.name, app)
			if err != nil || got != want {
				t.Errorf("key %q (app cursor %v) = %q, %v; want %q", tc.name, app, got, err, want)
			}
		}
	}
}

func TestUnknownKeys(t *testing.T) {
	for _, name := range []string{"", "F13", "F0", "Ctrl-c", "C-", "C-ab", "C-1", "M-", "M-ab", "Foo", "Enter ", "M-\xff"} {
		_, err := keyBytes(name, false)
		if !errors.Is(err, ErrUnknownKey) {
			t.Errorf("key %q: %v, want ErrUnknownKey", name, err)
			continue
		}
		for _, known := range []string{"Enter", "PageDown", "F1–F12", "C-a … C-z", "M-x"} {
			if !strings.Contains(err.Error(), known) {
				t.Errorf("key %q: error %q does not name %s", name, err, known)
			}
		}
	}
}

// Cursor keys follow the cursor key mode the program sets, and a reset.
func TestPressFollowsCursorKeyMode(t *testing.T) {
	s := newScreen(t, 24, 80)
	for _, step := range []struct{ out, want string }{
		{"", "\x1b[A\x1b[H"},
		{"\x1b[?1h", "\x1bOA\x1bOH"}, // DECCKM set, as vim and less do
		{"\x1b[?1l", "\x1b[A\x1b[H"},
		{"\x1b[?1h\x1bc", "\x1b[A\x1b[H"}, // RIS resets it
	} {
		write(t, s, step.out)
		if err := s.Press("Up", "Home"); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(step.want))
		if _, err := io.ReadFull(s.Input(), got); err != nil {
			t.Fatal(err)
		}
		if string(got) != step.want {
			t.Errorf("after %q: Up Home = %q, want %q", step.out, got, step.want)
		}
	}
}

func ExampleScreen_Press() {
	s := New(24, 80)
	defer s.Close()
	s.Press("C-c", "M-x", "F5")
	b := make([]byte, 8)
	n, _ := s.Input().Read(b)
	fmt.Printf("%q\n", b[:n])
	// Output: "\x03\x1bx\x1b[15~"
}
