//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// reaperEnv, set, makes TestReaperFirstPass run its case: in a process of
// its own, since a reaper collects every child of its process.
const reaperEnv = "AGENT_TEST_REAPER"

// TestReaperFirstPass: a command that ended before the reaper asked for
// SIGCHLD (its signal dropped: Go relays only the signals asked for) is
// reaped and reported all the same. Before the fix, a command started by
// the first frame and ended at once could beat the reaper's goroutine to
// it, and its Exec waited until ExecTimeout (CI: TestSandboxAuditLog).
func TestReaperFirstPass(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: a command's groups name its tag (setgroups needs CAP_SETGID), as they do under the agent, which is root")
	}
	if os.Getenv(reaperEnv) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestReaperFirstPass$", "-test.v")
		cmd.Env = append(os.Environ(), reaperEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestReaperFirstPass")) {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	a := newAgent(newBatcher(outW), startWorkers(1), &oomScore{})
	go a.serve(inR)
	req, _ := json.Marshal(wire.ExecRequest{Args: []string{sh, "-c", "exit 7"}, Dir: "/", User: uidSpec()})
	if err := wire.NewWriter(inW).Write(wire.Exec, 1, req); err != nil {
		t.Fatal(err)
	}
	frames := make(chan wire.Frame, 16)
	go func() {
		for {
			f, err := wire.ReadFrame(outR)
			if err != nil {
				close(frames)
				return
			}
			frames <- f
		}
	}()
	next := func(kind wire.Kind) wire.Frame {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case f, ok := <-frames:
				if !ok {
					t.Fatalf("the agent's stream ended before a %v frame", kind)
				}
				if f.Kind == kind {
					return f
				}
				if f.Kind == wire.Failed {
					t.Fatalf("the exec failed: %s", f.Data)
				}
			case <-timeout:
				t.Fatalf("no %v frame in 30s", kind)
			}
		}
	}
	var st wire.Start
	json.Unmarshal(next(wire.Started).Data, &st)
	// The command has ended (a zombie) and its SIGCHLD is gone.
	poll.Eventually(t, 30*time.Second, func() (bool, string) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/stat")
		if err != nil {
			return false, err.Error()
		}
		i := bytes.LastIndexByte(b, ')')
		return i > 0 && len(b) > i+2 && b[i+2] == 'Z', "state " + string(b[i+2:i+3])
	})
	a.startReaper()
	var e wire.Exit
	json.Unmarshal(next(wire.Exited).Data, &e)
	if e.Code != 7 {
		t.Fatalf("exit %+v, want code 7", e)
	}
}
