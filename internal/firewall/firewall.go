// Package firewall closes the hole a Docker bridge leaves open: a container
// on any bridge network, even an internal one, can open connections to every
// service the host runs on the bridge's gateway address (or on 0.0.0.0).
// Isolate adds iptables rules on the host's INPUT chain so that packets from
// a sandbox's bridge reach the host only as replies to connections the host
// opened (Expose) or, optionally, on the one port of the sandbox's egress
// proxy. It needs root and the iptables command on the engine's host.
package firewall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

const commentPrefix = "agentsandbox:"

// Supported reports whether rules can be installed here.
var Supported = sync.OnceValue(func() error {
	if os.Geteuid() != 0 {
		return errors.New("network policies need root on the engine's host to install firewall rules (iptables)")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return errors.New("iptables not found: apt-get install iptables")
	}
	return nil
})

var mu sync.Mutex // iptables' own lock (-w) covers other processes

// Rules are the rules installed for one bridge.
type Rules struct {
	specs [][]string
	once  sync.Once
	err   error
}

// Isolate installs the rules for bridge (the host interface, "br-..."),
// allowing new connections only to gateway:port when port > 0. Tag names
// the rules (the network ID) so Prune can find them.
func Isolate(ctx context.Context, bridge, gateway string, port int, tag string) (*Rules, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	c := []string{"-m", "comment", "--comment", commentPrefix + tag}
	// Inserted at the top in reverse order, so they end up as:
	// established → proxy port → drop.
	specs := [][]string{append([]string{"-i", bridge, "-j", "DROP"}, c...)}
	if port > 0 {
		specs = append(specs, append([]string{"-i", bridge, "-p", "tcp", "-d", gateway, "--dport", strconv.Itoa(port), "-j", "ACCEPT"}, c...))
	}
	specs = append(specs, append([]string{"-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"}, c...))
	r := &Rules{}
	for _, s := range specs {
		if err := iptables(ctx, append([]string{"-I", "INPUT", "1"}, s...)...); err != nil {
			r.Remove()
			return nil, err
		}
		r.specs = append(r.specs, s)
	}
	return r, nil
}

// Remove deletes the rules; it is idempotent.
func (r *Rules) Remove() error {
	if r == nil {
		return nil
	}
	r.once.Do(func() {
		var errs []error
		for _, s := range r.specs {
			if err := iptables(context.Background(), append([]string{"-D", "INPUT"}, s...)...); err != nil {
				errs = append(errs, err)
			}
		}
		r.err = errors.Join(errs...)
	})
	return r.err
}

// Prune deletes rules whose tag keep reports false (their network is gone).
func Prune(ctx context.Context, keep func(tag string) bool) (int, error) {
	if Supported() != nil {
		return 0, nil
	}
	out, err := exec.CommandContext(ctx, "iptables", "-w", "-S", "INPUT").Output()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		i := strings.Index(line, commentPrefix)
		if !strings.HasPrefix(line, "-A INPUT ") || i < 0 {
			continue
		}
		tag := strings.Fields(line[i+len(commentPrefix):])[0]
		tag = strings.Trim(tag, `"`)
		if keep(tag) {
			continue
		}
		args := append([]string{"-D", "INPUT"}, splitRule(strings.TrimPrefix(line, "-A INPUT "))...)
		if err := iptables(ctx, args...); err == nil {
			n++
		}
	}
	return n, nil
}

// splitRule splits an iptables -S line, honouring double quotes.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ' ' && !quoted:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

func iptables(ctx context.Context, args ...string) error {
	mu.Lock()
	defer mu.Unlock()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "iptables", append([]string{"-w"}, args...)...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}
