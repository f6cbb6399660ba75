package term

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// go test ./internal/term -run TestRecorded -record runs vim, top, less and
// python3 on a pseudo-terminal of this host through a Screen (its Input
// copied to the programs, so they get the emulator's replies and the keys),
// checks the live screens, and writes the programs' output to testdata for
// the replays that run without the programs.
var record = flag.Bool("record", false, "run the programs on a host PTY and re-record testdata/*.pty")

// scenario is a program driven through a terminal. Its steps type keys and
// wait for screens; the output up to the end of the last step is what is
// recorded. check runs on the replayed (and the live) screen.
type scenario struct {
	name  string
	setup func(t *testing.T, dir string) []string // the command line
	steps func(t *testing.T, ctx context.Context, s *Screen, dir string)
	check func(t *testing.T, s *Screen)
	after func(t *testing.T, ctx context.Context, s *Screen, dir string) // once recorded: leave the program
}

var (
	vimTilde = regexp.MustCompile(`(?m)^~$`)
	topHead  = regexp.MustCompile(`(?m)^top - \d`)
)

var scenarios = []scenario{
	{
		name: "vim",
		setup: func(t *testing.T, dir string) []string {
			return []string{"vim", "-u", "NONE", "-i", "NONE", "-N", "-n",
				"-c", "set laststatus=2 ruler", "notes.txt"}
		},
		steps: func(t *testing.T, ctx context.Context, s *Screen, dir string) {
			waitMatch(t, ctx, s, `notes\.txt`)
			waitMatch(t, ctx, s, vimTilde.String())
			typ(t, s, "ihello world")
			press(t, s, "Enter")
			typ(t, s, "second line")
			press(t, s, "Escape")
			// Up in the cursor key mode vim set: the cursor on line 1.
			press(t, s, "Up")
			waitMatch(t, ctx, s, `(?m)^second line\n~\n`)
			waitMatch(t, ctx, s, `1,\d+ +All`)
		},
		check: func(t *testing.T, s *Screen) {
			text := s.Text()
			lines := strings.Split(text, "\n")
			if len(lines) < 23 {
				t.Fatalf("vim: %d rows, want the status line on row 23:\n%s", len(lines), text)
			}
			if lines[0] != "hello world" || lines[1] != "second line" {
				t.Errorf("vim: first rows %q, %q; want the typed text:\n%s", lines[0], lines[1], text)
			}
			for i := 2; i < 22; i++ {
				if lines[i] != "~" {
					t.Errorf("vim: row %d is %q, want ~:\n%s", i, lines[i], text)
				}
			}
			if !regexp.MustCompile(`^notes\.txt \[\+\] +1,\d+ +All$`).MatchString(lines[22]) {
				t.Errorf("vim: status line %q, want the file name, [+] and the ruler:\n%s", lines[22], text)
			}
			if row, col := s.Cursor(); row != 0 || col > 10 {
				t.Errorf("vim: cursor at %d,%d, want on the first row", row, col)
			}
		},
		after: func(t *testing.T, ctx context.Context, s *Screen, dir string) {
			typ(t, s, ":wq\r")
			waitFile(t, ctx, filepath.Join(dir, "notes.txt"), "hello world\nsecond line\n")
		},
	},
	{
		name: "top",
		setup: func(t *testing.T, dir string) []string {
			return []string{"top", "-d", "5"}
		},
		steps: func(t *testing.T, ctx context.Context, s *Screen, dir string) {
			waitMatch(t, ctx, s, topHead.String())
			waitMatch(t, ctx, s, `(?m)^ *PID USER .*COMMAND$`)
			if err := s.Wait(ctx, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		},
		check: func(t *testing.T, s *Screen) {
			text := s.Text()
			lines := strings.Split(text, "\n")
			if !topHead.MatchString(lines[0]) {
				t.Errorf("top: first row %q, want the header line:\n%s", lines[0], text)
			}
			if !regexp.MustCompile(`^(Tasks|Threads):`).MatchString(lines[1]) {
				t.Errorf("top: second row %q, want Tasks:\n%s", lines[1], text)
			}
			if !regexp.MustCompile(`(?m)^ *PID USER .*COMMAND$`).MatchString(text) {
				t.Errorf("top: no column header:\n%s", text)
			}
			for i, l := range lines {
				if len([]rune(l)) > 80 {
					t.Errorf("top: row %d is %d wide", i, len([]rune(l)))
				}
			}
		},
		after: func(t *testing.T, ctx context.Context, s *Screen, dir string) { typ(t, s, "q") },
	},
	{
		name: "less",
		setup: func(t *testing.T, dir string) []string {
			var b strings.Builder
			for i := 1; i <= 100; i++ {
				fmt.Fprintf(&b, "line %03d of the file\n", i)
			}
			if err := os.WriteFile(filepath.Join(dir, "file.txt"), []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			return []string{"less", "file.txt"}
		},
		steps: func(t *testing.T, ctx context.Context, s *Screen, dir string) {
			waitMatch(t, ctx, s, `^line 001 of the file\n`)
			press(t, s, "Down", "Down", "Down")
			waitMatch(t, ctx, s, `^line 004 of the file\n(?s:.*)\n:$`)
			press(t, s, "PageDown")
			waitMatch(t, ctx, s, `^line 027 of the file\n`)
			typ(t, s, "G")
			waitMatch(t, ctx, s, `\(END\)$`)
		},
		check: func(t *testing.T, s *Screen) {
			text := s.Text()
			lines := strings.Split(text, "\n")
			if len(lines) != 24 || lines[23] != "(END)" || lines[22] != "line 100 of the file" ||
				lines[0] != "line 078 of the file" {
				t.Errorf("less: want lines 78–100 and (END):\n%s", text)
			}
		},
		after: func(t *testing.T, ctx context.Context, s *Screen, dir string) { typ(t, s, "q") },
	},
	{
		name: "python",
		setup: func(t *testing.T, dir string) []string {
			return []string{"python3", "-q"}
		},
		steps: func(t *testing.T, ctx context.Context, s *Screen, dir string) {
			waitMatch(t, ctx, s, `>>>$`)
			typ(t, s, "x = 6 * 7\r")
			waitMatch(t, ctx, s, `x = 6 \* 7\n>>>$`)
			typ(t, s, "for i in range(3):\r")
			typ(t, s, "    print(x + i)\r\r")
			waitMatch(t, ctx, s, `44\n>>>$`)
			// Editing keys: y = x*2 becomes y = x+20.
			typ(t, s, "y = x*2")
			press(t, s, "Left", "Backspace")
			typ(t, s, "+")
			press(t, s, "End")
			typ(t, s, "0\r")
			waitMatch(t, ctx, s, `y = x\+20\n>>>$`)
			typ(t, s, "y\r")
			waitMatch(t, ctx, s, `\n62\n>>>$`)
		},
		check: func(t *testing.T, s *Screen) {
			want := ">>> x = 6 * 7\n>>> for i in range(3):\n...     print(x + i)\n...\n42\n43\n44\n>>> y = x+20\n>>> y\n62\n>>>"
			if got := s.Text(); got != want {
				t.Errorf("python: screen\n%s\nwant\n%s", got, want)
			}
			if row, col := s.Cursor(); row != 10 || col != 4 {
				t.Errorf("python: cursor at %d,%d, want 10,4", row, col)
			}
		},
		after: func(t *testing.T, ctx context.Context, s *Screen, dir string) { press(t, s, "C-d") },
	},
}

func waitMatch(t *testing.T, ctx context.Context, s *Screen, re string) {
	t.Helper()
	if err := s.WaitMatch(ctx, regexp.MustCompile(re)); err != nil {
		t.Fatalf("waiting for %q: %v; screen:\n%s", re, err, s.Text())
	}
}

func typ(t *testing.T, s *Screen, text string) {
	t.Helper()
	if err := s.Type(text); err != nil {
		t.Fatal(err)
	}
}

func press(t *testing.T, s *Screen, keys ...string) {
	t.Helper()
	if err := s.Press(keys...); err != nil {
		t.Fatal(err)
	}
}

func waitFile(t *testing.T, ctx context.Context, path, want string) {
	t.Helper()
	for {
		got, err := os.ReadFile(path)
		if err == nil && string(got) == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %q, %v; want %q", path, got, err, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestRecorded replays the recorded output of vim, top, less and a Python
// REPL (testdata/*.pty) into a 24 × 80 screen and checks what it shows;
// with -record it first runs the programs and records them.
func TestRecorded(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			path := filepath.Join("testdata", sc.name+".pty")
			if *record {
				out := runLive(t, sc)
				if err := os.WriteFile(path, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			out, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s := New(24, 80)
			defer s.Close()
			// In pieces of varied sizes, as a PTY gives them.
			for i, n := 0, 1; i < len(out); i, n = i+n, n%97+13 {
				s.Write(out[i:min(i+n, len(out))])
			}
			sc.check(t, s)
		})
	}
}

// runLive runs sc's program on a host PTY through a Screen and returns its
// output up to the end of sc.steps.
func runLive(t *testing.T, sc scenario) []byte {
	dir := t.TempDir()
	args := sc.setup(t, dir)
	if _, err := exec.LookPath(args[0]); err != nil {
		t.Skipf("%s: %v", args[0], err)
	}
	master, slave := openPTY(t, 24, 80)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"TERM=xterm-256color", "HOME=" + dir, "PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	s := New(24, 80)
	var mu sync.Mutex
	var rec bytes.Buffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := master.Read(buf)
			mu.Lock()
			rec.Write(buf[:n])
			mu.Unlock()
			s.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	go io.Copy(master, s.Input())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		master.Close()
		<-copied
		s.Close()
	}()
	sc.steps(t, ctx, s, dir)
	mu.Lock()
	out := bytes.Clone(rec.Bytes())
	mu.Unlock()
	sc.check(t, s)
	sc.after(t, ctx, s, dir)
	if err := waitExit(ctx, cmd); err != nil {
		t.Errorf("%s did not end: %v", args[0], err)
	}
	t.Logf("%s: %d bytes recorded; screen:\n%s", sc.name, len(out), s.Text())
	return out
}

func waitExit(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { _, err := cmd.Process.Wait(); done <- err }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openPTY returns the master and slave ends of a new pseudo-terminal of
// rows × cols.
func openPTY(t *testing.T, rows, cols int) (master, slave *os.File) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ws := &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}
	if err := unix.IoctlSetWinsize(int(sl.Fd()), unix.TIOCSWINSZ, ws); err != nil {
		t.Fatal(err)
	}
	return m, sl
}
