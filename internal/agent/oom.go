//go:build linux

package main

import (
	"os"
	"strconv"
	"strings"
)

// The kernel's OOM killer, when the sandbox runs out of memory, ends the
// process with the highest badness: its memory plus oom_score_adj
// thousandths of the limit. Memory no process owns (files in a tmpfs)
// would otherwise make the agent, a Go program of some megabytes, the
// largest process and the victim, and the sandbox would die with it.
//
// So every command starts at commandOOMAdj, and the agent stays at the
// lowest value it may take. A process inherits its value at fork, so the
// agent raises its own just before it forks a command and lowers it again
// just after (raising needs no privilege, nor does lowering down to the
// floor the process was started with). The floor is the catch: a command
// inherits the agent's, and may lower itself to it again. Only a write
// with CAP_SYS_RESOURCE moves a floor (the agent tries agentOOMAdj, which
// needs it); without it, which is the usual case, a command that lowers
// itself on purpose competes with the agent by size. While a command is
// being started the agent holds the command's value: from the fork until
// ForkExec returns (microseconds, longer on a loaded host); the command may
// already run by then, and reads the agent's raised value if it looks.
const (
	agentOOMAdj   = -999 // not -1000: with no command alive, the agent is the last resort rather than none
	commandOOMAdj = 1000
)

// oomScore sets the agent's oom_score_adj.
type oomScore struct {
	f   *os.File
	low string // the agent's own value
}

// newOOMScore lowers the agent's oom_score_adj as far as it may:
// agentOOMAdj, or else the value it was started with.
func newOOMScore() *oomScore {
	cur, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return &oomScore{}
	}
	f, err := os.OpenFile("/proc/self/oom_score_adj", os.O_WRONLY, 0)
	if err != nil {
		return &oomScore{}
	}
	o := &oomScore{f: f, low: strconv.Itoa(agentOOMAdj)}
	if o.write(o.low) != nil {
		o.low = strings.TrimSpace(string(cur))
	}
	return o
}

func (o *oomScore) write(v string) error {
	_, err := o.f.WriteAt([]byte(v), 0)
	return err
}

// forking runs fork with the agent's oom_score_adj raised to what the
// forked command must start with, then lowers it again.
func (o *oomScore) forking(fork func()) {
	if o.f == nil {
		fork()
		return
	}
	o.write(strconv.Itoa(commandOOMAdj))
	defer o.write(o.low)
	fork()
}
