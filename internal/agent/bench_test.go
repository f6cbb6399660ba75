//go:build linux

package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// BenchmarkAgentExec runs the agent in this process (no container: its
// own CPU per command, which a profile of this benchmark breaks down) and
// has it run `sh -c 'echo hi'` as the current user, conc commands at a
// time, speaking the wire protocol over pipes as the library does. The
// floor is the same command started with os/exec.
func BenchmarkAgentExec(b *testing.B) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		b.Skip("no sh")
	}
	b.Run("impl=os-exec", func(b *testing.B) {
		cpu := cpuSelf()
		for b.Loop() {
			if out, err := exec.Command(sh, "-c", "echo hi").Output(); err != nil || string(out) != "hi\n" {
				b.Fatal(out, err)
			}
		}
		b.ReportMetric(float64(cpuSelf()-cpu)/float64(b.N), "cpu-ns/op")
	})
	for _, mon := range []bool{false, true} {
		name := "impl=agent"
		if mon {
			name = "impl=agent-activity"
		}
		b.Run(name, func(b *testing.B) { benchAgentExec(b, sh, mon) })
	}
}

// benchAgentExec is BenchmarkAgentExec's agent, with the activity
// record's monitor or without, on one P as in a sandbox.
func benchAgentExec(b *testing.B, sh string, mon bool) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	{
		inR, inW, _ := os.Pipe()
		outR, outW, _ := os.Pipe()
		a := newAgent(newBatcher(outW), startWorkers(1), newOOMScore())
		if mon {
			m, err := newMonitor(a.acts.add)
			if err != nil {
				b.Skip(err)
			}
			a.mon = m
		}
		defer a.startReaper()() // the next run's agent must have its children to itself
		go a.serve(inR)
		lib := wire.NewWriter(inW)
		var mu sync.Mutex
		done := map[uint32]chan struct{}{}
		go func() {
			for {
				f, err := wire.ReadFrame(outR)
				if err != nil {
					return
				}
				if f.Kind == wire.Exited {
					mu.Lock()
					close(done[f.Channel])
					mu.Unlock()
				}
			}
		}()
		req, _ := json.Marshal(wire.ExecRequest{Args: []string{sh, "-c", "echo hi"}, Dir: "/", User: uidSpec()})
		var ch uint32
		cpu := cpuSelf()
		for b.Loop() {
			ch++
			c := make(chan struct{})
			mu.Lock()
			done[ch] = c
			mu.Unlock()
			lib.Write(wire.Exec, ch, req)
			<-c
		}
		b.ReportMetric(float64(cpuSelf()-cpu)/float64(b.N), "cpu-ns/op")
		// The agent's input ends; its output stays open, drained by the
		// reader above (a batched frame written to a closed pipe would end
		// the process, as it ends the agent when the library is gone).
		inW.Close()
	}
}

func uidSpec() string {
	return strconv.Itoa(syscall.Getuid()) + ":" + strconv.Itoa(syscall.Getgid())
}

// cpuSelf is the CPU time this process has used, not its children's.
func cpuSelf() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
