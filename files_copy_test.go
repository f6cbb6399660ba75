package sandbox_test

// CopyIn and CopyOut against the real engine: trees with every kind of
// entry both ways, and links the sandbox plants to lead CopyOut out of its
// destination on the host.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"

	"github.com/agentsandbox/sandbox"
)

// ftHostTree describes the tree under root on the host: for each path
// (slash-separated, relative) its type and permissions, and a file's
// content or a link's target. Directories' modes are left out.
func ftHostTree(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			m[rel] = "link " + target
		case fi.IsDir():
			m[rel] = "dir"
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			m[rel] = fmt.Sprintf("file %v %q", fi.Mode().Perm(), data)
		default:
			m[rel] = "other " + fi.Mode().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFilesCopyIn(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)

	host := t.TempDir()
	bin := ftRandom(t, 200<<10)
	for name, f := range map[string]struct {
		data string
		perm fs.FileMode
	}{
		"top.txt":             {"top\n", 0o644},
		"name with space.txt": {"spaced\n", 0o640},
		"sub/run.sh":          {"#!/bin/sh\necho ran\n", 0o755},
		"sub/deep/data.bin":   {string(bin), 0o600},
	} {
		p := filepath.Join(host, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.data), f.perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.perm); err != nil { // umask
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(host, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("top.txt", filepath.Join(host, "link")); err != nil {
		t.Fatal(err)
	}

	t.Run("DirFS", func(t *testing.T) {
		if err := sb.CopyIn(ctx, "in", os.DirFS(host)); err != nil {
			t.Fatal(err)
		}
		out := ftMine(t, sb, `cd in && find . | sort && find . -exec stat -c '%u:%g %a %n' {} \; | sort && readlink link && sh sub/run.sh && sha256sum sub/deep/data.bin`)
		want := `.
./empty
./link
./name with space.txt
./sub
./sub/deep
./sub/deep/data.bin
./sub/run.sh
./top.txt
me:me 600 ./sub/deep/data.bin
me:me 640 ./name with space.txt
me:me 644 ./top.txt
me:me 755 .
me:me 755 ./empty
me:me 755 ./sub
me:me 755 ./sub/deep
me:me 755 ./sub/run.sh
me:me 777 ./link
top.txt
ran
` + ftSHA(bin) + "  sub/deep/data.bin\n"
		if out != want {
			t.Errorf("inside:\n%s\nwant:\n%s", out, want)
		}
		for name, want := range map[string]string{"in/top.txt": "top\n", "in/link": "top\n", "in/name with space.txt": "spaced\n"} {
			if got, err := sb.ReadFile(ctx, name); err != nil || string(got) != want {
				t.Errorf("ReadFile(%q) = %q, %v", name, got, err)
			}
		}
	})

	t.Run("MapFS", func(t *testing.T) {
		src := fstest.MapFS{
			"m/a.txt":     {Data: []byte("A"), Mode: 0o640},
			"m/sub/b.txt": {Data: []byte("B"), Mode: 0o755},
			"m/empty":     {Mode: fs.ModeDir | 0o700},
			"top":         {Data: []byte("top"), Mode: 0o644},
		}
		// Into an existing directory with a file CopyIn replaces.
		ftExec(t, sb, "mkdir -p /workspace/dst/m && echo old > /workspace/dst/m/a.txt && echo other > /workspace/dst/other")
		if err := sb.CopyIn(ctx, "/workspace/dst", src); err != nil {
			t.Fatal(err)
		}
		out := ftMine(t, sb, `cd dst && find . -exec stat -c '%u:%g %a %n' {} \; | sort && cat m/a.txt m/sub/b.txt top other`)
		// MapFS makes up the parent directories it does not list, with
		// mode 0555.
		want := `me:me 555 ./m
me:me 555 ./m/sub
me:me 640 ./m/a.txt
me:me 644 ./other
me:me 644 ./top
me:me 700 ./m/empty
me:me 755 .
me:me 755 ./m/sub/b.txt
ABtopother
`
		if out != want {
			t.Errorf("inside:\n%s\nwant:\n%s", out, want)
		}
	})

	t.Run("errors", func(t *testing.T) {
		src := fstest.MapFS{"f": {Data: []byte("x"), Mode: 0o644}}
		if err := sb.WriteFile(ctx, "afile", []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			dst  string
			want error
		}{{"afile", syscall.ENOTDIR}, {"/etc/new", syscall.EROFS}} {
			err := sb.CopyIn(ctx, c.dst, src)
			var pe *fs.PathError
			if !errors.As(err, &pe) || !errors.Is(err, c.want) {
				t.Errorf("CopyIn(%q) = %#v, want an *fs.PathError for %v", c.dst, err, c.want)
			} else {
				t.Logf("CopyIn(%q): %v", c.dst, err)
			}
		}
	})

	t.Run("tmp", func(t *testing.T) {
		// /tmp is a tmpfs of the container's own, which the engine's
		// archive API could not see; the agent can.
		src := fstest.MapFS{"d/f": {Data: []byte("in tmp"), Mode: 0o600}}
		if err := sb.CopyIn(ctx, "/tmp/dst", src); err != nil {
			t.Fatal(err)
		}
		if out := ftExec(t, sb, "stat -c '%a %s' /tmp/dst/d/f && cat /tmp/dst/d/f"); out != "600 6\nin tmp" {
			t.Errorf("in /tmp: %q", out)
		}
	})
}

func TestFilesCopyOut(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	ftExec(t, sb, `mkdir -p out/sub/deep out/empty && printf a > out/a.txt && printf 'sp ace' > 'out/sp ace.txt' &&
printf '#!/bin/sh\n' > out/sub/run.sh && chmod 750 out/sub/run.sh && head -c 300000 /dev/urandom > out/sub/deep/rand.bin &&
chmod 600 out/sub/deep/rand.bin && printf bad > "out/$(printf '%b' 'x\0377y')" && ln -s a.txt out/rel && ln -s ../a.txt out/sub/up && ln -s sub/deep out/dl && ln out/a.txt out/hard`)
	rnd, err := sb.ReadFile(ctx, "out/sub/deep/rand.bin")
	if err != nil || len(rnd) != 300000 {
		t.Fatalf("ReadFile(rand.bin) = %d bytes, %v", len(rnd), err)
	}

	t.Run("tree", func(t *testing.T) {
		host := t.TempDir()
		if err := sb.CopyOut(ctx, "out", host); err != nil {
			t.Fatal(err)
		}
		got := ftHostTree(t, host)
		want := map[string]string{
			".":                     "dir",
			"out":                   "dir",
			"out/a.txt":             `file -rw-r--r-- "a"`,
			"out/hard":              `file -rw-r--r-- "a"`,
			"out/sp ace.txt":        `file -rw-r--r-- "sp ace"`,
			"out/empty":             "dir",
			"out/sub":               "dir",
			"out/sub/run.sh":        `file -rwxr-x--- "#!/bin/sh\n"`,
			"out/sub/deep":          "dir",
			"out/sub/deep/rand.bin": fmt.Sprintf("file -rw------- %q", rnd),
			"out/rel":               "link a.txt",
			"out/sub/up":            "link ../a.txt",
			"out/dl":                "link sub/deep",
			"out/x\xffy":            `file -rw-r--r-- "bad"`,
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			for k := range want {
				if got[k] != want[k] {
					t.Errorf("%s: got %.80q, want %.80q", k, got[k], want[k])
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Errorf("unexpected %s: %.80q", k, got[k])
				}
			}
		}
		if data, err := os.ReadFile(filepath.Join(host, "out", "dl", "rand.bin")); err != nil || !bytes.Equal(data, rnd) {
			t.Errorf("through out/dl: %d bytes, %v", len(data), err)
		}
	})

	t.Run("file", func(t *testing.T) {
		host := t.TempDir()
		if err := sb.CopyOut(ctx, "out/sub/deep/rand.bin", host); err != nil {
			t.Fatal(err)
		}
		if err := sb.CopyOut(ctx, "/workspace/out/a.txt", host); err != nil {
			t.Fatal(err)
		}
		got := ftHostTree(t, host)
		want := map[string]string{
			".":        "dir",
			"rand.bin": fmt.Sprintf("file -rw------- %q", rnd),
			"a.txt":    `file -rw-r--r-- "a"`,
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("host tree %.200q, want %.200q", got, want)
		}
		// Copying again replaces.
		ftExec(t, sb, "printf A2 > out/a.txt")
		if err := sb.CopyOut(ctx, "out/a.txt", host); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(host, "a.txt")); err != nil || string(data) != "A2" {
			t.Errorf("after second CopyOut: %q, %v", data, err)
		}
		ftExec(t, sb, "printf a > out/a.txt")
	})

	t.Run("errors", func(t *testing.T) {
		host := t.TempDir()
		ftNotExist(t, "CopyOut", "nope", sb.CopyOut(ctx, "nope", host))
		if err := sb.CopyOut(ctx, "out/a.txt", filepath.Join(host, "missing")); err == nil {
			t.Errorf("CopyOut into a missing host directory succeeded")
		}
		// Read as the sandbox user: a file it cannot read stops the copy.
		ftExec(t, sb, "printf secret > out/unreadable && chmod 000 out/unreadable")
		err := sb.CopyOut(ctx, "out/unreadable", host)
		var pe *fs.PathError
		if !errors.As(err, &pe) || !errors.Is(err, fs.ErrPermission) {
			t.Errorf("CopyOut(unreadable) = %#v, want an *fs.PathError for fs.ErrPermission", err)
		}
		ftExec(t, sb, "rm out/unreadable")
		// Deep in a tree, after files that were copied.
		ftExec(t, sb, "mkdir -p tree/a && printf ok > tree/a/1 && printf no > tree/a/2 && chmod 000 tree/a/2")
		tree := t.TempDir()
		err = sb.CopyOut(ctx, "tree", tree)
		if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "tree/a/2") {
			t.Errorf("CopyOut(tree) with an unreadable file inside = %v, want fs.ErrPermission naming tree/a/2", err)
		}
		ftExec(t, sb, "rm -r tree")
		if got := ftHostTree(t, host); len(got) != 1 {
			t.Errorf("host dir not empty after errors: %q", got)
		}
	})

	t.Run("tmp", func(t *testing.T) {
		host := t.TempDir()
		ftExec(t, sb, "mkdir -p /tmp/o/sub && printf t > /tmp/o/sub/f")
		if err := sb.CopyOut(ctx, "/tmp/o", host); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(host, "o", "sub", "f")); err != nil || string(b) != "t" {
			t.Errorf("copied out of /tmp: %q, %v", b, err)
		}
	})
}

