package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/egress"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// Activity is what one command did inside the sandbox, as the sandbox's
// agent saw it from inside: every program it ran, the files it changed
// and the connections it attempted. See the package doc ("The activity record") for how it is
// seen, what it covers and what it does not.
type Activity struct {
	Processes   []ProcessRecord // every program the command ran, in start order
	Files       []FileChange    // created, modified, removed, renamed, in order
	Connections []Connection    // attempted, in order
	Dropped     int             // events over the bound, counted but not kept
}

// ProcessRecord is one program a command ran: each exec is a record (an
// exec in the same process is a new one; a fork that never execs is
// none).
type ProcessRecord struct {
	PID, PPID  int      // in the sandbox's PID namespace
	Args       []string // argv: at most 64 arguments of at most 512 bytes each
	Path       string   // the program as the exec asked for it
	UID        int
	Start, End time.Time // End is zero while it runs on, and for a program replaced by a later exec in the same process
	ExitCode   int       // -1 when ended by a signal
	Signal     string    // e.g. "SIGKILL"; empty when it exited (or the signal was not seen)
	CPU        time.Duration
	MaxRSS     int64 // bytes
}

// FileChange is one change a command made to a file (or directory, or
// link) by name, recorded as the change began: a file opened for writing
// counts as modified, whether or not a byte was then written.
type FileChange struct {
	Path    string      // absolute, in the sandbox; for a rename the new path
	From    string      // a rename's old path; a hard link's existing file; a symbolic link's target, as given
	Op      string      // "create", "modify", "remove", "rename"
	Size    int64       // at the event: before the change (0 for a create)
	Mode    fs.FileMode // at the event (a create: the mode asked, less the umask)
	PID     int         // the process that made it
	Time    time.Time
	Refused bool // the kernel refuses it: a read-only place (outside the writable ones) or no permission
}

// Connection is one connection a command attempted. Through the egress
// proxy it is what the program asked the proxy for — a CONNECT tunnel or
// an HTTP request, several on one kept-alive connection — with the
// proxy's decision; a connection to the proxy that asked nothing, or
// whose process the agent could not tell, is the connection to the
// proxy itself (its address, Allowed true).
type Connection struct {
	Host    string // name or address as asked
	Port    int
	Allowed bool   // the sandbox's policy lets it through (whether a peer answered is not recorded; through the proxy, an upstream that could not be reached is not allowed)
	Via     string // "proxy" (the sandbox's egress proxy) or "direct"
	Reason  string // through the proxy: why it refused (as the sandbox.network audit record says); empty otherwise
	PID     int    // the process that connected
	Time    time.Time
	// Through the proxy, the bytes of the request or tunnel as far as
	// they had gone when the command's record was made: BytesOut from
	// the program toward the host, BytesIn to the program (for an HTTP
	// request, the bodies only). A connection still open then goes on
	// counting in the sandbox.network audit record, which has its total.
	BytesIn, BytesOut int64
}

// WithActivity turns the activity record of every command on or off.
// It is off by default for now (its cost is over its goal, and a hang of
// a command's start under load is not explained yet: see the package
// doc). Off, the agent starts no monitor (its two threads would count
// against Limits.PIDs; on, PIDs must be at least 24), commands start
// without it in their way, and Result.Activity and Cmd.Activity are nil.
func WithActivity(on bool) Option {
	return func(c *config) error {
		c.activity = on
		return nil
	}
}

// WithActivityLimit sets the bound of each command's activity record:
// at most events events of every kind together (default 10,000; at most
// 1,048,576). Events over it are counted in Activity.Dropped, not kept,
// and the audit log says how many (a "dropped" sandbox.activity record).
func WithActivityLimit(events int) Option {
	return func(c *config) error {
		if events <= 0 || events > maxActivityLimit {
			return fmt.Errorf("sandbox: WithActivityLimit(%d): want 1 to %d events", events, maxActivityLimit)
		}
		c.activityMax = events
		return nil
	}
}

// maxActivityLimit is the largest bound WithActivityLimit takes (the
// agent's own).
const maxActivityLimit = 1 << 20

// Activity returns what the command did, after Wait; nil when the record
// is off (WithActivity, the default for now), the backend cannot keep one (gVisor: see the
// package doc), or the command did not end.
func (c *Cmd) Activity() *Activity { return c.activity }

