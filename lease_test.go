package sandbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/internal/testenv"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// leaseChildEnv makes the test binary, run as a child, act as another
// process using a leased sandbox (see TestLeaseChild).
const leaseChildEnv = "AGENTSANDBOX_LEASE_CHILD"

// TestLeaseChild is not a test: run as a child process by the lease
// tests, it acts as another process on the host. "make:LABEL" makes a
// leased sandbox (lease 5 s) labelled run=LABEL holding a file "note",
// prints its ID and waits for stdin to close (or to be killed); "open:ID"
// opens the sandbox, prints the note, and detaches when stdin closes.
func TestLeaseChild(t *testing.T) {
	what := os.Getenv(leaseChildEnv)
	if what == "" {
		t.Skip("helper process for the lease tests")
	}
	ctx := context.Background()
	verb, arg, _ := strings.Cut(what, ":")
	var sb *sandbox.Sandbox
	var err error
	switch verb {
	case "make":
		sb, err = sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLease(sandbox.MinLease),
			sandbox.WithLabels(map[string]string{"run": arg}))
		if err == nil {
			_, err = sb.Exec(ctx, "echo made by $PPID > note")
		}
		if err == nil {
			fmt.Printf("ID=%s\n", sb.ID())
		}
	case "open":
		sb, err = sandbox.Open(ctx, arg)
		if err == nil {
			var out []byte
			out, err = sb.Command(ctx, "cat", "note").Output()
			fmt.Printf("NOTE=%s\n", strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		fmt.Printf("ERR=%v\n", err)
		return
	}
	io.Copy(io.Discard, os.Stdin)
	if err := sb.Detach(); err != nil {
		fmt.Printf("ERR=%v\n", err)
	}
}

// child is a child process of the lease tests (TestLeaseChild).
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startChild runs TestLeaseChild with what to do and returns the value of
// the first line it prints with prefix key ("ID", "NOTE"); a line "ERR=..."
// fails the test.
func startChild(t *testing.T, what, key string) (*child, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseChild$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), leaseChildEnv+"="+what, "SANDBOX_IMAGE="+pythonImage)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() { c.cmd.Process.Kill(); c.cmd.Wait() })
	for c.out.Scan() {
		line := c.out.Text()
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return c, v
		}
		if v, ok := strings.CutPrefix(line, "ERR="); ok {
			t.Fatalf("child %q: %s", what, v)
		}
	}
	t.Fatalf("child %q printed no %s; its stderr:\n%s", what, key, stderr.String())
	return nil, ""
}

// end closes the child's stdin (it detaches) and waits for it.
func (c *child) end(t *testing.T) {
	t.Helper()
	c.stdin.Close()
	for c.out.Scan() {
		if v, ok := strings.CutPrefix(c.out.Text(), "ERR="); ok {
			t.Errorf("child: %s", v)
		}
	}
	if err := c.cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}

