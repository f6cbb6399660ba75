package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// activity: every program a command runs is a record with its arguments,
// parent and status — 50 short children, a program that exits 3, one
// killed by a signal, an exec in the same process — in start order; with
// WithActivity(false), or by default for now, there is none.
func (c conformance) activity(t *testing.T) {
	sb := c.new(t, sandbox.WithActivity(true))
	ctx := ctxFor(t)
	script := `i=0; while [ $i -lt 50 ]; do i=$((i+1)); /bin/true "arg $i"; done; /bin/sh -c 'exit 3'; /bin/sh -c 'kill -9 $$'; exec /bin/echo done`
	r, err := sb.Exec(ctx, script)
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode != 0 || r.Stdout != "done\n" {
		t.Fatalf("script: %+v", r)
	}
	a := r.Activity
	if a == nil {
		t.Fatal("Result.Activity is nil")
	}
	ps := a.Processes
	var lines []string
	for _, p := range ps {
		lines = append(lines, fmt.Sprintf("%d<%d %q exit %d %s", p.PID, p.PPID, p.Args, p.ExitCode, p.Signal))
	}
	if len(ps) != 54 || a.Dropped != 0 {
		t.Fatalf("%d records (dropped %d), want 54: the script, 50 × true, 2 × sh, echo:\n%s", len(ps), a.Dropped, strings.Join(lines, "\n"))
	}
	sh := ps[0]
	if strings.Join(sh.Args, "\x00") != strings.Join([]string{"/bin/sh", "-c", script}, "\x00") || sh.Start.IsZero() {
		t.Errorf("the command's own record: %+v", sh)
	}
	for i := 1; i <= 50; i++ {
		p := ps[i]
		if len(p.Args) != 2 || p.Args[0] != "/bin/true" || p.Args[1] != fmt.Sprintf("arg %d", i) || p.PPID != sh.PID {
			t.Errorf("record %d: %s", i, lines[i])
		}
		if p.ExitCode != 0 || p.Signal != "" || p.End.IsZero() || p.End.Before(p.Start) {
			t.Errorf("end of record %d: %+v", i, p)
		}
	}
	if p := ps[51]; p.ExitCode != 3 || p.End.IsZero() {
		t.Errorf("sh -c 'exit 3': %+v", p)
	}
	if p := ps[52]; p.ExitCode != -1 || (p.Signal != "SIGKILL" && p.Signal != "") {
		t.Errorf("sh -c 'kill -9 $$': %+v", p)
	}
	if p := ps[53]; p.PID != sh.PID || p.Args[0] != "/bin/echo" || p.ExitCode != 0 || p.End.IsZero() {
		t.Errorf("exec in the command's own process: %+v", p)
	}
	if !sh.End.Equal(ps[53].Start) {
		t.Errorf("the script's record ends at %v, its exec at %v", sh.End, ps[53].Start)
	}

	// Cmd.Activity says the same.
	cmd := sb.Command(ctx, "/bin/sh", "-c", "/bin/true x")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if a := cmd.Activity(); a == nil || len(a.Processes) != 2 || a.Processes[1].Args[1] != "x" {
		t.Errorf("Cmd.Activity: %+v", a)
	}

	for _, o := range [][]sandbox.Option{{sandbox.WithActivity(false)}, nil} {
		off := c.new(t, o...)
		if r, err := off.Exec(ctx, "/bin/true"); err != nil || r.Activity != nil {
			t.Errorf("WithActivity(false) or the default: %+v, %v", r, err)
		}
	}
}

