package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/agentsandbox/sandbox"
)

// auditLog collects the messages of a sandbox's audit records.
type auditLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *auditLog) Write(p []byte) (int, error) {
	var rec struct{ Msg string }
	for _, line := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		if err := json.Unmarshal(line, &rec); err == nil {
			l.mu.Lock()
			l.msgs = append(l.msgs, rec.Msg)
			l.mu.Unlock()
		}
	}
	return len(p), nil
}

func (l *auditLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.msgs[n:]...)
}

func (l *auditLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.msgs)
}

// TestAuditOneRecordPerCall: every public call on a sandbox leaves exactly
// one audit record, named after it, whether it succeeds or fails, and no
// internal step of the library's shows up as a record of its own.
func TestAuditOneRecordPerCall(t *testing.T) {
	t.Parallel()
	log := &auditLog{}
	sb := newSandbox(t, sandbox.WithLogger(slog.New(slog.NewJSONHandler(log, nil))))
	ctx := testCtx(t)
	host := t.TempDir()
	var sh *sandbox.Interpreter
	defer func() {
		if sh != nil {
			sh.Close()
		}
	}()
	for _, tc := range []struct {
		name, want string
		call       func(context.Context) error
	}{
		{"WriteFile", "sandbox.file.write", func(ctx context.Context) error { return sb.WriteFile(ctx, "f", []byte("x"), 0o644) }},
		{"ReadFile", "sandbox.file.read", func(ctx context.Context) error { _, err := sb.ReadFile(ctx, "f"); return err }},
		{"ReadFile missing", "sandbox.file.read", func(ctx context.Context) error { _, err := sb.ReadFile(ctx, "nope"); return nil2(err) }},
		{"Stat", "sandbox.file.stat", func(ctx context.Context) error { _, err := sb.Stat(ctx, "f"); return err }},
		{"MkdirAll", "sandbox.file.mkdir", func(ctx context.Context) error { return sb.MkdirAll(ctx, "d/e", 0o755) }},
		{"ReadDir", "sandbox.file.readdir", func(ctx context.Context) error { _, err := sb.ReadDir(ctx, "d"); return err }},
		{"Remove", "sandbox.file.remove", func(ctx context.Context) error { return sb.Remove(ctx, "d/e") }},
		{"RemoveAll", "sandbox.file.remove", func(ctx context.Context) error { return sb.RemoveAll(ctx, "d") }},
		{"CopyIn", "sandbox.file.copyin", func(ctx context.Context) error {
			return sb.CopyIn(ctx, "in", fstest.MapFS{"a/b": {Data: []byte("b"), Mode: 0o644}})
		}},
		{"CopyOut", "sandbox.file.copyout", func(ctx context.Context) error { return sb.CopyOut(ctx, "in", host) }},
		{"FS.Open file", "sandbox.file.read", func(ctx context.Context) error {
			f, err := sb.FS(ctx).Open("workspace/f")
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"FS.Open dir", "sandbox.file.stat", func(ctx context.Context) error {
			f, err := sb.FS(ctx).Open("workspace/in")
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"fs.ReadFile", "sandbox.file.read", func(ctx context.Context) error { _, err := fs.ReadFile(sb.FS(ctx), "workspace/f"); return err }},
		{"fs.Stat", "sandbox.file.stat", func(ctx context.Context) error { _, err := fs.Stat(sb.FS(ctx), "workspace/f"); return err }},
		{"fs.ReadDir", "sandbox.file.readdir", func(ctx context.Context) error { _, err := fs.ReadDir(sb.FS(ctx), "workspace"); return err }},
		{"Exec", "sandbox.exec", func(ctx context.Context) error { _, err := sb.Exec(ctx, "true"); return err }},
		{"Cmd.Run", "sandbox.exec", func(ctx context.Context) error { return sb.Command(ctx, "true").Run() }},
		{"Expose", "sandbox.expose", func(ctx context.Context) error { _, err := sb.Expose(ctx, 80); return err }},
		{"Expose out of range", "sandbox.expose", func(ctx context.Context) error { _, err := sb.Expose(ctx, 0); return nil2(err) }},
		{"Interpreter", "sandbox.interpreter.start", func(ctx context.Context) (err error) { sh, err = sb.Interpreter(ctx, "sh"); return err }},
		{"Interpreter.Run", "sandbox.interpreter.run", func(ctx context.Context) error { _, err := sh.Run(ctx, "cd /tmp"); return err }},
		{"Interpreter.Run ending the shell", "sandbox.interpreter.run", func(ctx context.Context) error { _, err := sh.Run(ctx, "exit 2"); return err }},
		{"Interpreter.Run restarting", "sandbox.interpreter.run", func(ctx context.Context) error { _, err := sh.Run(ctx, "true"); return err }},
	} {
		n := log.len()
		if err := tc.call(ctx); err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		// The activity record is off by default: no sandbox.activity.
		got := log.since(n)
		acts := 0
		got = slices.DeleteFunc(got, func(m string) bool {
			if m == "sandbox.activity" {
				acts++
			}
			return m == "sandbox.activity"
		})
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s left records %q, want one %q", tc.name, got, tc.want)
		}
		if acts > 0 {
			t.Errorf("%s left %d sandbox.activity records with the record off", tc.name, acts)
		}
	}
}

// nil2 turns an expected error into success for the table: the record is
// what is checked.
func nil2(err error) error {
	if err == nil {
		return errUnexpectedSuccess
	}
	return nil
}

var errUnexpectedSuccess = fsErr("the call succeeded; an error was expected")

type fsErr string

func (e fsErr) Error() string { return string(e) }
