//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// The leased agent runs in a process of its own (the test binary again,
// see TestMain), as it does in a sandbox but without what only a
// container may do to itself (lockDev, harden): its lease's end really
// exits. Its commands run as the test's user on this machine, each with a
// tag from a random base, so that the kills of one test's agent never
// reach another's.

// serveEnv, set, makes the test binary a leased agent (serveConfig, as
// JSON) instead of running tests.
const serveEnv = "AGENT_TEST_SERVE"

// dialEnv, set, makes the test binary dial the agent's socket at that
// path and say what it got (see dialForTest).
const dialEnv = "AGENT_TEST_DIAL"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(serveEnv); cfg != "" {
		serveForTest(cfg)
	}
	if path := os.Getenv(dialEnv); path != "" {
		fmt.Println(dialForTest(path, true))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type serveConfig struct {
	Socket    string
	Lease     time.Duration
	RelayPort int
	ExecOnly  bool
	NextTag   uint32
}

// serveForTest runs a leased agent as main does once set up; it says
// "ready" on stdout once its socket listens.
func serveForTest(cfgJSON string) {
	var cfg serveConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ln, err := listenAt(cfg.Socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	in := newInstance(startWorkers(1), &oomScore{})
	in.nextTag = cfg.NextTag
	in.greeting = wire.Greeting{Version: version, PID: os.Getpid(), Lease: cfg.Lease}
	in.execOnly = cfg.ExecOnly
	if cfg.RelayPort != 0 {
		if err := in.listenRelay(cfg.RelayPort); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	fmt.Println("ready")
	err = in.runLeased(ln, cfg.Lease)
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

// dialForTest connects to the agent's socket as the library's relay does
// (proveRelay), or, if it may not (a process without CAP_SETUID), or
// !prove, as any other program would (a byte); it reads the agent's first
// frame and says "hello" for a greeting, "closed" if the agent closed the
// connection without one, or what failed.
func dialForTest(path string, prove bool) string {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	mapped, _ := mappedIDs()
	if !prove || proveRelay(c, relayUID(mapped)) != nil {
		c.Write([]byte{0})
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := wire.ReadFrame(c)
	switch {
	case err == nil && f.Kind == wire.Hello:
		return "hello"
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		return "closed"
	case err != nil:
		return "read: " + err.Error()
	}
	return "frame " + f.String()
}

// testAgent is a leased agent in a process of its own.
type testAgent struct {
	cfg    serveConfig
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{} // closed once it exited; then state is set
	state  *os.ProcessState
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startLeased starts a leased agent with a lease of d and a relay port
// (0: none). Its commands are killed and it is ended when the test ends.
func startLeased(t *testing.T, d time.Duration, relayPort int, execOnly bool) *testAgent {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: a session's relay proves itself as the relay's user (SCM_CREDENTIALS naming another user need CAP_SETUID)")
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	cfg := serveConfig{
		Socket: filepath.Join(t.TempDir(), "agent.sock"), Lease: d, RelayPort: relayPort, ExecOnly: execOnly,
		NextTag: binary.BigEndian.Uint32(rnd[:]) % (1 << 28),
	}
	b, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ta := &testAgent{cfg: cfg, cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = ta.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		ta.state = cmd.ProcessState
		close(ta.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-ta.exited
		// What its sessions left running (a test that failed midway).
		tags := map[uint32]bool{}
		for i := range uint32(1000) {
			tags[tagBase+cfg.NextTag+1+i] = true
		}
		killTags(tags, os.Getpid())
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("the agent did not start: %q, %v; stderr %q", line, err, ta.stderr)
	}
	return ta
}

// session opens a session: the library's connection, once greeted.
func (ta *testAgent) session(t *testing.T) (*agentconn.Conn, *net.UnixConn, wire.Greeting) {
	t.Helper()
	uc := ta.dial(t)
	c := agentconn.Start(uc, uc, 10*time.Second)
	t.Cleanup(func() {
		uc.Close()
		<-c.Done()
	})
	g, err := c.Ready(context.Background())
	if err != nil {
		t.Fatalf("greeting: %v", err)
	}
	return c, uc, g
}

// dial connects to the agent as the library's relay does.
func (ta *testAgent) dial(t *testing.T) *net.UnixConn {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: ta.cfg.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	mapped, err := mappedIDs()
	if err == nil {
		err = proveRelay(uc, relayUID(mapped))
	}
	if err != nil {
		t.Fatalf("the relay's proof: %v", err)
	}
	return uc
}

// waitExit waits for the agent to exit (bounded) and returns its exit
// code.
func (ta *testAgent) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-ta.exited:
		return ta.state.ExitCode()
	case <-time.After(within):
		t.Fatalf("the agent still runs after %v; stderr %q", within, ta.stderr)
		return 0
	}
}

func (ta *testAgent) running() bool {
	select {
	case <-ta.exited:
		return false
	default:
		return true
	}
}

// exec starts a command in a session.
func exe(t *testing.T, c *agentconn.Conn, args ...string) *agentconn.Proc {
	t.Helper()
	p, err := c.Exec(context.Background(), wire.ExecRequest{Args: args, Dir: "/", User: uidSpec()})
	if err != nil {
		t.Fatalf("exec %q: %v", args, err)
	}
	t.Cleanup(p.Close)
	return p
}

// output runs a command to its end and returns its stdout.
func output(t *testing.T, c *agentconn.Conn, args ...string) string {
	t.Helper()
	p := exe(t, c, args...)
	go io.Copy(io.Discard, p.Stderr)
	out, _ := io.ReadAll(p.Stdout)
	if e, err := p.Wait(context.Background()); err != nil || e.Code != 0 {
		t.Fatalf("%q: %+v, %v", args, e, err)
	}
	return string(out)
}

// process is a process of this machine, watched through a pidfd: its end
// is seen whoever reaps it.
type process struct {
	pid int
	fd  int
}

func watch(t *testing.T, pid int) *process {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &process{pid, fd}
}

// ended waits up to within for the process to end; false if it still
// runs then (within 0: is it over now?).
func (p *process) ended(within time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(within.Milliseconds()))
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1
	}
}

// Several sessions at once, each with its own channels (numbered from 1
// in each), run commands at the same time; each greeting says the lease.
func TestSessionsConcurrent(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	var wg sync.WaitGroup
	for i := range 4 {
		c, _, g := ta.session(t)
		if g.Lease != time.Hour || g.PID != ta.cmd.Process.Pid {
			t.Fatalf("greeting %+v", g)
		}
		for j := range 5 {
			wg.Go(func() {
				want := fmt.Sprintf("session %d command %d", i, j)
				p, err := c.Exec(context.Background(), wire.ExecRequest{Args: []string{"sh", "-c", `echo "$0"`, want}, Dir: "/", User: uidSpec()})
				if err != nil {
					t.Error(err)
					return
				}
				defer p.Close()
				out, _ := io.ReadAll(p.Stdout)
				e, err := p.Wait(context.Background())
				if string(out) != want+"\n" || err != nil || e.Code != 0 {
					t.Errorf("%s: %q, %+v, %v", want, out, e, err)
				}
			})
		}
	}
	wg.Wait()
}

// A session's end kills every command it started (those still running
// and what they left running, such as a daemon that went to a session of
// its own), and nothing of another session, which goes on.
func TestSessionEndKillsItsCommands(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	a, aConn, _ := ta.session(t)
	b, _, _ := ta.session(t)
	aSleep := watch(t, exe(t, a, "sleep", "1000").PID)
	daemon := output(t, a, "sh", "-c", `setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $!`)
	pid, err := strconv.Atoi(strings.TrimSpace(daemon))
	if err != nil {
		t.Fatalf("daemon's pid %q", daemon)
	}
	aDaemon := watch(t, pid)
	bProc := exe(t, b, "sleep", "1000")
	bSleep := watch(t, bProc.PID)

	aConn.Close() // the library's process went away
	if !aSleep.ended(10*time.Second) || !aDaemon.ended(10*time.Second) {
		t.Fatal("session A's commands outlived it")
	}
	if bSleep.ended(0) {
		t.Fatal("session B's command was killed with session A")
	}
	if got := output(t, b, "echo", "still here"); got != "still here\n" {
		t.Fatalf("session B after A's end: %q", got)
	}
	if _, err := bProc.Kill(context.Background()); err != nil || !bSleep.ended(10*time.Second) {
		t.Fatalf("B's kill: %v", err)
	}
	if !ta.running() {
		t.Fatal("the agent ended with a session")
	}
}

// Not renewed, the lease ends the agent: it says so, kills every command
// of every session and exits 0 (which, as PID 1, ends the container).
func TestLeaseExpires(t *testing.T) {
	const d = time.Second
	ta := startLeased(t, d, 0, false)
	a, _, g := ta.session(t)
	b, _, _ := ta.session(t)
	if g.Lease != d {
		t.Fatalf("greeting's lease %v, want %v", g.Lease, d)
	}
	li, err := a.Lease(context.Background(), false)
	if err != nil || !li.Leased || li.Lease != d || li.Left <= 0 || li.Left > d {
		t.Fatalf("lease %+v, %v", li, err)
	}
	aSleep := watch(t, exe(t, a, "sleep", "1000").PID)
	bSleep := watch(t, exe(t, b, "sleep", "1000").PID)
	if code := ta.waitExit(t, d+30*time.Second); code != 0 {
		t.Fatalf("exit code %d; stderr %q", code, ta.stderr)
	}
	if want := fmt.Sprintf("agent: lease ended: no renewal for %v\n", d); !strings.Contains(ta.stderr.String(), want) {
		t.Errorf("stderr %q, want %q", ta.stderr, want)
	}
	if !aSleep.ended(10*time.Second) || !bSleep.ended(10*time.Second) {
		t.Error("commands outlived the lease")
	}
	<-a.Done()
	<-b.Done()
}

// Renewals keep the agent alive well past its lease, from whichever
// session; queries do not renew: once only queries come, it ends.
func TestLeaseRenewed(t *testing.T) {
	const d = 2 * time.Second
	ta := startLeased(t, d, 0, false)
	a, _, _ := ta.session(t)
	b, _, _ := ta.session(t)
	for i, end := 0, time.Now().Add(3*d); time.Now().Before(end); i++ {
		c := a
		if i%2 == 1 {
			c = b
		}
		li, err := c.Lease(context.Background(), true)
		if err != nil || !li.Leased || li.Lease != d || li.Left <= 0 || li.Left > d {
			t.Fatalf("renewal %d: %+v, %v", i, li, err)
		}
		time.Sleep(d / 8)
	}
	if err := a.Ping(context.Background()); err != nil || !ta.running() {
		t.Fatalf("after renewals for 3 leases: %v", err)
	}
	// Queries alone: what is left only shrinks, and the agent ends.
	last := d + 1
	for ta.running() {
		li, err := b.Lease(context.Background(), false)
		if err != nil {
			break // the agent is going
		}
		if li.Left > last {
			t.Fatalf("a query renewed the lease: %v left after %v", li.Left, last)
		}
		last = li.Left
		time.Sleep(d / 8)
	}
	if code := ta.waitExit(t, d+30*time.Second); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// Forged Lease frames (bad JSON, none) answer Failed and change nothing;
// the session goes on.
func TestLeaseBadRequests(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	uc := ta.dial(t)
	defer uc.Close()
	w := wire.NewWriter(uc)
	bad := [][]byte{nil, []byte("{"), []byte(`{"Renew":"yes"}`), []byte("[1]"), bytes.Repeat([]byte("["), 10000)}
	for i, data := range bad {
		w.Write(wire.Lease, uint32(i+1), data)
	}
	w.WriteJSON(wire.Lease, 100, wire.LeaseRequest{})
	uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	failed := map[uint32]bool{}
	for {
		f, err := wire.ReadFrame(uc)
		if err != nil {
			t.Fatalf("after %v failed: %v", failed, err)
		}
		switch {
		case f.Kind == wire.Failed && strings.Contains(string(f.Data), "bad lease request"):
			failed[f.Channel] = true
		case f.Kind == wire.LeaseState && f.Channel == 100:
			var li wire.LeaseInfo
			if err := json.Unmarshal(f.Data, &li); err != nil || !li.Leased || li.Lease != time.Hour {
				t.Fatalf("lease after forged requests: %s", f.Data)
			}
			if len(failed) != len(bad) {
				t.Fatalf("failed channels %v, want 1 to %d", failed, len(bad))
			}
			return
		case f.Kind != wire.Hello:
			t.Fatalf("unexpected %v: %q", f, f.Data)
		}
	}
}

// A tethered agent answers Lease too: not leased, all zero.
func TestLeaseTethered(t *testing.T) {
	c := relayAgent(t, 0)
	for _, renew := range []bool{false, true} {
		if li, err := c.Lease(context.Background(), renew); err != nil || li != (wire.LeaseInfo{}) {
			t.Fatalf("Lease(%v) of a tethered agent: %+v, %v", renew, li, err)
		}
	}
}

// Egress goes to the newest session that sent an Accept: an older
// session's Accepts (pending or new) fail with ErrEgressTaken; once the
// serving session ends, a connection to the relay port is reset, not
// left waiting, until a newer session accepts.
func TestEgressNewestSession(t *testing.T) {
	port := freePort(t)
	ta := startLeased(t, time.Hour, port, false)
	a, _, _ := ta.session(t)
	b, bConn, _ := ta.session(t)

	// A serves egress: a program's connection comes to it.
	aConns := make(chan net.Conn, 1)
	aErr := make(chan error, 2)
	go func() {
		conn, err := a.Accept(context.Background())
		if err != nil {
			aErr <- err
			return
		}
		aConns <- conn
		_, err = a.Accept(context.Background()) // pending when B takes over
		aErr <- err
	}()
	sb := dialRelay(t, port)
	var ac net.Conn
	select {
	case ac = <-aConns:
	case err := <-aErr:
		t.Fatal(err)
	}
	echo(t, sb, ac, "to a")

	// B, newer, takes over: A's pending Accept fails, the next connection
	// goes to B, and A's established connection goes on.
	bConns := make(chan net.Conn, 1)
	go func() {
		if conn, err := b.Accept(context.Background()); err == nil {
			bConns <- conn
		}
	}()
	if err := <-aErr; !errors.Is(err, agentconn.ErrEgressTaken) {
		t.Fatalf("A's pending Accept once B accepts: %v", err)
	}
	sb2 := dialRelay(t, port)
	echo(t, sb2, <-bConns, "to b")
	echo(t, sb, ac, "a still")
	if _, err := a.Accept(context.Background()); !errors.Is(err, agentconn.ErrEgressTaken) {
		t.Fatalf("A's Accept after B's: %v", err)
	}

	// B goes: nobody serves egress. A is older than B: it may not.
	bConn.Close()
	<-b.Done()
	if _, err := a.Accept(context.Background()); !errors.Is(err, agentconn.ErrEgressTaken) {
		t.Fatalf("A's Accept once B ended: %v", err)
	}
	for range 3 {
		assertReset(t, port)
	}
	echo(t, sb, ac, "a after b") // established connections live on

	// D, a newer session, serves egress again.
	d, _, _ := ta.session(t)
	dConns := make(chan net.Conn, 1)
	go func() {
		if conn, err := d.Accept(context.Background()); err == nil {
			dConns <- conn
		}
	}()
	sb3, dc := dialServed(t, port, dConns)
	echo(t, sb3, dc, "to d")
}

// dialServed connects to the relay port until a connection is not reset
// (nobody may serve egress yet) and comes out of conns.
func dialServed(t *testing.T, port int, conns <-chan net.Conn) (net.Conn, net.Conn) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if errors.Is(err, syscall.ECONNRESET) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		read := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1)) // the library writes nothing yet
			read <- err
		}()
		select {
		case lib := <-conns:
			c.SetReadDeadline(time.Now()) // ends the read
			if err := <-read; !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("a served connection: %v", err)
			}
			c.SetReadDeadline(time.Time{})
			t.Cleanup(func() { c.Close() })
			return c, lib
		case err := <-read:
			c.Close()
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("a connection to the relay port: %v", err)
			}
		}
	}
	t.Fatal("no connection to the relay port served")
	return nil, nil
}

