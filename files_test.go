package sandbox_test

// The files API against the real engine: WriteFile and ReadFile, odd
// names, missing files and links, Mkdir and Remove, FS (testing/fstest),
// a closed sandbox. CopyIn and CopyOut are in files_copy_test.go.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentsandbox/sandbox"
)

// ftExec runs script in sb and fails the test unless it exits 0; it returns
// the script's standard output.
func ftExec(t *testing.T, sb *sandbox.Sandbox, script string) string {
	t.Helper()
	r := mustExec(t, sb, script)
	if r.ExitCode != 0 {
		t.Fatalf("Exec(%q): exit %d, stdout %q, stderr %q", script, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// ftMine is ftExec with the sandbox user's ID in the output written "me":
// the sandbox user is one of its own (WithUser).
func ftMine(t *testing.T, sb *sandbox.Sandbox, script string) string {
	t.Helper()
	uid := strings.TrimSpace(ftExec(t, sb, "id -u"))
	return strings.ReplaceAll(ftExec(t, sb, script), uid, "me")
}

// ftNotExist fails the test unless err is an *fs.PathError for name that
// satisfies errors.Is(err, fs.ErrNotExist).
func ftNotExist(t *testing.T, op, name string, err error) {
	t.Helper()
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s(%q): err = %v, want fs.ErrNotExist", op, name, err)
		return
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		t.Errorf("%s(%q): err = %#v, want an *fs.PathError", op, name, err)
	} else if pe.Path != name {
		t.Errorf("%s(%q): PathError.Path = %q", op, name, pe.Path)
	}
}

func ftRandom(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func ftSHA(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func TestFilesWriteRead(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)

	t.Run("roundtrip", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "hello.txt", []byte("hello\n"), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := sb.ReadFile(ctx, "hello.txt")
		if err != nil || string(got) != "hello\n" {
			t.Fatalf("ReadFile = %q, %v", got, err)
		}
		fi, err := sb.Stat(ctx, "hello.txt")
		if err != nil {
			t.Fatal(err)
		}
		if fi.Name() != "hello.txt" || fi.Size() != 6 || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 || fi.IsDir() {
			t.Errorf("Stat = name %q size %d mode %v", fi.Name(), fi.Size(), fi.Mode())
		}
		if d := time.Since(fi.ModTime()); d < -time.Minute || d > time.Minute {
			t.Errorf("ModTime %v is not about now", fi.ModTime())
		}
		if out := ftMine(t, sb, "stat -c '%u:%g %a' /workspace/hello.txt; cat hello.txt"); out != "me:me 640\nhello\n" {
			t.Errorf("inside: %q", out)
		}
	})

	t.Run("perms", func(t *testing.T) {
		for _, perm := range []fs.FileMode{0o755, 0o444, 0o400} {
			name := fmt.Sprintf("perm%o", perm)
			if err := sb.WriteFile(ctx, name, []byte(name), perm); err != nil {
				t.Fatal(err)
			}
			fi, err := sb.Stat(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != perm {
				t.Errorf("%s: Stat mode %v, want %v", name, fi.Mode(), perm)
			}
		}
		if out := ftMine(t, sb, "stat -c '%n %u %a' perm*"); out != "perm400 me 400\nperm444 me 444\nperm755 me 755\n" {
			t.Errorf("inside: %q", out)
		}
		// The sandbox user can read its 0400 file; 0444 is not writable.
		if out := ftExec(t, sb, "cat perm400; echo; echo x >> perm444 && echo wrote || echo refused"); out != "perm400\nrefused\n" {
			t.Errorf("inside: %q", out)
		}
	})

	t.Run("empty", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "empty", nil, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := sb.ReadFile(ctx, "empty")
		if err != nil || len(got) != 0 {
			t.Fatalf("ReadFile = %q, %v", got, err)
		}
		if fi, err := sb.Stat(ctx, "empty"); err != nil || fi.Size() != 0 {
			t.Fatalf("Stat = %v, %v", fi, err)
		}
	})

	t.Run("binary10MiB", func(t *testing.T) {
		data := ftRandom(t, 10<<20)
		if err := sb.WriteFile(ctx, "big.bin", data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := sb.ReadFile(ctx, "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(data) || ftSHA(got) != ftSHA(data) {
			t.Fatalf("read back %d bytes, sha256 %s; wrote %d bytes, sha256 %s", len(got), ftSHA(got), len(data), ftSHA(data))
		}
		if out := ftMine(t, sb, "sha256sum big.bin; stat -c '%s %u' big.bin"); out != ftSHA(data)+"  big.bin\n10485760 me\n" {
			t.Errorf("inside: %q", out)
		}
	})

	t.Run("overwrite", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "ow.txt", []byte("a rather long first version\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "ow.txt", []byte("short\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := sb.ReadFile(ctx, "ow.txt")
		if err != nil || string(got) != "short\n" {
			t.Fatalf("ReadFile = %q, %v", got, err)
		}
		if out := ftMine(t, sb, "stat -c '%u %a %s' ow.txt"); out != "me 600 6\n" {
			t.Errorf("inside: %q", out)
		}
		// Overwriting a symbolic link replaces the link; its target is
		// not written through.
		ftExec(t, sb, "echo target > ow-target && ln -s ow-target ow-link")
		if err := sb.WriteFile(ctx, "ow-link", []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := ftExec(t, sb, "cat ow-target; [ -L ow-link ] && echo link; cat ow-link"); out != "target\nnew" {
			t.Errorf("inside: %q", out)
		}
	})

	t.Run("missingDir", func(t *testing.T) {
		for _, name := range []string{"nodir/x", "/workspace/nodir/x", "/tmp/nodir/x"} {
			ftNotExist(t, "WriteFile", name, sb.WriteFile(ctx, name, []byte("x"), 0o644))
		}
	})

	t.Run("notADir", func(t *testing.T) {
		for _, name := range []string{"plain", "/tmp/plain"} {
			if err := sb.WriteFile(ctx, name, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"plain/x", "/tmp/plain/x"} {
			err := sb.WriteFile(ctx, name, []byte("x"), 0o644)
			var pe *fs.PathError
			if !errors.As(err, &pe) || !errors.Is(err, syscall.ENOTDIR) {
				t.Errorf("WriteFile(%q) = %#v, want *fs.PathError with ENOTDIR", name, err)
			}
		}
	})

	t.Run("ontoDir", func(t *testing.T) {
		// Writing onto an existing directory must fail and keep it.
		ftExec(t, sb, "mkdir -p keepdir/sub && echo kept > keepdir/sub/f && mkdir -p /tmp/keepdir && echo kept > /tmp/keepdir/f")
		for _, name := range []string{"keepdir", "/tmp/keepdir"} {
			err := sb.WriteFile(ctx, name, []byte("x"), 0o644)
			var pe *fs.PathError
			if !errors.As(err, &pe) {
				t.Errorf("WriteFile(%q) = %#v, want an *fs.PathError", name, err)
			}
		}
		if out := ftExec(t, sb, "cat keepdir/sub/f /tmp/keepdir/f"); out != "kept\nkept\n" {
			t.Errorf("inside: %q", out)
		}
	})

	t.Run("readOnlyRootfs", func(t *testing.T) {
		for _, name := range []string{"/etc/x", "/x", "/bin/newtool"} {
			err := sb.WriteFile(ctx, name, []byte("x"), 0o644)
			var pe *fs.PathError
			if !errors.As(err, &pe) || !errors.Is(err, syscall.EROFS) {
				t.Errorf("WriteFile(%q) = %#v, want *fs.PathError with EROFS", name, err)
			} else {
				t.Logf("WriteFile(%q): %v", name, err)
			}
		}
		if r := mustExec(t, sb, "ls /etc/x /x /bin/newtool"); r.ExitCode == 0 {
			t.Errorf("files appeared on the read-only root: %q", r.Stdout)
		}
	})

	t.Run("relativeAndAbsolute", func(t *testing.T) {
		if err := sb.MkdirAll(ctx, "sub", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "sub/rel.txt", []byte("rel"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "/workspace/sub/abs.txt", []byte("abs"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := sb.WriteFile(ctx, "./sub/../sub/dots.txt", []byte("dots"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out := ftExec(t, sb, "cd /workspace/sub && cat rel.txt abs.txt dots.txt"); out != "relabsdots" {
			t.Errorf("inside: %q", out)
		}
		for name, want := range map[string]string{
			"/workspace/sub/rel.txt": "rel", "sub/abs.txt": "abs", "sub/./dots.txt": "dots",
		} {
			if got, err := sb.ReadFile(ctx, name); err != nil || string(got) != want {
				t.Errorf("ReadFile(%q) = %q, %v", name, got, err)
			}
		}
	})

	t.Run("tmp", func(t *testing.T) {
		// /tmp is a tmpfs inside the sandbox: the file must land there,
		// not in the image layer underneath.
		if err := sb.WriteFile(ctx, "/tmp/x", []byte("in tmp\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if out := ftMine(t, sb, "cat /tmp/x; stat -c '%u:%g %a' /tmp/x"); out != "in tmp\nme:me 600\n" {
			t.Errorf("inside: %q", out)
		}
		if got, err := sb.ReadFile(ctx, "/tmp/x"); err != nil || string(got) != "in tmp\n" {
			t.Errorf("ReadFile(/tmp/x) = %q, %v", got, err)
		}
		fi, err := sb.Stat(ctx, "/tmp/x")
		if err != nil || fi.Name() != "x" || fi.Size() != 7 || fi.Mode() != 0o600 {
			t.Errorf("Stat(/tmp/x) = %v, %v", fi, err)
		} else if d := time.Since(fi.ModTime()); d < -time.Minute || d > time.Minute {
			t.Errorf("ModTime %v is not about now", fi.ModTime())
		}
		if fi, err := sb.Stat(ctx, "/tmp"); err != nil || !fi.IsDir() || fi.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
			t.Errorf("Stat(/tmp) = %v, %v", fi, err)
		}
		// Written by the sandbox, read by the host.
		ftExec(t, sb, "printf 'from sandbox' > /tmp/y")
		if got, err := sb.ReadFile(ctx, "/tmp/y"); err != nil || string(got) != "from sandbox" {
			t.Errorf("ReadFile(/tmp/y) = %q, %v", got, err)
		}
		// Overwrite, and a binary round trip.
		data := ftRandom(t, 1<<20)
		if err := sb.WriteFile(ctx, "/tmp/x", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := sb.ReadFile(ctx, "/tmp/x"); err != nil || !bytes.Equal(got, data) {
			t.Errorf("ReadFile(/tmp/x) = %d bytes, %v; want the 1 MiB written", len(got), err)
		}
		if out := ftExec(t, sb, "sha256sum /tmp/x; stat -c %a /tmp/x"); out != ftSHA(data)+"  /tmp/x\n644\n" {
			t.Errorf("inside: %q", out)
		}
		// A link from the workspace into /tmp.
		ftExec(t, sb, "ln -s /tmp/y totmp")
		if got, err := sb.ReadFile(ctx, "totmp"); err != nil || string(got) != "from sandbox" {
			t.Errorf("ReadFile(totmp) = %q, %v", got, err)
		}
		if fi, err := sb.Stat(ctx, "totmp"); err != nil || fi.Name() != "totmp" || fi.Size() != 12 || !fi.Mode().IsRegular() {
			t.Errorf("Stat(totmp) = %v, %v", fi, err)
		}
	})

	t.Run("timing1MiB", func(t *testing.T) {
		data := ftRandom(t, 1<<20)
		var ds []time.Duration
		for i := 0; i < 3; i++ {
			start := time.Now()
			if err := sb.WriteFile(ctx, "timing.bin", data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := sb.ReadFile(ctx, "timing.bin")
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("ReadFile: %d bytes, %v", len(got), err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		t.Logf("WriteFile+ReadFile 1 MiB round trip (workspace): min %v, median %v, max %v", ds[0], ds[1], ds[2])
	})
}

// ftNames are file names that need care in shells and archives.
var ftNames = []string{
	"with space",
	"  lead and trail  ",
	`q"u'ote`,
	"new\nline\ttab",
	`back\slash\n`,
	"ünïcødé 日本語 🎉",
	"-leading-dash",
	"--",
	"*glob?[x] $HOME $(id) `id`",
	".hidden",
	"a\x01ctrl\x7f",
	"\xff\xfe invalid utf8 \xc3",
}

func TestFilesNames(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	if err := sb.MkdirAll(ctx, "names", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range ftNames {
		if err := sb.WriteFile(ctx, "names/"+name, []byte("content of "+name), 0o644); err != nil {
			t.Errorf("WriteFile(%q): %v", name, err)
		}
	}
	want := slices.Clone(ftNames)
	sort.Strings(want)

	// ReadDir lists them exactly, sorted.
	ents, err := sb.ReadDir(ctx, "names")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
		if !e.Type().IsRegular() || e.IsDir() {
			t.Errorf("%q: type %v", e.Name(), e.Type())
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("ReadDir names:\n got %q\nwant %q", got, want)
	}

	// The sandbox sees the same names.
	out := ftExec(t, sb, `cd names && for f in * .*; do case $f in .|..) continue;; esac; printf '%s\0' "$f"; done`)
	inside := strings.Split(strings.TrimSuffix(out, "\x00"), "\x00")
	sort.Strings(inside)
	if !slices.Equal(inside, want) {
		t.Errorf("names inside:\n got %q\nwant %q", inside, want)
	}

	for _, name := range ftNames {
		p := "names/" + name
		data, err := sb.ReadFile(ctx, p)
		if err != nil || string(data) != "content of "+name {
			t.Errorf("ReadFile(%q) = %q, %v", name, data, err)
		}
		fi, err := sb.Stat(ctx, p)
		if err != nil {
			t.Errorf("Stat(%q): %v", name, err)
		} else if fi.Name() != name || fi.Size() != int64(len("content of "+name)) {
			t.Errorf("Stat(%q) = name %q size %d", name, fi.Name(), fi.Size())
		}
	}
	// The entries' Info describes the same files.
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Errorf("Info(%q): %v", e.Name(), err)
		} else if fi.Name() != e.Name() || fi.Size() != int64(len("content of "+e.Name())) {
			t.Errorf("Info(%q) = name %q size %d", e.Name(), fi.Name(), fi.Size())
		}
	}

	// Names made inside the sandbox come out exactly.
	ftExec(t, sb, `mkdir made && cd made && for n in 'a\nb' 'c\\d' '\0377x' 'sp ace' '-x'; do printf '%b' "$n" > "$(printf '%b' "$n")"; done`)
	madeWant := []string{"-x", "a\nb", `c\d`, "sp ace", "\xffx"}
	ents, err = sb.ReadDir(ctx, "made")
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, e := range ents {
		got = append(got, e.Name())
		if data, err := sb.ReadFile(ctx, "made/"+e.Name()); err != nil || string(data) != e.Name() {
			t.Errorf("ReadFile(made/%q) = %q, %v", e.Name(), data, err)
		}
	}
	if !slices.Equal(got, madeWant) {
		t.Errorf("ReadDir(made):\n got %q\nwant %q", got, madeWant)
	}

	// Remove removes each, and only it: half of them, then the rest.
	for i, names := range [][]string{want[:len(want)/2], want[len(want)/2:]} {
		for _, name := range names {
			if err := sb.Remove(ctx, "names/"+name); err != nil {
				t.Errorf("Remove(%q): %v", name, err)
			}
		}
		ents, err := sb.ReadDir(ctx, "names")
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range ents {
			got = append(got, e.Name())
		}
		if left := want[len(want)/2:]; i == 0 && !slices.Equal(got, left) {
			t.Errorf("after removing half: %q left, want %q", got, left)
		} else if i == 1 && len(got) != 0 {
			t.Errorf("after removing all: %q left", got)
		}
	}
	if _, err := sb.Stat(ctx, "names/"+ftNames[len(ftNames)-1]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(%q) after Remove: %v", ftNames[len(ftNames)-1], err)
	}
	if out := ftExec(t, sb, "ls -A names | wc -l"); strings.TrimSpace(out) != "0" {
		t.Errorf("names left inside: %q", out)
	}
}

func TestFilesMissingAndLinks(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	ftExec(t, sb, `printf T > target.txt && printf TMP > /tmp/t.txt && mkdir d &&
ln -s target.txt rel && ln -s /workspace/target.txt abs && ln -s rel chain1 && ln -s chain1 chain2 &&
ln -s ../target.txt d/up && ln -s d dirlink && ln -s /tmp/t.txt totmp && ln -s nowhere dangling &&
ln -s loop1 loop2 && ln -s loop2 loop1 && ln -s /workspace/d absdir`)

	t.Run("missing", func(t *testing.T) {
		for _, name := range []string{"nope", "/workspace/nope", "d/nope", "nodir/nope", "/tmp/nope", "dangling", "rel/x"} {
			_, err := sb.ReadFile(ctx, name)
			if name == "rel/x" { // through a file: not a directory
				if err == nil {
					t.Errorf("ReadFile(%q) succeeded", name)
				}
				continue
			}
			ftNotExist(t, "ReadFile", name, err)
			_, err = sb.Stat(ctx, name)
			ftNotExist(t, "Stat", name, err)
		}
		for _, name := range []string{"nope", "/tmp/nope", "nodir/nope"} {
			_, err := sb.ReadDir(ctx, name)
			ftNotExist(t, "ReadDir", name, err)
			ftNotExist(t, "Remove", name, sb.Remove(ctx, name))
		}
		_, err := fs.ReadFile(sb.FS(ctx), "workspace/nope")
		ftNotExist(t, "fs.ReadFile", "workspace/nope", err)
		_, err = fs.Stat(sb.FS(ctx), "tmp/nope")
		ftNotExist(t, "fs.Stat", "tmp/nope", err)
	})

	t.Run("readDirectory", func(t *testing.T) {
		for _, name := range []string{".", "d", "dirlink", "absdir", "/tmp", "/"} {
			data, err := sb.ReadFile(ctx, name)
			var pe *fs.PathError
			if data != nil || !errors.As(err, &pe) || !errors.Is(err, syscall.EISDIR) {
				t.Errorf("ReadFile(%q) = %q, %#v; want nil and *fs.PathError with EISDIR", name, data, err)
			}
		}
		if _, err := sb.ReadDir(ctx, "target.txt"); !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("ReadDir(file) = %v, want ENOTDIR", err)
		}
	})

	t.Run("readThroughLinks", func(t *testing.T) {
		for name, want := range map[string]string{
			"rel": "T", "abs": "T", "chain2": "T", "d/up": "T", "dirlink/up": "T",
			"absdir/up": "T", "/workspace/chain1": "T", "totmp": "TMP",
		} {
			if got, err := sb.ReadFile(ctx, name); err != nil || string(got) != want {
				t.Errorf("ReadFile(%q) = %q, %v; want %q", name, got, err, want)
			}
		}
		if got, err := fs.ReadFile(sb.FS(ctx), "workspace/chain2"); err != nil || string(got) != "T" {
			t.Errorf("fs.ReadFile(workspace/chain2) = %q, %v", got, err)
		}
		data, err := sb.ReadFile(ctx, "loop1")
		var pe *fs.PathError
		if data != nil || !errors.As(err, &pe) || !errors.Is(err, syscall.ELOOP) {
			t.Errorf("ReadFile(loop1) = %q, %#v; want *fs.PathError with ELOOP", data, err)
		}
		if fi, err := sb.Stat(ctx, "loop1"); !errors.As(err, &pe) || !errors.Is(err, syscall.ELOOP) {
			t.Errorf("Stat(loop1) = %v, %v; want *fs.PathError with ELOOP", fi, err)
		}
	})

	t.Run("statFollows", func(t *testing.T) {
		for _, name := range []string{"rel", "abs", "chain2", "d/up", "totmp"} {
			fi, err := sb.Stat(ctx, name)
			if err != nil {
				t.Errorf("Stat(%q): %v", name, err)
				continue
			}
			wantSize := int64(1)
			if name == "totmp" {
				wantSize = 3
			}
			base := name[strings.LastIndex(name, "/")+1:]
			if !fi.Mode().IsRegular() || fi.Size() != wantSize || fi.Name() != base {
				t.Errorf("Stat(%q) = name %q mode %v size %d", name, fi.Name(), fi.Mode(), fi.Size())
			}
		}
		for _, name := range []string{"dirlink", "absdir"} {
			if fi, err := sb.Stat(ctx, name); err != nil || !fi.IsDir() || fi.Name() != name {
				t.Errorf("Stat(%q) = %v, %v; want the directory", name, fi, err)
			}
		}
	})

	t.Run("readDirLinks", func(t *testing.T) {
		ents, err := sb.ReadDir(ctx, ".")
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]fs.DirEntry{}
		var names []string
		for _, e := range ents {
			byName[e.Name()] = e
			names = append(names, e.Name())
		}
		wantNames := []string{"abs", "absdir", "chain1", "chain2", "d", "dangling", "dirlink", "loop1", "loop2", "rel", "target.txt", "totmp"}
		if !slices.Equal(names, wantNames) {
			t.Errorf("ReadDir names %q, want %q", names, wantNames)
		}
		targets := map[string]string{
			"rel": "target.txt", "abs": "/workspace/target.txt", "dirlink": "d", "dangling": "nowhere",
			"loop1": "loop2", "totmp": "/tmp/t.txt",
		}
		for name, target := range targets {
			e := byName[name]
			if e == nil {
				continue
			}
			if e.Type()&fs.ModeSymlink == 0 || e.IsDir() {
				t.Errorf("%s: Type %v IsDir %v, want a symlink", name, e.Type(), e.IsDir())
			}
			fi, err := e.Info()
			if err != nil {
				t.Errorf("%s: Info: %v", name, err)
				continue
			}
			if fi.Mode()&fs.ModeSymlink == 0 || fi.Name() != name || fi.Size() != int64(len(target)) {
				t.Errorf("%s: Info = name %q mode %v size %d; want the link (size %d)", name, fi.Name(), fi.Mode(), fi.Size(), len(target))
			}
		}
		if e := byName["d"]; e == nil || !e.IsDir() || e.Type() != fs.ModeDir {
			t.Errorf("d: %v", e)
		}
		if e := byName["target.txt"]; e == nil || e.Type() != 0 {
			t.Errorf("target.txt: %v", e)
		}
		// A link in /tmp, listed and described.
		ftExec(t, sb, "mkdir /tmp/ld && ln -s ../t.txt /tmp/ld/l && echo f > /tmp/ld/f")
		ents, err = sb.ReadDir(ctx, "/tmp/ld")
		if err != nil || len(ents) != 2 || ents[0].Name() != "f" || ents[1].Name() != "l" {
			t.Fatalf("ReadDir(/tmp/ld) = %v, %v", ents, err)
		}
		if ents[1].Type() != fs.ModeSymlink {
			t.Errorf("/tmp/ld/l: Type %v", ents[1].Type())
		}
		if fi, err := ents[1].Info(); err != nil || fi.Mode()&fs.ModeSymlink == 0 || fi.Size() != 8 || fi.Name() != "l" {
			t.Errorf("/tmp/ld/l: Info = %v, %v", fi, err)
		}
		if got, err := sb.ReadFile(ctx, "/tmp/ld/l"); err != nil || string(got) != "TMP" {
			t.Errorf("ReadFile(/tmp/ld/l) = %q, %v", got, err)
		}
	})
}

func TestFilesMkdirRemove(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)

	if err := sb.MkdirAll(ctx, "a/b/c", 0o750); err != nil {
		t.Fatal(err)
	}
	fi, err := sb.Stat(ctx, "a/b/c")
	if err != nil || !fi.IsDir() || fi.Mode() != fs.ModeDir|0o750 {
		t.Fatalf("Stat(a/b/c) = %v, %v", fi, err)
	}
	if out := ftMine(t, sb, "stat -c '%u:%g %F' a a/b a/b/c"); out != strings.Repeat("me:me directory\n", 3) {
		t.Errorf("inside: %q", out)
	}
	// Existing: fine, unchanged.
	if err := sb.MkdirAll(ctx, "a/b/c", 0o700); err != nil {
		t.Errorf("MkdirAll(existing): %v", err)
	}
	if err := sb.MkdirAll(ctx, "/workspace/a", 0o755); err != nil {
		t.Errorf("MkdirAll(existing, absolute): %v", err)
	}
	if err := sb.MkdirAll(ctx, "/tmp/x/y", 0o755); err != nil {
		t.Errorf("MkdirAll(/tmp/x/y): %v", err)
	}
	if out := ftMine(t, sb, "stat -c '%u %a' /tmp/x/y"); out != "me 755\n" {
		t.Errorf("inside: %q", out)
	}
	// Over a file, or below one: error, file kept.
	if err := sb.WriteFile(ctx, "a/file", []byte("f"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a/file", "a/file/sub"} {
		err := sb.MkdirAll(ctx, name, 0o755)
		var pe *fs.PathError
		if !errors.As(err, &pe) {
			t.Errorf("MkdirAll(%q) = %#v, want an *fs.PathError", name, err)
		}
		if name == "a/file" && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("MkdirAll(%q) = %v, want ENOTDIR", name, err)
		}
	}
	if got, err := sb.ReadFile(ctx, "a/file"); err != nil || string(got) != "f" {
		t.Errorf("ReadFile(a/file) = %q, %v", got, err)
	}
	// On the read-only root: an error.
	if err := sb.MkdirAll(ctx, "/etc/newdir", 0o755); err == nil {
		t.Errorf("MkdirAll(/etc/newdir) succeeded")
	}

	// Remove of a tree, with files, links and read-only parts.
	ftExec(t, sb, `mkdir -p keep && echo k > keep/k && cd a/b && echo 1 > c/one && ln -s ../../../keep c/lk &&
mkdir -p ro/inner && echo 2 > ro/two && chmod 444 ro/two && chmod 555 ro/inner`)
	// Remove is os.Remove: not a directory that holds anything.
	if err := sb.Remove(ctx, "a"); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("Remove(a) of a tree: %v, want ENOTEMPTY", err)
	}
	if err := sb.RemoveAll(ctx, "a"); err != nil {
		t.Fatalf("RemoveAll(a): %v", err)
	}
	// RemoveAll is os.RemoveAll: a missing name is not an error.
	for _, name := range []string{"a", "nodir/nope", "/tmp/nope"} {
		if err := sb.RemoveAll(ctx, name); err != nil {
			t.Errorf("RemoveAll(%q) of a missing name: %v", name, err)
		}
	}
	ftExec(t, sb, "mkdir empty")
	if err := sb.Remove(ctx, "empty"); err != nil {
		t.Errorf("Remove of an empty directory: %v", err)
	}
	if _, err := sb.Stat(ctx, "a"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(a) after Remove: %v", err)
	}
	if out := ftExec(t, sb, "ls -A; cat keep/k"); out != "keep\nk\n" {
		t.Errorf("inside after Remove(a): %q", out)
	}
	// Removing a link to a directory removes the link only.
	ftExec(t, sb, "ln -s keep lk && ln -s gone dangling")
	for _, name := range []string{"lk", "dangling"} {
		if err := sb.Remove(ctx, name); err != nil {
			t.Errorf("Remove(%q): %v", name, err)
		}
	}
	if out := ftExec(t, sb, "ls -A; cat keep/k"); out != "keep\nk\n" {
		t.Errorf("inside after removing links: %q", out)
	}
	if err := sb.RemoveAll(ctx, "/tmp/x"); err != nil {
		t.Errorf("RemoveAll(/tmp/x): %v", err)
	}
	if out := ftExec(t, sb, "ls -A /tmp"); out != "" {
		t.Errorf("/tmp after Remove: %q", out)
	}
	// Something the sandbox user cannot remove: an error, not silence.
	if err := sb.Remove(ctx, "/etc/passwd"); err == nil {
		t.Errorf("Remove(/etc/passwd) succeeded")
	}
	if err := sb.RemoveAll(ctx, "/etc"); err == nil {
		t.Errorf("RemoveAll(/etc) succeeded")
	}
}

func TestFilesFSTest(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	for _, d := range []string{"tree/dir1", "tree/empty"} {
		if err := sb.MkdirAll(ctx, d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"with space.txt": "spaced\n",
		"dir1/b.bin":     "\x00\x01\x02",
		"dir1/.hidden":   "",
	}
	for name, data := range files {
		if err := sb.WriteFile(ctx, "tree/"+name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := fs.Sub(sb.FS(ctx), "workspace/tree")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := fstest.TestFS(sub, "with space.txt", "dir1/b.bin", "dir1/.hidden", "empty", "dir1"); err != nil {
		t.Fatal(err)
	}
	t.Logf("fstest.TestFS took %v", time.Since(start))
	// The whole tree, walked through the view, is exactly what was written.
	got := map[string]string{}
	err = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(sub, p)
		got[p] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(files) {
		t.Errorf("walked %q, want %q", got, files)
	}
	// Invalid names are refused by the view.
	if _, err := sb.FS(ctx).Open("/workspace/tree/a.txt"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Open(absolute) = %v, want fs.ErrInvalid", err)
	}
	if _, err := sb.FS(ctx).Open("workspace/../etc/passwd"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("Open(..) = %v, want fs.ErrInvalid", err)
	}
}

func TestFilesClosed(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	if err := sb.WriteFile(ctx, "f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fsys := sb.FS(ctx)
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	host := t.TempDir()
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", op, err)
		}
	}
	for _, name := range []string{"f", "/tmp/f"} {
		check("WriteFile "+name, sb.WriteFile(ctx, name, []byte("x"), 0o644))
		_, err := sb.ReadFile(ctx, name)
		check("ReadFile "+name, err)
		_, err = sb.Stat(ctx, name)
		check("Stat "+name, err)
		_, err = sb.ReadDir(ctx, name)
		check("ReadDir "+name, err)
		check("MkdirAll "+name, sb.MkdirAll(ctx, name, 0o755))
		check("Remove "+name, sb.Remove(ctx, name))
	}
	check("CopyIn", sb.CopyIn(ctx, "in", fstest.MapFS{"a": {Data: []byte("a")}}))
	check("CopyOut", sb.CopyOut(ctx, "f", host))
	_, err := fsys.Open("workspace/f")
	check("FS.Open", err)
	_, err = fs.ReadFile(fsys, "workspace/f")
	check("fs.ReadFile", err)
	_, err = fs.ReadDir(fsys, "workspace")
	check("fs.ReadDir", err)
	_, err = fs.Stat(sb.FS(context.Background()), "workspace")
	check("fs.Stat", err)
	if ents, _ := os.ReadDir(host); len(ents) != 0 {
		t.Errorf("CopyOut after Close wrote %v", ents)
	}
}