func runLabel(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

func TestLeaseRefusedShort(t *testing.T) {
	_, err := sandbox.New(context.Background(), sandbox.WithLease(sandbox.MinLease-time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "shorter than the shortest lease") {
		t.Fatalf("New with a 4.999 s lease: %v", err)
	}
}

// A tethered sandbox: Detach refuses and leaves it usable; another
// process's Open refuses and leaves it unharmed; List shows it, not
// leased.
func TestLeaseTethered(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	label := runLabel(t)
	sb := newSandbox(t, sandbox.WithLabels(map[string]string{"run": label}))
	if err := sb.Detach(); !errors.Is(err, sandbox.ErrNotLeased) {
		t.Fatalf("Detach of a tethered sandbox: %v, want ErrNotLeased", err)
	}
	if _, err := sandbox.Open(ctx, sb.ID()); !errors.Is(err, sandbox.ErrNotLeased) {
		t.Fatalf("Open of a tethered sandbox: %v, want ErrNotLeased", err)
	}
	if r := mustExec(t, sb, "echo still"); r.ExitCode != 0 || string(r.Stdout) != "still\n" {
		t.Fatalf("after Detach and Open: %+v", r)
	}
	infos, err := sandbox.List(ctx, sandbox.WithLabels(map[string]string{"run": label}))
	if err != nil || len(infos) != 1 {
		t.Fatalf("List: %v, %v", infos, err)
	}
	if i := infos[0]; i.ID != sb.ID() || i.Leased || !i.Running || !i.Expires.IsZero() || i.Image != busyboxImage || i.Labels["run"] != label {
		t.Fatalf("List: %+v", i)
	}
}

func TestLeaseOpenUnknown(t *testing.T) {
	_, err := sandbox.Open(testCtx(t), "agentsandbox-no-such-sandbox")
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Open of an unknown ID: %v, want fs.ErrNotExist", err)
	}
}

// A leased sandbox made by one process is opened by another while its
// maker still has it, then outlives its maker's SIGKILL while this
// process has it open, and ends for everyone with Close.
func TestLeaseAcrossProcesses(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	label := runLabel(t)
	maker, id := startChild(t, "make:"+label, "ID")

	// Two processes at once: the maker and this one.
	sb, err := sandbox.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	if sb.ID() != id {
		t.Fatalf("Open(%s).ID() = %s", id, sb.ID())
	}
	out, err := sb.Command(ctx, "cat", "note").Output()
	if err != nil || !strings.HasPrefix(string(out), "made by") {
		t.Fatalf("the maker's note: %q, %v", out, err)
	}
	// A third process opens it too.
	opener, note := startChild(t, "open:"+id, "NOTE")
	if !strings.HasPrefix(note, "made by") {
		t.Fatalf("the other opener read %q", note)
	}
	opener.end(t)

	infos, err := sandbox.List(ctx, sandbox.WithLabels(map[string]string{"run": label}))
	if err != nil || len(infos) != 1 {
		t.Fatalf("List: %+v, %v", infos, err)
	}
	if i := infos[0]; i.ID != id || !i.Leased || !i.Running || i.Lease != sandbox.MinLease ||
		i.Expires.Before(time.Now()) || i.Expires.After(time.Now().Add(sandbox.MinLease+time.Second)) {
		t.Fatalf("List: %+v", i)
	}

	// The maker is killed: this process's renewals keep the sandbox.
	maker.cmd.Process.Kill()
	maker.cmd.Wait()
	// Two lease periods pass with only this process renewing.
	if r := mustExec(t, sb, fmt.Sprintf("sleep %d; cat note", int(2*sandbox.MinLease/time.Second)+1)); r.ExitCode != 0 {
		t.Fatalf("after the maker's death: %+v", r)
	}
	if n, err := sandbox.Prune(ctx); err != nil {
		t.Fatal(err)
	} else if _, err := sb.Exec(ctx, "true"); err != nil {
		t.Fatalf("Prune (%d removed) took a live leased sandbox: %v", n, err)
	}

	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.Open(ctx, id); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after Close: %v, want fs.ErrNotExist", err)
	}
	if infos, err := sandbox.List(ctx, sandbox.WithLabels(map[string]string{"run": label})); err != nil || len(infos) != 0 {
		t.Fatalf("List after Close: %+v, %v", infos, err)
	}
}

// Detach lets go without ending; the value answers ErrClosed; the
// sandbox is opened again in this process.
func TestLeaseDetachOpen(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage), sandbox.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID()
	if r := mustExec(t, sb, "echo kept > kept; sleep 1000 & echo $! > bg"); r.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	if err := sb.Detach(); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, "true"); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("Exec after Detach: %v, want ErrClosed", err)
	}
	if err := sb.Detach(); !errors.Is(err, sandbox.ErrClosed) {
		t.Fatalf("second Detach: %v, want ErrClosed", err)
	}
	sb2, err := sandbox.Open(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	out, err := sb2.Command(ctx, "cat", "kept").Output()
	if err != nil || string(out) != "kept\n" {
		t.Fatalf("after reopening: %q, %v", out, err)
	}
	// What the detached session started ended with it.
	if r := mustExec(t, sb2, `kill -0 $(cat bg) 2>/dev/null && echo alive || echo gone`); string(r.Stdout) != "gone\n" {
		t.Fatalf("the detached session's background process: %q", r.Stdout)
	}
	if err := sb2.Close(); err != nil {
		t.Fatal(err)
	}
}

// A leased sandbox whose every process was SIGKILLed ends by itself once
// its lease runs out, stays known (ErrSandboxGone) until Prune removes it.
func TestLeaseExpiresAfterSIGKILL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	label := runLabel(t)
	maker, id := startChild(t, "make:"+label, "ID")
	killed := time.Now()
	maker.cmd.Process.Kill()
	maker.cmd.Wait()

	var ended time.Duration
	sandboxtest.Eventually(t, sandbox.MinLease+testenv.HangGuard, func() (bool, string) {
		infos, err := sandbox.List(ctx, sandbox.WithLabels(map[string]string{"run": label}))
		if err != nil || len(infos) != 1 {
			return false, fmt.Sprintf("List: %+v, %v", infos, err)
		}
		ended = time.Since(killed)
		return !infos[0].Running, "still running"
	})
	t.Logf("the lease (%v) ended the sandbox %v after its only process was killed", sandbox.MinLease, ended.Round(100*time.Millisecond))
	if ended > sandbox.MinLease+10*time.Second {
		t.Errorf("ended %v after the kill: later than the lease + 10 s", ended)
	}
	if _, err := sandbox.Open(ctx, id); !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Fatalf("Open of an ended leased sandbox: %v, want ErrSandboxGone", err)
	}
	if _, err := sandbox.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sandbox.Open(ctx, id); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after Prune: %v, want fs.ErrNotExist", err)
	}
}