func dialRelay(t *testing.T, port int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echo sends msg from the sandbox's end to the library's and back.
func echo(t *testing.T, sandboxEnd, libEnd net.Conn, msg string) {
	t.Helper()
	t.Cleanup(func() { libEnd.Close() })
	for _, dir := range [][2]net.Conn{{sandboxEnd, libEnd}, {libEnd, sandboxEnd}} {
		if _, err := dir[0].Write([]byte(msg)); err != nil {
			t.Fatalf("%s: write: %v", msg, err)
		}
		buf := make([]byte, len(msg))
		dir[1].SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(dir[1], buf); err != nil || string(buf) != msg {
			t.Fatalf("%s: read %q, %v", msg, buf, err)
		}
	}
}

// assertReset connects to the relay port and expects a reset.
func assertReset(t *testing.T, port int) {
	t.Helper()
	c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.ECONNRESET) {
		return // reset before connect(2) returned
	} else if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection to the relay port with nobody serving egress: %d bytes, %v; want a reset", n, err)
	}
}

// A thousand connections at once: at most maxSessions are served, the
// rest are closed at once, and once those sessions end the agent serves
// a new one.
func TestSessionsBounded(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	const n = 1000
	results := make(chan string, n)
	conns := make(chan net.Conn, n)
	for range n {
		go func() {
			c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: ta.cfg.Socket, Net: "unix"})
			if err == nil {
				mapped, _ := mappedIDs()
				err = proveRelay(c, relayUID(mapped))
			}
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
				results <- "closed" // before the proof went out
				c.Close()
				return
			} else if err != nil {
				results <- "dial: " + err.Error()
				return
			}
			conns <- c
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			f, err := wire.ReadFrame(c)
			switch {
			case err == nil && f.Kind == wire.Hello:
				results <- "hello"
			case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
				results <- "closed"
			default:
				results <- fmt.Sprintf("%v %v", f, err)
			}
		}()
	}
	count := map[string]int{}
	for range n {
		count[<-results]++
	}
	if count["hello"] != maxSessions || count["closed"] != n-maxSessions {
		t.Errorf("%d connections at once: %v; want %d greeted, the rest closed", n, count, maxSessions)
	}
	close(conns)
	for c := range conns {
		c.Close()
	}
	// The sessions end as their connections close; then one is served.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if r := dialForTest(ta.cfg.Socket, true); r == "hello" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no session served after the thousand closed: %s", r)
		}
	}
	if !ta.running() {
		t.Fatal("the agent ended")
	}
}