// activityOf turns the agent's events for command cmd into its Activity,
// with the egress proxy's decisions on its connections. The exit of a
// process is matched to its last exec; the command's own process, whose
// end the agent reports in exit, ends at end.
func (s *Sandbox) activityOf(cmd string, acts []wire.Act, exit wire.Exit, pid int, end time.Time) *Activity {
	if exit.NoActivity {
		return nil
	}
	a := &Activity{Dropped: exit.Dropped}
	viaProxy := s.proxied.take(cmd)
	last := map[int]int{} // PID → index of its last record
	for _, ev := range acts {
		t := time.Unix(0, ev.Time)
		switch ev.Kind {
		case "exec":
			if i, ok := last[ev.PID]; ok && a.Processes[i].End.IsZero() {
				a.Processes[i].End = t // replaced by this exec; its status is the next record's
			}
			last[ev.PID] = len(a.Processes)
			a.Processes = append(a.Processes, ProcessRecord{
				PID: ev.PID, PPID: ev.PPID, Args: ev.Args, Path: ev.Path, UID: ev.UID, Start: t,
			})
		case "exit":
			if i, ok := last[ev.PID]; ok {
				p := &a.Processes[i]
				p.End, p.ExitCode, p.Signal = t, ev.Code, ev.Signal
				p.CPU, p.MaxRSS = time.Duration(ev.CPUNS), ev.MaxRSS
				delete(last, ev.PID)
			}
		case "connect":
			c := s.connection(ev)
			if c.Via == "proxy" {
				if d := viaProxy.next(ev.PID); d != nil {
					a.Connections = append(a.Connections, d...)
					continue
				}
			}
			a.Connections = append(a.Connections, c)
		case "file":
			a.Files = append(a.Files, fileChange(ev))
		}
	}
	// Decisions on connections whose connect the record did not keep
	// (over its bound) are not kept either.
	a.Dropped += viaProxy.left()
	if i, ok := last[pid]; ok && a.Processes[i].End.IsZero() {
		p := &a.Processes[i]
		p.End, p.ExitCode = end, exit.Code
		if exit.Signal != 0 {
			p.ExitCode, p.Signal = -1, signalName(exit.Signal)
		}
		p.CPU, p.MaxRSS = time.Duration(exit.UserNS+exit.SystemNS), exit.MaxRSS
	}
	return a
}

// fileChange turns a file event into a FileChange.
func fileChange(ev wire.Act) FileChange {
	return FileChange{
		Path: ev.Path, From: ev.From, Op: ev.Op, Size: ev.Size, Mode: fs.FileMode(ev.Mode),
		PID: ev.PID, Time: time.Unix(0, ev.Time), Refused: ev.Refused,
	}
}

// connection classifies a connect the agent saw.
func (s *Sandbox) connection(ev wire.Act) Connection {
	c := Connection{Host: ev.Addr, Port: ev.Port, Via: "direct", PID: ev.PID, Time: time.Unix(0, ev.Time)}
	addr, err := netip.ParseAddr(ev.Addr)
	switch {
	case err == nil && addr.Unmap().IsLoopback():
		// The sandbox's own loopback: its services, and the relay to the
		// egress proxy, which decides about the destination (the
		// sandbox.network audit record says what it decided).
		c.Allowed = true
		if s.proxy != nil && ev.Port == s.proxy.relayPort {
			c.Via = "proxy"
		}
	default:
		c.Allowed = s.cfg.network.Open
	}
	return c
}

// signalName names signal n ("SIGKILL").
func signalName(n int) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
		syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
		syscall.SIGSEGV: "SIGSEGV", syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
		syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
	}
	if s, ok := names[syscall.Signal(n)]; ok {
		return s
	}
	return "signal " + syscall.Signal(n).String()
}

// logLive writes the command's activity events to the audit log as they
// arrive (the agent sends them as they happen), one sandbox.activity
// record each, until Wait has the command's exit; then what is left.
func (c *Cmd) logLive() {
	defer close(c.liveDone)
	n := 0
	for {
		end := false
		select {
		case <-c.proc.ActivityIn():
		case <-c.killed:
			end = true
		}
		acts := c.proc.ActivityFrom(n)
		n += len(acts)
		for _, ev := range acts {
			c.logAct(ev)
		}
		if end {
			return
		}
	}
}

// logAct writes one activity event to the audit log: a sandbox.activity
// record of kind "exec", "exit" or "connect" (a refused connection at
// level Warn).
func (c *Cmd) logAct(ev wire.Act) {
	s := c.sb
	level := slog.LevelInfo
	attrs := []slog.Attr{slog.String("sandbox", s.id), slog.String("command", c.ID()), slog.String("kind", ev.Kind),
		slog.Time("at", time.Unix(0, ev.Time)), slog.Int("pid", ev.PID)}
	switch ev.Kind {
	case "exec":
		attrs = append(attrs, slog.Int("ppid", ev.PPID), slog.Int("uid", ev.UID), slog.String("path", ev.Path), slog.Any("args", ev.Args))
	case "exit":
		attrs = append(attrs, slog.Int("exit_code", ev.Code), slog.String("signal", ev.Signal),
			slog.Duration("cpu", time.Duration(ev.CPUNS)), slog.Int64("max_rss", ev.MaxRSS))
	case "connect":
		n := s.connection(ev)
		if !n.Allowed {
			level = slog.LevelWarn
		}
		attrs = append(attrs, slog.String("host", n.Host), slog.Int("port", n.Port), slog.Bool("allowed", n.Allowed), slog.String("via", n.Via))
	case "file":
		f := fileChange(ev)
		if f.Refused {
			level = slog.LevelWarn
		}
		attrs = append(attrs, slog.String("op", f.Op), slog.String("path", f.Path), slog.Int64("size", f.Size),
			slog.String("mode", f.Mode.String()), slog.Bool("refused", f.Refused))
		if f.From != "" {
			attrs = append(attrs, slog.String("from", f.From))
		}
	}
	s.log.LogAttrs(c.ctx, level, "sandbox.activity", attrs...)
}

