package sandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// A command of a leased sandbox outlives the process's Detach: another
// Sandbox (Open) lists it, attaches, sees the output kept (the drop
// said), and Waits for its exit; a third attach takes it over.
func TestSessionsAttach(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID()
	c := sb.Command(ctx, "sh", "-c", `echo first; while [ ! -e go ]; do sleep 0.01; done; head -c `+
		strconv.Itoa(sandbox.SessionBuffer+100)+` /dev/zero | tr '\0' x; echo; echo err >&2; touch done; while [ ! -e end ]; do sleep 0.01; done; exit 9`)
	var first safeBuffer
	c.Stdout = &first
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	cid := c.ID()
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) { return strings.Contains(first.String(), "first"), "no output" })
	if err := sb.Detach(); err != nil {
		t.Fatal(err)
	}
	sb2, err := sandbox.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	list, err := sb2.Sessions(ctx)
	if err != nil || len(list) == 0 {
		t.Fatalf("Sessions: %v, %v", list, err)
	}
	var found *sandbox.Session
	for i := range list {
		if list[i].ID == cid {
			found = &list[i]
		}
	}
	if found == nil || !found.Running || found.Terminal || found.Args[0] != "sh" {
		t.Fatalf("Sessions: %+v (want %s running)", list, cid)
	}
	mustExec(t, sb2, "touch go")
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		return mustExec(t, sb2, "test -e done").ExitCode == 0, "not done"
	})
	var out, errb bytes.Buffer
	a, err := sb2.AttachCommand(ctx, cid, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	// A second attach (the same process here) takes it over.
	var out2, errb2 bytes.Buffer
	b, err := sb2.AttachCommand(ctx, cid, &out2, &errb2)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); !errors.Is(err, sandbox.ErrTakenOver) {
		t.Errorf("Wait of the Cmd taken over: %v, want ErrTakenOver", err)
	}
	e := errb.String()
	if !strings.HasPrefix(e, "[sandbox: ") || !strings.Contains(e, "dropped") || !strings.HasSuffix(e, "]\nerr\n") {
		t.Errorf("stderr replayed: %q", e)
	}
	if n := strings.Count(out.String(), "x"); out.Len() != sandbox.SessionBuffer || n != sandbox.SessionBuffer-1 {
		t.Errorf("stdout replayed: %d bytes, %d x", out.Len(), n)
	}
	mustExec(t, sb2, "touch end")
	var ee *sandbox.ExitError
	if err := b.Wait(); !errors.As(err, &ee) || ee.Code != 9 {
		t.Errorf("Wait after the reattach: %v, want exit status 9", err)
	}
	if _, err := sb2.AttachCommand(ctx, "c424242", nil, nil); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("AttachCommand of no command: %v, want ErrNoSession", err)
	}
}

// In a tethered sandbox commands are listed but cannot be attached.
func TestSessionsTethered(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	c := sb.Command(ctx, "sleep", "1000")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	list, err := sb.Sessions(ctx)
	if err != nil || len(list) == 0 || list[0].ID != c.ID() || !list[0].Running {
		t.Fatalf("Sessions: %+v, %v", list, err)
	}
	if _, err := sb.AttachCommand(ctx, c.ID(), nil, nil); !errors.Is(err, sandbox.ErrNoSession) {
		t.Errorf("AttachCommand in a tethered sandbox: %v, want ErrNoSession", err)
	}
}

// sessionChildEnv makes the test binary, run as a child, start a command
// in a leased sandbox and print the IDs, then wait to be killed (see
// TestSessionsChild).
const sessionChildEnv = "AGENTSANDBOX_SESSION_CHILD"

// TestSessionsChild is not a test: run as a child process by
// TestSessionsAfterDeath, it makes a leased sandbox, starts a shell on a
// terminal there that counts its inputs, prints "IDS=sandbox command" and
// waits for stdin to close (the parent kills it instead).
func TestSessionsChild(t *testing.T) {
	if os.Getenv(sessionChildEnv) == "" {
		t.Skip("helper process for TestSessionsAfterDeath")
	}
	ctx := context.Background()
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLease(time.Minute))
	if err != nil {
		fmt.Printf("ERR=%v\n", err)
		return
	}
	c := sb.Command(ctx, "sh", "-c", `n=0; echo started; while read -r l; do n=$((n+1)); echo "input $n: $l"; [ "$l" = size ] && stty size; [ "$l" = end ] && exit 4; done`)
	c.TTY = &sandbox.TTY{Rows: 10, Cols: 40}
	in, _ := c.StdinPipe()
	out, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		fmt.Printf("ERR=%v\n", err)
		return
	}
	io.WriteString(in, "before\n")
	br := bufio.NewReader(out)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			fmt.Printf("ERR=%v\n", err)
			return
		}
		if strings.HasPrefix(line, "input 1: before") {
			break
		}
	}
	fmt.Printf("IDS=%s %s\n", sb.ID(), c.ID())
	io.Copy(io.Discard, os.Stdin)
}

// A process starts a shell on a terminal in a leased sandbox and is
// killed; this one opens the sandbox, lists the session, reattaches with
// input (Terminal's hook), resizes, and waits for the exit.
func TestSessionsAfterDeath(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSessionsChild$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), sessionChildEnv+"=1", "SANDBOX_IMAGE="+pythonImage)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	var ids []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "IDS="); ok {
			ids = strings.Fields(v)
			break
		}
		if v, ok := strings.CutPrefix(sc.Text(), "ERR="); ok {
			t.Fatalf("child: %s", v)
		}
	}
	if len(ids) != 2 {
		t.Fatalf("child printed no IDs; stderr:\n%s", stderr.String())
	}
	cmd.Process.Kill()
	cmd.Wait()
	ctx := testCtx(t)
	sb, err := sandbox.Open(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	list, err := sb.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range list {
		found = found || (s.ID == ids[1] && s.Terminal && s.Running)
	}
	if !found {
		t.Fatalf("Sessions after the owner's death: %+v, want %s, a running terminal", list, ids[1])
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	var out safeBuffer
	c, err := sandbox.AttachWithStdin(sb, ctx, ids[1], pr, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(pw, "after\n")
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(out.String(), "input 2: after"), fmt.Sprintf("output %q", out.String())
	})
	// A terminal's last output is replayed, read or not (so a new screen
	// shows what it showed), then what follows.
	// ("before" is echoed as it is typed, maybe ahead of "started".)
	if o := out.String(); !strings.Contains(o, "input 1: before\r\nafter\r\ninput 2: after\r\n") ||
		!strings.Contains(o[:strings.Index(o, "input 1")], "started\r\n") {
		t.Errorf("after the reattach: %q", out.String())
	}
	if err := c.Resize(33, 77); err != nil {
		t.Fatal(err)
	}
	io.WriteString(pw, "size\n")
	sandboxtest.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(out.String(), "input 3: size\r\n33 77\r\n"), fmt.Sprintf("output %q", out.String())
	})
	io.WriteString(pw, "end\n")
	var ee *sandbox.ExitError
	if err := c.Wait(); !errors.As(err, &ee) || ee.Code != 4 {
		t.Errorf("Wait: %v, want exit status 4; output %q", err, out.String())
	}
}

type safeBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *safeBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *safeBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
