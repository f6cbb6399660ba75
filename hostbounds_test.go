package sandbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/agentsandbox/sandbox"
)

// hostUsage returns the apparent size and the bytes on disk of the files
// under dir.
func hostUsage(t *testing.T, dir string) (apparent, disk int64) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			apparent += fi.Size()
			disk += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return apparent, disk
}

// heapNow returns the live heap after a collection.
func heapNow() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestHostBoundsCopyOut fills a small disk with sparse files far larger
// than the disk, and many entries, and checks that CopyOut stops at its
// bounds with ErrTooLarge, keeps sparse files sparse on the host, and
// leaves host memory flat.
func TestHostBoundsCopyOut(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 64 << 20}))
	ctx := testCtx(t)
	ftExec(t, sb, `set -e; mkdir sp many
for i in 1 2 3; do truncate -s 100M sp/s$i; done
echo data >> sp/s1
i=0; while [ $i -lt 300 ]; do : > many/f$i; i=$((i+1)); done
du -sk sp`)

	t.Run("bytes", func(t *testing.T) {
		host := t.TempDir()
		heap0 := heapNow()
		err := sb.CopyOut(ctx, "sp", host, sandbox.CopyLimit(150<<20, 0))
		grew := heapNow() - heap0
		if !errors.Is(err, sandbox.ErrTooLarge) {
			t.Fatalf("CopyOut of 300 MiB of sparse files with CopyLimit(150 MiB) = %v, want ErrTooLarge", err)
		}
		t.Logf("CopyOut: %v", err)
		apparent, disk := hostUsage(t, host)
		t.Logf("host: %d bytes apparent, %d on disk; heap %+d", apparent, disk, grew)
		if apparent > 150<<20 {
			t.Errorf("%d bytes written on the host, over the 150 MiB bound", apparent)
		}
		if disk > 4<<20 {
			t.Errorf("%d bytes on the host's disk for sparse files", disk)
		}
		if grew > 16<<20 {
			t.Errorf("host heap grew by %d bytes", grew)
		}
	})

	t.Run("sparseKept", func(t *testing.T) {
		host := t.TempDir()
		if err := sb.CopyOut(ctx, "sp/s1", host); err != nil {
			t.Fatal(err)
		}
		apparent, disk := hostUsage(t, host)
		if apparent != 100<<20+5 || disk > 1<<20 {
			t.Errorf("sparse file on the host: %d bytes apparent, %d on disk; want %d and a few blocks", apparent, disk, 100<<20+5)
		}
		f, err := os.Open(filepath.Join(host, "s1"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tail := make([]byte, 5)
		if _, err := f.ReadAt(tail, 100<<20); err != nil || string(tail) != "data\n" {
			t.Errorf("the file's last bytes: %q, %v", tail, err)
		}
	})

	t.Run("entries", func(t *testing.T) {
		host := t.TempDir()
		err := sb.CopyOut(ctx, "many", host, sandbox.CopyLimit(0, 100))
		if !errors.Is(err, sandbox.ErrTooLarge) {
			t.Fatalf("CopyOut of 301 entries with CopyLimit(0, 100) = %v, want ErrTooLarge", err)
		}
		ents, _ := os.ReadDir(filepath.Join(host, "many"))
		if len(ents) > 100 {
			t.Errorf("%d entries on the host, over the bound of 100", len(ents))
		}
		if err := sb.CopyOut(ctx, "many", t.TempDir()); err != nil {
			t.Errorf("CopyOut of 301 entries with the default bound: %v", err)
		}
	})
}

// TestHostBoundsSnapshot checks that a working directory whose sparse files
// add up to more than the disk limit cannot become a snapshot larger than
// the disk: Snapshot fails with ErrTooLarge, leaves no image, and the
// sandbox runs on.
func TestHostBoundsSnapshot(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{Disk: 64 << 20}))
	ctx := testCtx(t)
	ftExec(t, sb, `for i in 1 2 3 4 5 6; do truncate -s 255M s$i || exit 1; done`)
	heap0 := heapNow()
	snap, err := sb.Snapshot(ctx)
	if grew := heapNow() - heap0; grew > 16<<20 {
		t.Errorf("host heap grew by %d bytes", grew)
	}
	if err == nil {
		snap.Remove(ctx)
		t.Fatal("Snapshot of 1.5 GB of sparse files in a 64 MiB disk succeeded")
	}
	if !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("Snapshot: %v, want ErrTooLarge", err)
	}
	t.Logf("Snapshot: %v", err)
	if got := ftExec(t, sb, "echo alive"); got != "alive\n" {
		t.Errorf("after the refused snapshot: %q", got)
	}
	cli := engineClient(t)
	is, err := cli.ImageList(ctx, image.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", "dev.agentsandbox.source="+sb.ID()))})
	if err != nil || len(is) != 0 {
		t.Errorf("snapshot images of the sandbox after the refusal: %d, %v", len(is), err)
	}

	// Within the bound, sparse files are fine.
	ftExec(t, sb, `rm s*; truncate -s 32M small`)
	snap, err = sb.Snapshot(ctx)
	if err != nil {
		t.Fatalf("Snapshot of a 32 MiB sparse file in a 64 MiB disk: %v", err)
	}
	defer snap.Remove(ctx)
	r, err := snap.New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := ftExec(t, r, "stat -c %s small"); got != "33554432\n" {
		t.Errorf("restored sparse file size %q", got)
	}
}

