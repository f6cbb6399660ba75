//go:build linux

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// A leased agent as PID 1 of a container with the library's hardening
// (no capabilities but the agent's, read-only root, no network), reached
// as the library reaches it: through `agent -connect` exec'd by the
// engine, one exec per session. What only a container shows: sessions
// come only from exec'd processes (not from a command, even root's); a
// session whose library process is killed takes its commands with it; a
// capture freezes the sandbox without stopping any session's relay; the
// lease's end ends the container.
func TestLeasedContainer(t *testing.T) {
	if os.Getenv("AGENTSANDBOX_BACKEND") == "podman-rootless" {
		t.Skip("not applicable on rootless Podman: the relay's user and the proofs it checks are those of a rootful engine (its 65536 IDs map neither)")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("no docker command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img, err := images.Ensure(ctx, images.Busybox, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	openDirs(t, filepath.Join(bin, "x"))
	for _, b := range [][2]string{{"agent", "."}, {"dial", "./testdata/sessiondial"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(bin, b[0]), b[1])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	name := "agentsandbox-agent-test-" + hex.EncodeToString(rnd[:])
	const lease = 4 * time.Second
	// Removed whatever happens: a run that fails to start leaves it made.
	t.Cleanup(func() {
		out, err := exec.Command("docker", "rm", "-f", name).CombinedOutput()
		if err != nil && !strings.Contains(strings.ToLower(string(out)), "no such container") {
			t.Errorf("docker rm -f %s: %v\n%s", name, err, out)
		}
	})
	docker(t, ctx, "run", "-d", "--name", name, "--network", "none", "--user", "0:0",
		"--cap-drop", "ALL", "--cap-add", "KILL", "--cap-add", "SETUID", "--cap-add", "SETGID",
		"--cap-add", "SETPCAP", "--cap-add", "CHOWN", "--security-opt", "no-new-privileges:true",
		// Podman asks for defaults (files 1048576, processes) above what its
		// service may set here; the library sets its own (docker.podmanUlimits).
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=16384:16384",
		"--read-only", "--tmpfs", "/workspace:mode=0755", "--tmpfs", "/tmp:mode=1777",
		"-v", bin+":/agentbin:ro", "--entrypoint", "/agentbin/agent", img,
		"-lease="+lease.String(), "-user=1000:1000", "-listen=/dev/agentsandbox.sock")

	a, g, _ := containerSession(t, ctx, name)
	if g.Lease != lease || g.PID != 1 || g.UID != 1000 {
		t.Fatalf("greeting %+v", g)
	}
	b, _, _ := containerSession(t, ctx, name)
	c, _, cKill := containerSession(t, ctx, name)
	renewing := make(chan struct{})
	renewed := make(chan error, 1)
	go func() {
		defer close(renewed)
		for {
			if _, err := a.Lease(ctx, true); err != nil {
				renewed <- err
				return
			}
			select {
			case <-renewing:
				return
			case <-time.After(lease / 8):
			}
		}
	}()
	run := func(s *agentconn.Conn, user string, args ...string) string {
		t.Helper()
		p, err := s.Exec(ctx, wire.ExecRequest{Args: args, Dir: "/workspace", User: user})
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		defer p.Close()
		go io.Copy(io.Discard, p.Stderr)
		out, _ := io.ReadAll(p.Stdout)
		if e, err := p.Wait(ctx); err != nil || e.Code != 0 {
			t.Fatalf("%q: %+v, %v (%q)", args, e, err, out)
		}
		return strings.TrimSpace(string(out))
	}

	// A command gets no session: not as root (which may open the socket),
	// nor as the sandbox user (who may not).
	relay := strconv.FormatUint(uint64(relayID), 10)
	if got := run(b, "0:0", "/agentbin/dial", "/dev/agentsandbox.sock", relay); !strings.HasPrefix(got, "(no proof: ") ||
		!strings.Contains(got, "operation not permitted") || !strings.HasSuffix(got, ") closed") {
		t.Errorf("a root command connecting to the agent: %s; want no proof, closed", got)
	}
	if got := run(b, "1000:1000", "/agentbin/dial", "/dev/agentsandbox.sock", relay); !strings.Contains(got, "permission denied") {
		t.Errorf("the sandbox user connecting to the agent: %s; want permission denied", got)
	}
	// The relay's user is no command's.
	if p, err := b.Exec(ctx, wire.ExecRequest{Args: []string{"true"}, User: relay}); err == nil || !strings.Contains(err.Error(), "relay") {
		if p != nil {
			p.Close()
		}
		t.Errorf("a command as the relay's user: %v", err)
	}

	// C's library process dies: C's command goes, B's stays.
	cSleep := run(c, "1000:1000", "sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!")
	bSleep := run(b, "1000:1000", "sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!")
	cKill()
	<-c.Done()
	run(b, "1000:1000", "timeout", "30", "sh", "-c", "while kill -0 "+cSleep+" 2>/dev/null; do usleep 20000; done")
	run(b, "1000:1000", "kill", "-0", bSleep)

	// A capture from A (8 MiB: more than a window, so the agent waits for
	// A to read on while the sandbox is frozen): B's and A's relays run
	// throughout.
	run(a, "1000:1000", "sh", "-c", "head -c 8388608 /dev/urandom > /workspace/big")
	op, err := a.File(ctx, wire.FileRequest{Op: wire.Capture, Path: []byte("/workspace"), Uid: 1000, Gid: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(op, make([]byte, 64<<10)); err != nil {
		t.Fatalf("capture's first bytes: %v", err)
	}
	pingCtx, pingCancel := context.WithTimeout(ctx, 10*time.Second)
	if err := b.Ping(pingCtx); err != nil {
		t.Errorf("B during A's capture: %v", err)
	}
	if err := a.Ping(pingCtx); err != nil {
		t.Errorf("A during its capture: %v", err)
	}
	pingCancel()
	n, err := io.Copy(io.Discard, op)
	res, rerr := op.Result()
	if n += 64 << 10; err != nil || rerr != nil || res.Err != nil || n < 8<<20 {
		t.Fatalf("capture: %d bytes, %v, %+v, %v", n, err, res.Err, rerr)
	}
	op.Close()
	run(b, "1000:1000", "kill", "-0", bSleep) // thawed

	// No more renewals: the lease ends the container.
	close(renewing)
	if err := <-renewed; err != nil {
		t.Fatalf("renewals: %v", err)
	}
	if code := strings.TrimSpace(docker(t, ctx, "wait", name)); code != "0" {
		t.Errorf("the container's exit code %s", code)
	}
	logs := docker(t, ctx, "logs", name)
	if want := "agent: lease ended: no renewal for " + lease.String(); !strings.Contains(logs, want) {
		t.Errorf("logs %q, want %q", logs, want)
	}
	<-a.Done()
	<-b.Done()
}

// docker runs the docker command and returns its output (stdout and
// stderr).
func docker(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// containerSession opens a session through `docker exec -i name agent
// -connect`, and returns it, its greeting, and a function that kills the
// docker command (the library's process dying).
func containerSession(t *testing.T, ctx context.Context, name string) (*agentconn.Conn, wire.Greeting, func()) {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "docker", "exec", "-i", name, "/agentbin/agent", "-connect=/dev/agentsandbox.sock")
	cmd.Stdin = inR
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	c := agentconn.Start(fileStream{inW}, out, 30*time.Second)
	t.Cleanup(func() {
		inW.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	g, err := c.Ready(ctx)
	if err != nil {
		t.Fatalf("session through docker exec: %v", err)
	}
	return c, g, func() { cmd.Process.Kill() }
}