// activityFiles: the files a command changes are recorded in order, one
// event each (a file created, appended to and renamed gives three), in
// the working directory, /tmp and /dev/shm, with the old name of a
// rename and the target of a symbolic link; a change the read-only root
// refuses is recorded as refused (also through a planted link to it);
// reads, /dev/null and a create in a missing directory (it fails) are not
// recorded.
func (c conformance) activityFiles(t *testing.T) {
	sb := c.new(t, sandbox.WithActivity(true))
	ctx := ctxFor(t)
	r, err := sb.Exec(ctx, `umask 022; pwd; echo a > f; echo bc >> f; cat f >/dev/null; mv f g; mkdir d; ln -s ../g d/l; rm -r d
echo t > /tmp/t; echo s > /dev/shm/s; rm g /tmp/t /dev/shm/s
(echo x > /etc/x) 2>/dev/null; (: >> /bin/sh) 2>/dev/null; (echo y > /nodir/y) 2>/dev/null
ln -s /etc/planted l; (echo z > l) 2>/dev/null; rm l; exit 0`)
	if err != nil {
		t.Fatal(err)
	}
	w := strings.TrimSuffix(r.Stdout, "\n")
	if r.ExitCode != 0 || !strings.HasPrefix(w, "/") || r.Activity == nil {
		t.Fatalf("script: %+v", r)
	}
	var got []string
	for _, f := range r.Activity.Files {
		s := fmt.Sprintf("%s %s %d %v", f.Op, f.Path, f.Size, f.Mode)
		if f.From != "" {
			s += " from " + f.From
		}
		if f.Refused {
			s += " refused"
		}
		got = append(got, s)
	}
	want := []string{
		"create " + w + "/f 0 -rw-r--r--",
		"modify " + w + "/f 2 -rw-r--r--",
		"rename " + w + "/g 5 -rw-r--r-- from " + w + "/f",
		"create " + w + "/d 0 drwxr-xr-x",
		"create " + w + "/d/l 0 Lrwxrwxrwx from ../g",
		"remove " + w + "/d/l 4 Lrwxrwxrwx",
		"remove " + w + "/d SIZE drwxr-xr-x",
		"create /tmp/t 0 -rw-r--r--",
		"create /dev/shm/s 0 -rw-r--r--",
		"remove " + w + "/g 5 -rw-r--r--",
		"remove /tmp/t 2 -rw-r--r--",
		"remove /dev/shm/s 2 -rw-r--r--",
		"create /etc/x 0 -rw-r--r-- refused",
		"modify /bin/sh SIZE MODE refused", // an append: nothing truncated
		"create " + w + "/l 0 Lrwxrwxrwx from /etc/planted",
		"create " + w + "/l 0 -rw-r--r-- refused", // through the link: in /etc
		"remove " + w + "/l 12 Lrwxrwxrwx",
	}
	// What the image's file systems give: an empty directory's size, and
	// its shell's size and mode.
	for i, g := range got {
		if f := strings.Fields(g); i < len(want) && len(f) > 3 {
			want[i] = strings.Replace(strings.Replace(want[i], "SIZE", f[2], 1), "MODE", f[3], 1)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || r.Activity.Dropped != 0 {
		t.Errorf("files (dropped %d):\n%s\nwant:\n%s", r.Activity.Dropped, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, f := range r.Activity.Files {
		if f.PID == 0 || f.Time.IsZero() {
			t.Errorf("%+v: no PID or time", f)
		}
	}
}

// activityLive: a command's activity events reach the audit log as they
// happen, before its sandbox.exec record, so a handler can stop the
// command at the first one it dislikes: here, the exec of sleep (the
// command would run 30 s more) cancels the command's context, and Exec
// returns context.Canceled with the command killed.
func (c conformance) activityLive(t *testing.T) {
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	h := &liveHandler{stop: func(r slog.Record) bool {
		var kind string
		var args []string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "kind":
				kind = a.Value.String()
			case "args":
				args, _ = a.Value.Any().([]string)
			}
			return true
		})
		return r.Message == "sandbox.activity" && kind == "exec" && len(args) == 2 && args[0] == "sleep" && args[1] == "30"
	}, cancel: cancel}
	sb := c.new(t, sandbox.WithActivity(true), sandbox.WithLogger(slog.New(h)))
	r, err := sb.Exec(ctx, "echo before; sleep 30; echo after")
	if !errors.Is(err, context.Canceled) || r == nil || r.Stdout != "before\n" {
		t.Fatalf("Exec stopped by the audit log's handler: %+v, %v; want context.Canceled after \"before\"", r, err)
	}
	msgs := h.messages()
	stop := slices.Index(msgs, "stop")
	exec := slices.Index(msgs, "sandbox.exec")
	if stop < 0 || exec < stop {
		t.Errorf("records %q: want the handler's stop (at the exec of sleep) before sandbox.exec", msgs)
	}
	// (Whether sleep's end is in it depends on which the agent saw first:
	// the kill's end of the script, which closes the record, or sleep's.)
	if a := r.Activity; a == nil || len(a.Processes) < 2 || a.Processes[1].Args[0] != "sleep" {
		t.Errorf("the record of the stopped command: %+v", a)
	}
}

// liveHandler records the messages it handles, and "stop" once stop
// matches a record, when it calls cancel.
type liveHandler struct {
	stop   func(slog.Record) bool
	cancel func()
	mu     sync.Mutex
	msgs   []string
}

func (h *liveHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *liveHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *liveHandler) WithGroup(string) slog.Handler            { return h }

func (h *liveHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	if !slices.Contains(h.msgs, "stop") && h.stop(r) {
		h.msgs = append(h.msgs, "stop")
		h.cancel()
	}
	return nil
}

func (h *liveHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.msgs)
}

