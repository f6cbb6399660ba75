package sandboxtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
)

// leaseEnv makes the test binary, run as a child by the lease subtest,
// act as another process using a leased sandbox (see leaseChild).
const leaseEnv = "AGENTSANDBOX_CONFORMANCE_LEASE"

// leaseChild is the lease subtest's other process: "make:LABEL" makes a
// sandbox leased for sandbox.MinLease, labelled run=LABEL, holding a file
// "note", and prints its ID ("make-long:LABEL": leased for a minute); "open:ID" opens that sandbox and prints the
// note. Either then waits for its stdin to end and detaches.
func (c conformance) leaseChild(t *testing.T, what string) {
	ctx := ctxFor(t)
	verb, arg, _ := strings.Cut(what, ":")
	var sb *sandbox.Sandbox
	var err error
	switch verb {
	case "make", "make-long":
		lease := sandbox.MinLease
		if verb == "make-long" { // a lease that a loaded machine's late renewals do not end
			lease = time.Minute
		}
		sb, err = sandbox.New(ctx, append(append([]sandbox.Option{}, c.opts...),
			sandbox.WithLease(lease), sandbox.WithLabels(map[string]string{"run": arg}))...)
		if err == nil {
			_, err = sb.Exec(ctx, "echo made > note")
		}
		if err == nil {
			fmt.Printf("\nagentsandbox-lease ID=%s\n", sb.ID())
		}
	case "open":
		sb, err = sandbox.Open(ctx, arg, c.opts...)
		if err == nil {
			var out []byte
			out, err = sb.Command(ctx, "cat", "note").Output()
			fmt.Printf("\nagentsandbox-lease NOTE=%s\n", strings.TrimSpace(string(out)))
		}
	case "term":
		sb, err = sandbox.Open(ctx, arg, c.opts...)
		if err == nil {
			err = termChild(ctx, sb)
		}
	default:
		err = fmt.Errorf("unknown request %q", what)
	}
	if err != nil {
		fmt.Printf("\nagentsandbox-lease ERR=%v\n", err)
		return
	}
	io.Copy(io.Discard, os.Stdin)
	if err := sb.Detach(); err != nil {
		fmt.Printf("\nagentsandbox-lease ERR=%v\n", err)
	}
}

// leaseProc is a child process of the lease subtest.
type leaseProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startLeaseProc runs the top test in a child process doing what, and
// returns the value it prints for key ("ID", "NOTE").
func startLeaseProc(t *testing.T, what, key string) (*leaseProc, string) {
	t.Helper()
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), leaseEnv+"="+what)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &leaseProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "agentsandbox-lease "); ok {
				p.lines <- v
			}
		}
		close(p.lines)
	}()
	timeout := time.NewTimer(3 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("child %q ended without %s: %s", what, key, stderr.String())
			}
			if v, ok := strings.CutPrefix(l, key+"="); ok {
				return p, v
			}
			if v, ok := strings.CutPrefix(l, "ERR="); ok {
				t.Fatalf("child %q: %s", what, v)
			}
		case <-timeout.C:
			t.Fatalf("child %q printed no %s in 3 minutes: %s", what, key, stderr.String())
		}
	}
}

// detach has the child detach and waits for it to end.
func (p *leaseProc) detach(t *testing.T) {
	t.Helper()
	p.stdin.Close()
	for l := range p.lines {
		if v, ok := strings.CutPrefix(l, "ERR="); ok {
			t.Errorf("child: %s", v)
		}
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
}

// lease: a leased sandbox made by one process is open in three at once
// (its maker, this one, a third that detaches), is listed with its lease,
// outlives its maker's SIGKILL while this process renews it, runs on after
// this process detaches, and — with every process gone — ends once its
// lease runs out (within the lease + 10 s), known as ended until Prune
// removes it. A tethered sandbox cannot be opened or detached.
func (c conformance) lease(t *testing.T) {
	ctx := ctxFor(t)
	label := fmt.Sprintf("conformance-%d", time.Now().UnixNano())
	match := sandbox.WithLabels(map[string]string{"run": label})
	list := func() []sandbox.Info {
		t.Helper()
		infos, err := sandbox.List(ctx, append(append([]sandbox.Option{}, c.opts...), match)...)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		return infos
	}

	tethered := c.new(t)
	if err := tethered.Detach(); !errors.Is(err, sandbox.ErrNotLeased) {
		t.Errorf("Detach of a tethered sandbox: %v, want ErrNotLeased", err)
	}
	if _, err := sandbox.Open(ctx, tethered.ID(), c.opts...); !errors.Is(err, sandbox.ErrNotLeased) {
		t.Errorf("Open of a tethered sandbox: %v, want ErrNotLeased", err)
	}
	if r := run(t, tethered, "echo ok"); string(r.Stdout) != "ok\n" {
		t.Errorf("the tethered sandbox after Detach and Open: %+v", r)
	}
	if _, err := sandbox.Open(ctx, "agentsandbox-no-such-sandbox", c.opts...); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of an unknown ID: %v, want fs.ErrNotExist", err)
	}

	maker, id := startLeaseProc(t, "make:"+label, "ID")
	sb, err := sandbox.Open(ctx, id, c.opts...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if sb.ID() != id {
		t.Errorf("Open(%s).ID() = %s", id, sb.ID())
	}
	opener, note := startLeaseProc(t, "open:"+id, "NOTE")
	if note != "made" {
		t.Errorf("a third process read %q", note)
	}
	opener.detach(t)
	infos := list()
	if len(infos) != 1 || infos[0].ID != id || !infos[0].Leased || !infos[0].Running ||
		infos[0].Expires.Before(time.Now()) || infos[0].Expires.After(time.Now().Add(sandbox.MinLease+5*time.Second)) {
		t.Fatalf("List: %+v", infos)
	}

	maker.cmd.Process.Kill()
	maker.cmd.Wait()
	// Two leases pass with only this process renewing.
	script := fmt.Sprintf("sleep %d; cat note", int(2*sandbox.MinLease/time.Second)+1)
	if r := run(t, sb, script); r.ExitCode != 0 || string(r.Stdout) != "made\n" {
		t.Fatalf("after its maker's death: %+v", r)
	}
	if err := sb.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	detached := time.Now()
	Eventually(t, sandbox.MinLease+10*time.Second, func() (bool, string) {
		left := list()
		return len(left) == 1 && !left[0].Running, fmt.Sprintf("the lease did not end the sandbox within the lease + 10 s: %+v", left)
	})
	t.Logf("the lease of %v ended the sandbox %v after the last process let go", sandbox.MinLease, time.Since(detached).Round(100*time.Millisecond))
	if _, err := sandbox.Open(ctx, id, c.opts...); !errors.Is(err, sandbox.ErrSandboxGone) {
		t.Errorf("Open of an ended sandbox: %v, want ErrSandboxGone", err)
	}
	if _, err := c.drv.Prune(ctx); err != nil {
		t.Errorf("Prune: %v", err)
	}
	if _, err := sandbox.Open(ctx, id, c.opts...); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open after Prune: %v, want fs.ErrNotExist", err)
	}
	if left := list(); len(left) != 0 {
		t.Errorf("List after Prune: %+v", left)
	}
}
