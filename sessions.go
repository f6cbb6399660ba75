package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// Session is a command of a sandbox as Sessions lists it: one started
// with Cmd (or Exec, or a terminal), by any process that opened the
// sandbox.
type Session struct {
	ID       string   // as Cmd.ID returns it
	Terminal bool     // run on a pseudo-terminal (Cmd.TTY); false: a command
	Args     []string // the program and its arguments (at most 16, each cut to 256 bytes)
	Started  time.Time
	Running  bool
}

// SessionBuffer is how many bytes of each output stream (stdout,
// stderr) a leased sandbox keeps of a command while no process is
// attached to it; older output is dropped, and AttachCommand says how
// much.
const SessionBuffer = wire.RingSize

var (
	// ErrNoSession is returned by AttachCommand for an ID the sandbox
	// does not know (never started, or ended long enough ago to be
	// forgotten: it keeps the 16 most recent that ended), or for a
	// command that cannot be attached (see AttachCommand).
	ErrNoSession = errors.New("sandbox: no such session")
	// ErrTakenOver ends a Cmd whose command another Cmd attached
	// (AttachCommand, from this process or another): Wait returns it, and
	// the command runs on for the new holder.
	ErrTakenOver = errors.New("sandbox: the command was attached elsewhere (AttachCommand)")
)

// Sessions lists the sandbox's commands: those running, and the most
// recent of those that ended (at most 16), newest first. In a leased
// sandbox (WithLease, Open) they are those of every process that opened
// it.
func (s *Sandbox) Sessions(ctx context.Context) ([]Session, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	list, err := s.agent.List(ctx)
	if err != nil {
		if errors.Is(err, agentconn.ErrGone) || errors.Is(err, agentconn.ErrNoAnswer) {
			return nil, s.initErr("sessions", err)
		}
		return nil, fmt.Errorf("sandbox: sessions: %w", err)
	}
	out := make([]Session, 0, len(list))
	for _, l := range list {
		out = append(out, Session{ID: l.ID, Terminal: l.Terminal, Args: l.Args, Started: time.Unix(0, l.Started), Running: l.Running})
	}
	return out, nil
}

// AttachCommand attaches to a command of a leased sandbox by its ID (see
// Sessions, Cmd.ID): the returned Cmd has started; its output first
// replays what the sandbox kept while no process was attached (at most
// SessionBuffer bytes per stream; if older output was dropped, one line on
// stderr first says how many bytes — on stdout for a terminal's command),
// then goes on live, under the same flow control as any command's. Wait
// returns how the command ends (at once for one that ended meanwhile),
// Resize works for a terminal's, and when ctx is done the command is
// killed, as a Cmd's context does (no ExecTimeout is applied anew). The
// command's stdin is left as it is.
//
// In a leased sandbox every command started with Cmd (Exec too) keeps
// running when the process that started it detaches (Detach) or dies,
// and can be attached; attaching a command another Cmd holds takes it
// over: that Cmd's output ends and its Wait returns ErrTakenOver. A
// tethered sandbox's commands end with their process and cannot be
// attached (ErrNoSession); Sessions lists them.
func (s *Sandbox) AttachCommand(ctx context.Context, id string, stdout, stderr io.Writer) (*Cmd, error) {
	return s.attach(ctx, id, nil, stdout, stderr)
}

// attach is AttachCommand with stdin, if not nil, copied to the
// command's stdin (Terminal's reattach uses it; its end is not passed
// on). The Cmd has TTY set (to the zero TTY) for a terminal's command, so
// that Resize works.
func (s *Sandbox) attach(ctx context.Context, id string, stdin io.Reader, stdout, stderr io.Writer) (*Cmd, error) {
	if ctx == nil {
		return nil, errors.New("sandbox: nil Context")
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	sess, err := s.session(ctx, id)
	if err != nil {
		return nil, err
	}
	c := &Cmd{Args: sess.Args, ctx: ctx, sb: s, noTimeout: true, attached: true, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if sess.Terminal {
		c.TTY = &TTY{}
	}
	c.started = true
	cctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	c.start = sess.Started
	p, err := s.agent.Attach(ctx, id, stdin != nil)
	if err != nil {
		cancel()
		if errors.Is(err, agentconn.ErrGone) || errors.Is(err, agentconn.ErrNoAnswer) {
			return nil, s.initErr("attach", err)
		}
		if strings.Contains(err.Error(), "cannot be attached") || strings.Contains(err.Error(), "no command") {
			return nil, fmt.Errorf("%w: %v", ErrNoSession, err)
		}
		return nil, fmt.Errorf("sandbox: attach %s: %w", id, err)
	}
	if r, ok := stdout.(interface{ setReplay(int64) }); ok {
		r.setReplay(p.Replay) // before any output is written
	}
	c.begin(cctx, p, stdin != nil)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.attach", slog.String("sandbox", s.id), slog.String("id", id),
		slog.Any("args", c.Args), slog.Bool("tty", c.TTY != nil))
	return c, nil
}

// session returns the session named id, or ErrNoSession.
func (s *Sandbox) session(ctx context.Context, id string) (*Session, error) {
	list, err := s.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].ID == id {
			return &list[i], nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNoSession, id)
}
