package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentsandbox/sandbox"
)

// TestFilesHostile plants what a hostile model would for the library's
// file reads: links to endless devices, FIFOs that block an opener,
// files and listings larger than the bound, and files the sandbox user may
// not read. Every read ends at once with a clear error, and host memory
// stays flat.
func TestFilesHostile(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t, sandbox.WithLimits(sandbox.Limits{FileSize: 64 << 10}))
	ctx := testCtx(t)
	ftExec(t, sb, `ln -s /dev/zero result.csv && ln -s /dev/urandom random && mkfifo fifo &&
ln -s fifo fifolink && ln -s /dev/stdin stdin && printf secret > locked && chmod 000 locked &&
mkdir ro && printf x > ro/f && chmod 555 ro`)

	t.Run("notRegular", func(t *testing.T) {
		// /dev/stdin is a link to /proc/self/fd/0: for the agent, its own
		// stdin, the library's stream. Refused too (a magic link, and the
		// agent's /proc entries are not the sandbox user's to open).
		data, err := sb.ReadFile(ctx, "stdin")
		if !errors.Is(err, fs.ErrPermission) && !errors.Is(err, syscall.ELOOP) {
			t.Errorf("ReadFile(stdin) = %d bytes, %v; want ELOOP or a permission error", len(data), err)
		}
		t.Logf("ReadFile(stdin): %v", err)
		for _, name := range []string{"result.csv", "random", "fifo", "fifolink", "/dev/null"} {
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			data, err := sb.ReadFile(ctx, name)
			if !errors.Is(err, sandbox.ErrNotRegular) || len(data) != 0 {
				t.Errorf("ReadFile(%q) = %d bytes, %v; want ErrNotRegular", name, len(data), err)
			} else {
				t.Logf("ReadFile(%q): %v", name, err)
			}
			var pe *fs.PathError
			if !errors.As(err, &pe) || pe.Path != name {
				t.Errorf("ReadFile(%q) error %#v is not a *fs.PathError for the name", name, err)
			}
			fsName := "workspace/" + name
			if strings.HasPrefix(name, "/") {
				fsName = name[1:]
			}
			if _, err := fs.ReadFile(sb.FS(ctx), fsName); !errors.Is(err, sandbox.ErrNotRegular) {
				t.Errorf("fs.ReadFile(%q): %v, want ErrNotRegular", fsName, err)
			}
			if f, err := sb.FS(ctx).Open(fsName); !errors.Is(err, sandbox.ErrNotRegular) {
				t.Errorf("FS.Open(%q) = %v, %v; want ErrNotRegular", fsName, f, err)
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 8<<20 {
				t.Errorf("heap grew by %d bytes reading %q", grew, name)
			}
		}
		// Stat and ReadDir describe such files without reading them.
		fi, err := sb.Stat(ctx, "result.csv")
		if err != nil || fi.Mode()&fs.ModeCharDevice == 0 || fi.Name() != "result.csv" {
			t.Errorf("Stat(result.csv) = %v, %v; want a character device named result.csv", fi, err)
		}
	})

	t.Run("tooLarge", func(t *testing.T) {
		// A file of the image, larger than Limits.FileSize (64 KiB).
		_, err := sb.ReadFile(ctx, "/bin/busybox")
		if !errors.Is(err, sandbox.ErrFileTooLarge) {
			t.Errorf("ReadFile(/bin/busybox) with FileSize 64 KiB: %v, want ErrFileTooLarge", err)
		} else {
			t.Logf("ReadFile(/bin/busybox): %v", err)
		}
		if _, err := fs.ReadFile(sb.FS(ctx), "bin/busybox"); !errors.Is(err, sandbox.ErrFileTooLarge) {
			t.Errorf("fs.ReadFile(bin/busybox): %v, want ErrFileTooLarge", err)
		}
		// Exactly the limit is fine.
		ftExec(t, sb, "head -c 65536 /dev/zero > exact")
		if data, err := sb.ReadFile(ctx, "exact"); err != nil || len(data) != 64<<10 {
			t.Errorf("ReadFile(exact) = %d bytes, %v", len(data), err)
		}
		// A listing larger than the limit: 600 entries of 200-byte names.
		ftExec(t, sb, `mkdir many && cd many && n=0; while [ $n -lt 600 ]; do : > "$(printf '%0200d' $n)"; n=$((n+1)); done`)
		if _, err := sb.ReadDir(ctx, "many"); !errors.Is(err, sandbox.ErrFileTooLarge) {
			t.Errorf("ReadDir(many): %v, want ErrFileTooLarge", err)
		}
	})

	t.Run("permissions", func(t *testing.T) {
		// The agent checks access as the sandbox user, not as root.
		if _, err := sb.ReadFile(ctx, "locked"); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("ReadFile(locked) with mode 000: %v, want fs.ErrPermission", err)
		}
		if err := sb.WriteFile(ctx, "ro/new", []byte("x"), 0o644); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("WriteFile into a 555 directory: %v, want fs.ErrPermission", err)
		}
		if err := sb.Remove(ctx, "ro/f"); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("Remove in a 555 directory: %v, want fs.ErrPermission", err)
		}
		if err := sb.MkdirAll(ctx, "ro/sub", 0o755); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("MkdirAll in a 555 directory: %v, want fs.ErrPermission", err)
		}
		if err := sb.WriteFile(ctx, "/etc/passwd", []byte("root::0:0::/:/bin/sh\n"), 0o644); err == nil {
			t.Errorf("WriteFile(/etc/passwd) succeeded")
		}
		if out := ftExec(t, sb, "ls -A ro"); out != "f\n" {
			t.Errorf("ro holds %q after the refused writes", out)
		}
	})

	t.Run("agentProc", func(t *testing.T) {
		// The agent's own /proc entries, which its threads could read
		// whatever their identity, directly or through a planted link:
		// refused as they are to commands. Other /proc files still read.
		pid := strings.TrimSpace(ftExec(t, sb, "ln -s /proc/self/maps notes.txt && ln -s /proc/1 one && { sleep 300 >/dev/null 2>&1 & echo $!; }"))
		for _, name := range []string{"/proc/self/maps", "/proc/1/maps", "/proc/thread-self/status", "/proc/self/status",
			"/proc/1/task/1/maps", "notes.txt", "one/environ", "/proc/self/cmdline"} {
			if data, err := sb.ReadFile(ctx, name); !errors.Is(err, fs.ErrPermission) {
				t.Errorf("ReadFile(%q) = %q, %v; want a permission error", name, truncate(data), err)
			}
		}
		for _, name := range []string{"/proc/1/fd", "/proc/self/map_files", "/proc/self", "/proc/thread-self/fd", "one/task"} {
			if ents, err := sb.ReadDir(ctx, name); !errors.Is(err, fs.ErrPermission) {
				t.Errorf("ReadDir(%q) = %d entries, %v; want a permission error", name, len(ents), err)
			}
		}
		if _, err := sb.Stat(ctx, "/proc/1/fd/0"); !errors.Is(err, fs.ErrPermission) && !errors.Is(err, syscall.ELOOP) {
			t.Errorf("Stat(/proc/1/fd/0): %v; want a permission error or ELOOP", err)
		}
		if err := sb.CopyOut(ctx, "/proc/1", t.TempDir()); !errors.Is(err, fs.ErrPermission) {
			t.Errorf("CopyOut(/proc/1): %v; want a permission error", err)
		}
		if data, err := sb.ReadFile(ctx, "/proc/meminfo"); err != nil || !strings.Contains(string(data), "MemTotal") {
			t.Errorf("ReadFile(/proc/meminfo) = %q, %v", truncate(data), err)
		}
		if data, err := sb.ReadFile(ctx, "/proc/"+pid+"/status"); err != nil || !strings.Contains(string(data), "sleep") {
			t.Errorf("ReadFile(/proc/%s/status) of a command = %q, %v", pid, truncate(data), err)
		}
		ftExec(t, sb, "kill "+pid)
	})
}

