//go:build linux

package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// mkdeep makes, under dir, levels nested directories called name with
// *at calls (the path is beyond PATH_MAX) and returns a descriptor of the
// deepest.
func mkdeep(t *testing.T, dir, name string, levels int) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range levels {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	return fd
}

// TestWriteTarDeep: a tree beyond PATH_MAX is archived whole, with hard
// links stored once and times far from 1970 kept.
func TestWriteTarDeep(t *testing.T) {
	dir := t.TempDir()
	name := strings.Repeat("n", 250)
	fd := mkdeep(t, dir, name, 20)
	defer unix.Close(fd)
	f, err := unix.Openat(fd, "f", unix.O_WRONLY|unix.O_CREAT, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(f, []byte("deep\n"))
	unix.Close(f)
	if err := unix.Linkat(fd, "f", fd, "g", 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Symlinkat("f", fd, "l"); err != nil {
		t.Fatal(err)
	}
	far := unix.Timespec{Sec: 9999999999, Nsec: 123456789}
	if err := unix.UtimesNanoAt(fd, "f", []unix.Timespec{far, far}, 0); err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	sk, err := writeTarContents(&buf, dir, 1<<20, uint32(unix.Getuid()))
	if err != nil {
		t.Fatalf("writeTarContents: %v", err)
	}
	if sk.n != 0 {
		t.Errorf("skipped %d: %q", sk.n, sk.names)
	}
	prefix := strings.Repeat(name+"/", 20)
	got := map[string]*tar.Header{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	if len(got) != 23 {
		t.Errorf("%d entries, want 23", len(got))
	}
	fh, gh, lh := got[prefix+"f"], got[prefix+"g"], got[prefix+"l"]
	if fh == nil || gh == nil || lh == nil {
		t.Fatalf("deep entries missing: f %v, g %v, l %v", fh != nil, gh != nil, lh != nil)
	}
	// Directory order: f or g comes first and holds the contents.
	first, second := fh, gh
	if fh.Typeflag == tar.TypeLink {
		first, second = gh, fh
	}
	if first.Typeflag != tar.TypeReg || first.Size != 5 || second.Typeflag != tar.TypeLink || second.Linkname != first.Name {
		t.Errorf("hard links: %q %c size %d, %q %c -> %q", first.Name, first.Typeflag, first.Size, second.Name, second.Typeflag, second.Linkname)
	}
	if want := time.Unix(9999999999, 123456789); !fh.ModTime.Equal(want) {
		t.Errorf("mtime %v, want %v", fh.ModTime, want)
	}
	if lh.Typeflag != tar.TypeSymlink || lh.Linkname != "f" {
		t.Errorf("symlink: %c -> %q", lh.Typeflag, lh.Linkname)
	}
}

// TestWriteTarBounds: contents and headers over their bounds are refused,
// each saying which.
func TestWriteTarBounds(t *testing.T) {
	dir := t.TempDir()
	fd := mkdeep(t, dir, "d", 1)
	f, _ := unix.Openat(fd, "big", unix.O_WRONLY|unix.O_CREAT, 0o644)
	unix.Ftruncate(f, 4096)
	unix.Close(f)
	_, err := writeTarContents(io.Discard, dir, 1000, 0)
	var c coded
	if !errors.As(err, &c) || c.code != wire.CodeTooLarge || !strings.Contains(err.Error(), "file contents add up to more than 1000 bytes") {
		t.Errorf("contents over the bound: %v", err)
	}

	// Headers: a walk with a small header bound.
	for i := range 100 {
		unix.Close(must(unix.Openat(fd, strings.Repeat("x", 200)+string(rune('a'+i%26))+strings.Repeat("y", i%50)+string(rune('a'+i/26)), unix.O_WRONLY|unix.O_CREAT, 0o644)))
	}
	unix.Close(fd)
	tw := newTarWalk(io.Discard, 1<<20)
	tw.capture, tw.headLimit = true, 64<<10
	err = tw.add(unix.AT_FDCWD, dir, "", 0)
	if !errors.As(err, &c) || c.code != wire.CodeTooLarge || !strings.Contains(err.Error(), "besides file contents") {
		t.Errorf("headers over the bound: %v", err)
	}
}

func must(fd int, err error) int {
	if err != nil {
		panic(err)
	}
	return fd
}