// logDropped says, after the command's sandbox.exec record, how many
// events its record dropped, if any.
func (c *Cmd) logDropped(a *Activity) {
	if a == nil || a.Dropped == 0 {
		return
	}
	s := c.sb
	s.log.LogAttrs(c.ctx, slog.LevelWarn, "sandbox.activity", slog.String("sandbox", s.id), slog.String("command", c.ID()),
		slog.String("kind", "dropped"), slog.Int("dropped", a.Dropped))
}

// proxied holds the egress proxy's decisions on connections the agent
// traced to a command (agentconn.Origin), by command ID, until the
// command's record takes them. It is bounded: at most maxProxiedCmds
// commands (a command whose record is never taken, its Wait never
// called, is forgotten first) and maxActivityLimit decisions each.
type proxied struct {
	mu    sync.Mutex
	m     map[string][]proxiedDecision
	order []string // the commands of m, oldest first
}

// proxiedDecision is one decision, on connection conn of process pid,
// and the bytes of its request or tunnel so far.
type proxiedDecision struct {
	pid     int
	conn    net.Conn
	c       Connection
	traffic *egress.Traffic
}

const maxProxiedCmds = 256

// add keeps d for command cmd.
func (p *proxied) add(cmd string, d proxiedDecision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string][]proxiedDecision{}
	}
	ds, ok := p.m[cmd]
	if !ok {
		if len(p.order) >= maxProxiedCmds {
			delete(p.m, p.order[0])
			p.order = slices.Delete(p.order, 0, 1)
		}
		p.order = append(p.order, cmd)
	}
	if len(ds) < maxActivityLimit {
		p.m[cmd] = append(ds, d)
	}
}

// take returns the decisions kept for cmd, by process and connection,
// and forgets them.
func (p *proxied) take(cmd string) proxiedConns {
	p.mu.Lock()
	ds := p.m[cmd]
	if ds != nil {
		delete(p.m, cmd)
		p.order = slices.DeleteFunc(p.order, func(c string) bool { return c == cmd })
	}
	p.mu.Unlock()
	pc := proxiedConns{}
	for i, d := range ds {
		conns := pc[d.pid]
		j := slices.IndexFunc(conns, func(c []proxiedDecision) bool { return c[0].conn == d.conn })
		if j < 0 {
			pc[d.pid] = append(conns, ds[i:i+1:i+1])
			continue
		}
		conns[j] = append(conns[j], d)
	}
	return pc
}

// proxiedConns are a command's decisions by process, then by connection
// in the order of their first decision.
type proxiedConns map[int][][]proxiedDecision

// next returns the decisions on process pid's next connection to the
// proxy as Connections; nil if there is none.
func (pc proxiedConns) next(pid int) []Connection {
	conns := pc[pid]
	if len(conns) == 0 {
		return nil
	}
	pc[pid] = conns[1:]
	out := make([]Connection, len(conns[0]))
	for i, d := range conns[0] {
		out[i] = d.c
		if d.traffic != nil {
			out[i].BytesIn, out[i].BytesOut = d.traffic.Down.Load(), d.traffic.Up.Load()
		}
	}
	return out
}

// left counts the decisions next did not return.
func (pc proxiedConns) left() int {
	n := 0
	for _, conns := range pc {
		for _, c := range conns {
			n += len(c)
		}
	}
	return n
}

// proxyDecided receives each decision of the egress proxy as it is made
// (with the activity record on): one on a connection the agent traced to
// a command is kept for that command's record, and written to the audit
// log at once as a sandbox.activity record of kind "connect" (a refusal
// at level Warn), for a handler that stops the command at the first one.
func (s *Sandbox) proxyDecided(d egress.Decision) {
	pid, cmd := agentconn.Origin(d.Conn)
	if cmd == "" {
		return
	}
	now := time.Now()
	c := Connection{Host: d.Host, Port: d.Port, Allowed: d.Allowed, Via: "proxy", Reason: d.Reason, PID: pid, Time: now}
	s.proxied.add(cmd, proxiedDecision{pid: pid, conn: d.Conn, c: c, traffic: d.Traffic})
	level := slog.LevelInfo
	attrs := []slog.Attr{slog.String("sandbox", s.id), slog.String("command", cmd), slog.String("kind", "connect"),
		slog.Time("at", now), slog.Int("pid", pid), slog.String("host", c.Host), slog.Int("port", c.Port),
		slog.Bool("allowed", c.Allowed), slog.String("via", c.Via), slog.String("method", d.Method)}
	if !c.Allowed {
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("reason", c.Reason))
	}
	s.log.LogAttrs(context.Background(), level, "sandbox.activity", attrs...)
}
