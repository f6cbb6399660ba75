//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
	"github.com/agentsandbox/sandbox/internal/poll"
	"github.com/agentsandbox/sandbox/internal/wire"
)

func watchOf(t *testing.T, c *agentconn.Conn, ctx context.Context, dir string, recursive bool) (<-chan agentconn.WatchRecord, error) {
	t.Helper()
	return agentconn.Watch(c, ctx, wire.WatchRequest{Path: []byte(dir), Recursive: recursive, Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())},
		1<<20, dir, func(r agentconn.WatchRecord) agentconn.WatchRecord { return r })
}

func nextRecord(t *testing.T, ch <-chan agentconn.WatchRecord) agentconn.WatchRecord {
	t.Helper()
	select {
	case r, ok := <-ch:
		if !ok {
			t.Fatal("the watch ended")
		}
		return r
	case <-time.After(30 * time.Second): // a hang guard
		t.Fatal("no record")
	}
	return agentconn.WatchRecord{}
}

// TestWatchBounds: a tree of more directories than a watch covers is
// watched up to the bound, the rest said by overflow records; a watch's
// session ending lets go of it; hostile requests are refused, and frames
// for a watch's channel that make no sense are ignored.
func TestWatchBounds(t *testing.T) {
	ta := startLeased(t, time.Hour, 0, false)
	c, uc, _ := ta.session(t)
	dir := t.TempDir()
	for i := range wire.MaxWatchDirs + 10 {
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("d%05d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := watchOf(t, c, context.Background(), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "marker"), nil, 0o644)
	over := 0
	for {
		r := nextRecord(t, ch)
		if r.Op == wire.WatchCreate && r.Path == filepath.Join(dir, "marker") {
			break
		}
		if r.Op != wire.WatchOverflow || !strings.HasPrefix(r.Path, dir+"/d") {
			t.Fatalf("record %+v", r)
		}
		over++
	}
	if over != 11 { // the top is one of the MaxWatchDirs
		t.Errorf("%d directories said not watched; want 11", over)
	}
	// Hostile requests.
	for _, req := range []wire.WatchRequest{{Path: []byte("rel")}, {Path: []byte("/a/../b")}, {Path: []byte("/proc")}, {Path: []byte(dir + "/d00001/../d00002")}} {
		if _, err := agentconn.Watch(c, context.Background(), req, 1, "", func(r agentconn.WatchRecord) agentconn.WatchRecord { return r }); err == nil {
			t.Errorf("Watch(%q) accepted", req.Path)
		}
	}
	os.Symlink("/", filepath.Join(dir, "root"))
	if _, err := watchOf(t, c, context.Background(), dir+"/root/etc", false); err == nil || !strings.Contains(err.Error(), syscall.ELOOP.Error()) {
		t.Errorf("Watch through a link: %v; want ELOOP", err)
	}
	// Up to the instance's bound, from a second session; the first
	// session's end lets go of its watch.
	c2, _, _ := ta.session(t)
	for i := range wire.MaxWatches - 1 {
		if _, err := watchOf(t, c2, context.Background(), dir, false); err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	if _, err := watchOf(t, c2, context.Background(), dir, false); err == nil {
		t.Fatal("a watch over the bound started")
	}
	uc.Close()
	for r := range ch {
		t.Logf("after the session's end: %+v", r)
	}
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := watchOf(t, c2, context.Background(), dir, false)
		return err == nil, fmt.Sprintf("the ended session's watch is still held: %v", err)
	})
}