// TestFilesCopyOutEscape lets the sandbox plant links that point out of
// the tree being copied and checks that CopyOut creates nothing outside the
// host directory and leaves no link there that leads outside.
func TestFilesCopyOutEscape(t *testing.T) {
	t.Parallel()
	sb := newSandbox(t)
	ctx := testCtx(t)
	// Each trap holds ordinary files around one kind of escaping link; the
	// sandbox writes through the link where it can.
	ftExec(t, sb, `set -e
mkdir -p t1 t2/a/b t3 t4/sub t5
echo ok > t1/a.txt && ln -s / t1/escape && echo ok > t1/z.txt
echo pwned > t1/escape/tmp/pwned.txt
ln -s ../../ t2/up && ln -s ../../../.. t2/a/b/up4 && echo ok > t2/a/b/f
ln -s /etc/passwd t3/abs && echo ok > t3/f
ln -s .. t4/sub/parent && ln -s parent/../.. t4/sub/grand && ln -s ../sub/parent/.. t4/sub/back && ln -s ../.. t4/sub/up2
ln -s /workspace/t5 t5/self && ln -s /tmp t5/tmp && echo pwned > t5/tmp/through.txt`)
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	rootBefore, err := os.ReadDir("/")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		src    string
		refuse bool // the archive holds a link that points out of hostDir
	}{
		{"t1", true},
		{"t1/escape", true},
		{"t1/escape/tmp", false}, // resolved in the container: its /tmp directory
		{"t2", true},
		{"t2/up", true},
		{"t3", true},
		{"t3/abs", true},
		{"t4", false}, // links stay inside once their targets are cleaned
		{"t4/sub", true},
		{"t5", true},
	} {
		t.Run(strings.ReplaceAll(tc.src, "/", "_"), func(t *testing.T) {
			parent := t.TempDir()
			hostDir := filepath.Join(parent, "host")
			if err := os.Mkdir(hostDir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{"sibling.txt", "etc/passwd", "tmp/keep"} {
				p := filepath.Join(parent, s)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte("sibling "+s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			outside := func(k string) bool {
				return k != "host" && !strings.HasPrefix(k, "host/") && k != "strict" && !strings.HasPrefix(k, "strict/")
			}
			before := ftHostTree(t, parent)
			for k := range before {
				if !outside(k) {
					delete(before, k)
				}
			}

			// By default escaping links are left out and reported.
			var skipped []string
			err := sb.CopyOut(ctx, tc.src, hostDir, sandbox.OnSkippedLink(func(name, target string) {
				skipped = append(skipped, name+" -> "+target)
			}))
			if err != nil {
				t.Errorf("CopyOut(%q) = %v; want success", tc.src, err)
			}
			if tc.refuse != (len(skipped) > 0) {
				t.Errorf("CopyOut(%q) skipped %q; want links skipped: %v", tc.src, skipped, tc.refuse)
			}
			t.Logf("CopyOut(%q) skipped %q", tc.src, skipped)
			if tc.src == "t1" {
				for _, f := range []string{"t1/a.txt", "t1/z.txt"} {
					if data, err := os.ReadFile(filepath.Join(hostDir, f)); err != nil || string(data) != "ok\n" {
						t.Errorf("%s beside the skipped link: %q, %v", f, data, err)
					}
				}
			}
			// StrictLinks makes them fatal.
			strictDir := filepath.Join(parent, "strict")
			if err := os.Mkdir(strictDir, 0o755); err != nil {
				t.Fatal(err)
			}
			err = sb.CopyOut(ctx, tc.src, strictDir, sandbox.StrictLinks())
			switch {
			case err == nil && tc.refuse:
				t.Errorf("CopyOut(%q, StrictLinks) succeeded; want ErrUnsafePath", tc.src)
			case err != nil && !errors.Is(err, sandbox.ErrUnsafePath):
				t.Errorf("CopyOut(%q, StrictLinks) = %v; want nil or ErrUnsafePath", tc.src, err)
			case err != nil && !tc.refuse:
				t.Errorf("CopyOut(%q, StrictLinks) = %v; want success", tc.src, err)
			case err != nil:
				var pe *fs.PathError
				if !errors.As(err, &pe) {
					t.Errorf("CopyOut(%q) = %#v, want an *fs.PathError", tc.src, err)
				}
				t.Logf("CopyOut(%q, StrictLinks): %v", tc.src, err)
			}

			// Nothing changed beside hostDir.
			after := ftHostTree(t, parent)
			for k := range after {
				if !outside(k) {
					delete(after, k)
				}
			}
			if fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("outside hostDir changed:\nbefore %q\nafter  %q", before, after)
			}
			// No link under hostDir or strictDir leads outside it.
			for _, dir := range []string{hostDir, strictDir} {
				realDir, err := filepath.EvalSymlinks(dir)
				if err != nil {
					t.Fatal(err)
				}
				inside := func(p string) bool {
					rel, err := filepath.Rel(realDir, p)
					return err == nil && filepath.IsLocal(rel)
				}
				for rel, desc := range ftHostTree(t, dir) {
					if !strings.HasPrefix(desc, "link ") {
						continue
					}
					target := strings.TrimPrefix(desc, "link ")
					p := filepath.Join(realDir, filepath.FromSlash(rel))
					if filepath.IsAbs(target) {
						t.Errorf("%s: absolute link target %q", rel, target)
					} else if !inside(filepath.Join(filepath.Dir(p), target)) {
						t.Errorf("%s: link target %q leads outside", rel, target)
					}
					if r, err := filepath.EvalSymlinks(p); err == nil && !inside(r) {
						t.Errorf("%s resolves to %s, outside %s", rel, r, dir)
					}
				}
			}
			t.Logf("CopyOut(%q) left in hostDir: %q", tc.src, ftHostTree(t, hostDir))
		})
	}

	if data, err := os.ReadFile("/etc/passwd"); err != nil || !bytes.Equal(data, passwd) {
		t.Errorf("host /etc/passwd changed")
	}
	rootAfter, err := os.ReadDir("/")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rootAfter) != fmt.Sprint(rootBefore) {
		t.Errorf("host / changed: %v -> %v", rootBefore, rootAfter)
	}
}