// Only the library's relay gets a session: root (the socket is root's,
// mode 0600) with the capabilities to prove itself (relayProof), and in a
// sandbox a process the engine exec'd. A root process that does not prove
// itself (as a command, which has no capabilities, cannot), one of this
// machine's (not exec'd from outside the agent's PID namespace), and one
// not root get none.
func TestSessionsRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the agent's socket is root's")
	}
	ta := startLeased(t, time.Hour, 0, true)
	if r := dialForTest(ta.cfg.Socket, true); r != "closed" {
		t.Errorf("a process that was not exec'd from outside: %s; want closed", r)
	}
	// Not root: the socket's mode refuses it, and opened to all, the
	// agent does.
	bin := filepath.Join(t.TempDir(), "agent.test")
	copyFile(t, os.Args[0], bin)
	openDirs(t, bin)
	asNobody := func(socket string) string {
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialEnv+"="+socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("as nobody: %q, %v", out, err)
		}
		return strings.TrimSpace(string(out))
	}
	openDirs(t, ta.cfg.Socket)
	if r := asNobody(ta.cfg.Socket); !strings.Contains(r, "permission denied") {
		t.Errorf("nobody through the socket's mode: %s; want permission denied", r)
	}
	tb := startLeased(t, time.Hour, 0, false)
	openDirs(t, tb.cfg.Socket)
	if err := os.Chmod(tb.cfg.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	if r := asNobody(tb.cfg.Socket); r != "closed" {
		t.Errorf("nobody on a socket opened to all: %s; want closed", r)
	}
	if r := dialForTest(tb.cfg.Socket, false); r != "closed" {
		t.Errorf("root without the relay's proof: %s; want closed", r)
	}
	if r := dialForTest(tb.cfg.Socket, true); r != "hello" {
		t.Errorf("root with the relay's proof, on the same agent: %s", r)
	}
}

// openDirs lets everyone through the test's temporary directories to
// file.
func openDirs(t *testing.T, file string) {
	t.Helper()
	for d := filepath.Dir(file); d != os.TempDir() && d != "/" && d != "."; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