// TestShmAndMqueue checks the RAM-backed writable places besides /tmp:
// /dev/shm is a tmpfs of TmpSize, and POSIX message queues are bounded by
// RLIMIT_MSGQUEUE.
func TestShmAndMqueue(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{TmpSize: 8 << 20}))
	if got := ftExec(t, sb, `df -k /dev/shm | awk 'NR==2 {print $2}'`); got != "8192\n" {
		t.Errorf("/dev/shm size: %q KiB, want 8192", got)
	}
	r := mustExec(t, sb, `head -c 9437184 /dev/zero > /dev/shm/fill`)
	if r.ExitCode == 0 {
		t.Errorf("writing 9 MiB into an 8 MiB /dev/shm succeeded")
	}
	if got := ftExec(t, sb, `stat -c %s /dev/shm/fill`); got != "8388608\n" {
		t.Errorf("/dev/shm/fill holds %q bytes after %q, want 8388608", got, r.Stderr)
	}
	if got := ftExec(t, sb, `awk '/msgqueue/ {print $4, $5}' /proc/self/limits`); got != "819200 819200\n" {
		t.Errorf("RLIMIT_MSGQUEUE: %q, want 819200 819200", got)
	}
}

// TestCopyOutSkippedAudit: links CopyOut leaves out are named in its audit
// record, and the copy around them succeeds.
func TestCopyOutSkippedAudit(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	sb := newSandbox(t, sandbox.WithLogger(slog.New(slog.NewJSONHandler(&log, nil))))
	ctx := testCtx(t)
	ftExec(t, sb, `set -e; mkdir -p proj/.venv/bin && ln -s /usr/bin/python3 proj/.venv/bin/python &&
ln -s python proj/.venv/bin/python3 && echo 'print(1)' > proj/main.py`)
	host := t.TempDir()
	if err := sb.CopyOut(ctx, "proj", host); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(host, "proj/main.py")); err != nil || string(data) != "print(1)\n" {
		t.Errorf("main.py: %q, %v", data, err)
	}
	if target, err := os.Readlink(filepath.Join(host, "proj/.venv/bin/python3")); err != nil || target != "python" {
		t.Errorf("the inside link: %q, %v", target, err)
	}
	var rec struct {
		Msg          string
		SkippedLinks int      `json:"skipped_links"`
		Skipped      []string `json:"skipped"`
	}
	for _, line := range bytes.Split(log.Bytes(), []byte("\n")) {
		if bytes.Contains(line, []byte(`"sandbox.file.copyout"`)) {
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rec.SkippedLinks != 1 || len(rec.Skipped) != 1 || rec.Skipped[0] != "proj/.venv/bin/python -> /usr/bin/python3" {
		t.Errorf("audit record of the copy: %+v; want the one skipped link named", rec)
	}
}
