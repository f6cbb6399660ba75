//go:build linux

package main

import (
	"io"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// cat closes its descriptors, the terminal's last, before it exits: the
// agent must not hang the terminal up (closing its side) until the
// process is reaped, or cat dies of SIGHUP (exit 129) one time in four.
func TestPTYCloseBeforeExit(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	c, _, _ := ta.session(t)
	for _, in := range []string{"one\ntwo", "one\n", ""} {
		for range 20 {
			p := startTTY(t, c, wire.TTY{}, true, "cat")
			w := p.Stdin()
			io.WriteString(w, in)
			w.Close()
			if e := p.wait(t); e.Code != 0 {
				t.Fatalf("cat with input %q: %+v, output %q", in, e, p.output())
			}
		}
	}
}