// activityProxy: a request through the egress proxy is recorded as what
// it asked for, with the proxy's decision — an allowed address (a server
// of the test's) with the bytes of its body, a host outside the allow-list refused with the reason —
// and no longer as a connection to the proxy's port; the refusal is a
// live sandbox.activity record at level Warn naming the host.
func (c conformance) activityProxy(t *testing.T) {
	l := upstream(t, nil)
	upPort := l.Addr().(*net.TCPAddr).Port
	h := &liveHandler{stop: func(r slog.Record) bool {
		var kind, host string
		allowed := true
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "kind":
				kind = a.Value.String()
			case "host":
				host = a.Value.String()
			case "allowed":
				allowed = a.Value.Bool()
			}
			return true
		})
		return r.Message == "sandbox.activity" && r.Level == slog.LevelWarn && kind == "connect" && host == "denied.invalid" && !allowed
	}, cancel: func() {}}
	sb := c.new(t, sandbox.WithActivity(true), sandbox.WithNetwork(sandbox.AllowHosts("127.0.0.1/32")), sandbox.WithLogger(slog.New(h)))
	proxied := func(r *sandbox.Result) []string {
		var out []string
		for _, c := range r.Activity.Connections {
			if c.Via == "proxy" {
				out = append(out, fmt.Sprintf("%s:%d %v %q in %d out %d", c.Host, c.Port, c.Allowed, c.Reason, c.BytesIn, c.BytesOut))
			}
		}
		return out
	}
	r, code, body := getResult(t, sb, "http://"+l.Addr().String()+"/", true)
	if code != 200 || body != "upstream" || r.Activity == nil {
		t.Fatalf("an allowed address through the proxy: %d %q, activity %+v", code, body, r.Activity)
	}
	if got, want := proxied(r), fmt.Sprintf("127.0.0.1:%d true \"\" in 8 out 0", upPort); !slices.Equal(got, []string{want}) {
		t.Errorf("the allowed request's connections through the proxy: %q, want [%s]", got, want)
	}
	r, code, _ = getResult(t, sb, "http://denied.invalid/", true)
	if code != 403 || r.Activity == nil {
		t.Fatalf("a host not on the allow-list: %d, activity %+v", code, r.Activity)
	}
	if got, want := proxied(r), `denied.invalid:80 false "host not in the allow-list" in 0 out 0`; !slices.Equal(got, []string{want}) {
		t.Errorf("the refused request's connections through the proxy: %q, want [%s]", got, want)
	}
	if !slices.Contains(h.messages(), "stop") {
		t.Errorf("no sandbox.activity record at Warn for the refused request; records: %q", h.messages())
	}
}
