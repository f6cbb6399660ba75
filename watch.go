package sandbox

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// WatchEvent is a change in a directory a Watch covers.
type WatchEvent struct {
	// Path is the absolute path, in the sandbox, of what changed; for a
	// rename, the new path; for an overflow, the directory concerned
	// (or the watched directory).
	Path string
	// Op is what happened: "create" (a file or directory made, or moved
	// in from outside the watch), "modify" (a file's contents written),
	// "remove" (removed, or moved out of the watch), "rename" (moved
	// within the watch: From is the old path) or "overflow" (events were
	// lost here: see Watch).
	Op string
	// From is a rename's old path; empty for other events.
	From string
}

// Ops of a WatchEvent.
const (
	WatchCreate   = "create"
	WatchModify   = "modify"
	WatchRemove   = "remove"
	WatchRename   = "rename"
	WatchOverflow = "overflow"
)

// MaxWatchQueue is how many events a Watch holds that its reader has not
// taken: beyond them, events are dropped and one "overflow" event stands
// where they were lost.
const MaxWatchQueue = 4096

var watchOps = [...]string{
	wire.WatchCreate: WatchCreate, wire.WatchModify: WatchModify, wire.WatchRemove: WatchRemove,
	wire.WatchRename: WatchRename, wire.WatchOverflow: WatchOverflow,
}

// Watch reports the changes in the named directory (relative to the
// working directory, "." being the working directory itself), and with
// recursive in every directory below it, including directories made or
// moved in after the watch began. Events come in the order they happened,
// with absolute paths; a directory made after the watch began is
// reported with the entries it already held once it was watched (which
// may repeat one or two of its own events, in a race).
//
// The kernel merges an event into the one before it when they are the
// same (two writes to a file in a row, the first not yet read): a
// "modify" may stand for several writes.
//
// The channel holds at most MaxWatchQueue events its reader has not
// taken (and 8 MiB of their paths); beyond them events are dropped, and one event with Op
// "overflow" stands where they were lost (so does one for events the
// kernel's queue lost while the library was not reading, and one naming
// each directory the watch does not cover: beyond 8,192 directories a
// watch, beyond the kernel's fs.inotify.max_user_watches, or deeper than
// 4,096 bytes of path). The channel closes when ctx ends, the sandbox
// closes or dies, or the directory is removed (after an event "remove"
// for it); nothing of the watch is left running then. At most 8 watches
// run in a sandbox at once (syscall.EMFILE beyond).
//
// The agent watches with inotify, as the sandbox user: a directory the
// user cannot read is not watched. It never follows a symbolic link: a
// link in name is refused (syscall.ELOOP or syscall.ENOTDIR), and a link
// in the tree, even to a directory, is an entry like a file, so a link
// planted to / or /proc never makes it watch or report outside the tree.
// /proc and /sys are refused (syscall.EACCES) and never entered.
//
// Not seen: a change made through a hard link outside the watched tree to
// a file inside it, through a bind mount of the tree elsewhere, or by
// memory-mapped writes; changes to metadata alone (chmod, touch without
// writing); a watched directory replaced by another of the same name is
// watched anew only if recursive (as a removal and a creation). The
// watched directory itself renamed goes on being watched under its old
// name.
func (s *Sandbox) Watch(ctx context.Context, dir string, recursive bool) (<-chan WatchEvent, error) {
	p := s.abs(dir)
	ch, err := s.watch(ctx, p, recursive)
	s.log.LogAttrs(ctx, slog.LevelInfo, "sandbox.file.watch", slog.String("sandbox", s.id),
		slog.String("path", p), slog.Bool("recursive", recursive), errAttr(err))
	if err != nil {
		return nil, &fs.PathError{Op: "watch", Path: dir, Err: err}
	}
	return ch, nil
}

func (s *Sandbox) watch(ctx context.Context, p string, recursive bool) (<-chan WatchEvent, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	req := wire.WatchRequest{Path: []byte(p), Recursive: recursive, Uid: uint32(s.uid), Gid: uint32(s.gid)}
	ch, err := agentconn.Watch(s.agent, ctx, req, MaxWatchQueue, p, func(r agentconn.WatchRecord) WatchEvent {
		return WatchEvent{Path: r.Path, Op: watchOps[r.Op], From: r.From}
	})
	if err != nil {
		return nil, s.fileConnErr("watch", err)
	}
	return ch, nil
}