// truncate shortens data for an error message.
func truncate(b []byte) string {
	if len(b) > 80 {
		return string(b[:80]) + "..."
	}
	return string(b)
}

// TestFilesConcurrent runs many file operations of one sandbox at once,
// beside commands, and checks each result.
func TestFilesConcurrent(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Go(func() {
			name := fmt.Sprintf("f%02d", i)
			data := bytes.Repeat([]byte{byte('a' + i)}, 100<<10+i)
			for range 5 {
				if err := sb.WriteFile(ctx, name, data, 0o600); err != nil {
					errs <- err
					return
				}
				got, err := sb.ReadFile(ctx, name)
				if err != nil || !bytes.Equal(got, data) {
					errs <- fmt.Errorf("ReadFile(%s) = %d bytes, %v", name, len(got), err)
					return
				}
				fi, err := sb.Stat(ctx, name)
				if err != nil || fi.Size() != int64(len(data)) || fi.Mode() != 0o600 {
					errs <- fmt.Errorf("Stat(%s) = %v, %v", name, fi, err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			if r, err := sb.Exec(ctx, "echo hi"); err != nil || r.Stdout != "hi\n" {
				errs <- fmt.Errorf("Exec during file operations: %v, %v", r, err)
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	ents, err := sb.ReadDir(ctx, ".")
	if err != nil || len(ents) != 16 {
		t.Errorf("ReadDir: %d entries, %v; want 16", len(ents), err)
	}
	// No temporary file of WriteFile is left.
	if out := ftExec(t, sb, "ls -A | grep -c sandbox-write || true"); out != "0\n" {
		t.Errorf("temporary files left: %s", out)
	}
}

// blockingFS is a file system whose file "slow" blocks its first read
// until release is closed (and says so on reading), then reads on.
type blockingFS struct {
	fstest.MapFS
	release <-chan struct{}
	reading chan struct{}
}

func newBlockingFS(release <-chan struct{}) blockingFS {
	return blockingFS{
		MapFS:   fstest.MapFS{"a": {Data: []byte("a")}, "slow": {Data: bytes.Repeat([]byte("s"), 1<<20)}},
		release: release,
		reading: make(chan struct{}),
	}
}

func (b blockingFS) Open(name string) (fs.File, error) {
	f, err := b.MapFS.Open(name)
	if err != nil || name != "slow" {
		return f, err
	}
	return &blockingFile{File: f, b: b}, nil
}

type blockingFile struct {
	fs.File
	b    blockingFS
	once sync.Once
}

func (f *blockingFile) Read(p []byte) (int, error) {
	f.once.Do(func() {
		close(f.b.reading)
		<-f.b.release
	})
	return f.File.Read(p)
}

// TestFilesCancel cancels file operations in the middle of their input and
// checks that they return the context's error, that the agent dropped
// them (later operations, as many as it has workers and more, work), and
// that a cancelled WriteFile leaves no file behind.
func TestFilesCancel(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	for i := range 4 {
		cctx, cancel := context.WithCancel(ctx)
		src := newBlockingFS(cctx.Done())
		done := make(chan error, 1)
		go func() { done <- sb.CopyIn(cctx, fmt.Sprintf("in%d", i), src) }()
		<-src.reading
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled CopyIn: %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("cancelled CopyIn did not return")
		}
	}
	for i := range 8 {
		if err := sb.WriteFile(ctx, "after", []byte{byte(i)}, 0o644); err != nil {
			t.Fatalf("WriteFile after cancelled copies: %v", err)
		}
	}
	// WriteFile cancelled before its data is all sent: no file appears.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := sb.WriteFile(cctx, "never", make([]byte, 4<<20), 0o644); !errors.Is(err, context.Canceled) {
		t.Errorf("WriteFile with a cancelled context: %v", err)
	}
	if out := ftExec(t, sb, "ls -A"); strings.Contains(out, "never") || strings.Contains(out, "sandbox-write") {
		t.Errorf("after a cancelled WriteFile: %q", out)
	}
}
