package snapfile

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/maphash"
	"io"
	"strings"
	"testing"
	"time"
)

// entry is one entry of a test tar.
type entry struct {
	typ  byte
	name string
	link string
	data string
}

// tarOf builds a tar archive of the entries.
func tarOf(t testing.TB, es ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		hdr := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: 0o644, ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// testManifest describes content.
func testManifest(content []byte) *Manifest {
	return &Manifest{
		Digest: digest(content), Size: int64(len(content)), Base: "busybox:latest", Source: "abc",
		Workdir: "/workspace", Limits: Limits{CPUs: 1.5, Memory: 512 << 20, Disk: 1 << 30, ExecTimeoutNS: int64(time.Minute)},
		Env: []string{"A=1"}, Labels: map[string]string{"k": "v"}, Network: &Network{Allow: []string{}},
	}
}

// archive encodes m and content.
func archive(t testing.TB, m *Manifest, content []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := WriteHeader(&b, m); err != nil {
		t.Fatal(err)
	}
	b.Write(content)
	return b.Bytes()
}

// read decodes an archive as ReadSnapshot does, returning the content.
func read(r io.Reader, bound int64) (*Manifest, []byte, error) {
	m, err := ReadHeader(r)
	if err != nil {
		return nil, nil, err
	}
	var content bytes.Buffer
	if err := CopyContent(&content, r, m.Size, bound); err != nil {
		return m, nil, err
	}
	return m, content.Bytes(), nil
}

var goodTree = []entry{
	{typ: tar.TypeDir, name: "a/"},
	{typ: tar.TypeReg, name: "a/f", data: "hello"},
	{typ: tar.TypeLink, name: "a/g", link: "a/f"},
	{typ: tar.TypeSymlink, name: "abs", link: "/etc/passwd"},
	{typ: tar.TypeSymlink, name: "up", link: "../../etc"},
	{typ: tar.TypeSymlink, name: "a/sub", link: "."},
	{typ: tar.TypeReg, name: "odd name\nwith newline", data: "x"},
	{typ: tar.TypeDir, name: "./"},
}

func TestRoundTrip(t *testing.T) {
	content := tarOf(t, goodTree...)
	m := testManifest(content)
	ar := archive(t, m, content)
	// Two archives back to back: each read takes exactly its own.
	r := bytes.NewReader(append(append([]byte(nil), ar...), ar...))
	for i := range 2 {
		got, c, err := read(r, 1<<20)
		if err != nil {
			t.Fatalf("archive %d: %v", i, err)
		}
		if !bytes.Equal(c, content) {
			t.Fatalf("archive %d: content differs", i)
		}
		if got.Digest != m.Digest || got.Base != m.Base || got.Limits != m.Limits || got.Network == nil || got.Network.Allow == nil ||
			got.Labels["k"] != "v" || len(got.Env) != 1 || got.Format != Version {
			t.Fatalf("archive %d: manifest %+v, want %+v", i, got, m)
		}
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left", r.Len())
	}
	// The header is the documented one.
	if string(ar[:8]) != "\x89SNAP\r\n\x1a" || binary.BigEndian.Uint32(ar[8:]) != 1 || int(binary.BigEndian.Uint32(ar[12:]))+16+len(content) != len(ar) {
		t.Fatalf("header % x", ar[:16])
	}
}

// TestRefused: every damaged or hostile archive is refused, with its
// error.
func TestRefused(t *testing.T) {
	good := tarOf(t, goodTree...)
	withContent := func(content []byte) []byte { return archive(t, testManifest(content), content) }
	withManifest := func(edit func(*Manifest)) []byte {
		m := testManifest(good)
		edit(m)
		return archive(t, m, good)
	}
	rawManifest := func(js string) []byte {
		var b bytes.Buffer
		b.WriteString(Magic)
		binary.Write(&b, binary.BigEndian, uint32(1))
		binary.Write(&b, binary.BigEndian, uint32(len(js)))
		b.WriteString(js)
		return b.Bytes()
	}
	ar := withContent(good)
	hostile := func(es ...entry) []byte { return withContent(tarOf(t, es...)) }
	for _, c := range []struct {
		name  string
		ar    []byte
		bound int64
		want  error
		say   string
	}{
		{"empty", nil, 0, ErrTruncated, "header"},
		{"not an archive", []byte("PK\x03\x04 a zip file, not a snapshot"), 0, ErrFormat, "magic"},
		{"short and not an archive", []byte("{}"), 0, ErrFormat, "magic"},
		{"text-mangled", bytes.Replace(ar, []byte("\r\n"), []byte("\n"), 1), 0, ErrFormat, "magic"},
		{"version 2", append(append([]byte(Magic), 0, 0, 0, 2), ar[12:]...), 0, ErrVersion, "version 2"},
		{"manifest too large", append([]byte(Magic), 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff), 0, ErrTooLarge, "bound"},
		{"manifest not JSON", rawManifest("{nope"), 0, ErrFormat, "JSON"},
		{"manifest of another format", rawManifest(`{"format":2,"digest":"sha256:` + strings.Repeat("0", 64) + `","base_image":"x","workdir":"/w"}`), 0, ErrFormat, "format 2"},
		{"bad digest", withManifest(func(m *Manifest) { m.Digest = "md5:1234" }), 0, ErrFormat, "digest"},
		{"negative size", withManifest(func(m *Manifest) { m.Size = -1 }), 0, ErrFormat, "negative"},
		{"no base image", withManifest(func(m *Manifest) { m.Base = "" }), 0, ErrFormat, "base image"},
		{"truncated in header", ar[:10], 0, ErrTruncated, "header"},
		{"truncated in manifest", ar[:20], 0, ErrTruncated, "manifest"},
		{"truncated in content", ar[:len(ar)-len(good)+700], 0, ErrTruncated, "content"},
		{"truncated before the tar's end", ar[:len(ar)-1], 0, ErrTruncated, "content"},
		{"garbage after the tar", withContent(append(append([]byte(nil), good...), "junk"...)), 0, ErrFormat, "after the end"},
		{"not a tar", withContent(bytes.Repeat([]byte("x"), 2048)), 0, ErrFormat, "tar"},
		{"absolute name", hostile(entry{typ: tar.TypeReg, name: "/etc/passwd", data: "x"}), 0, ErrUnsafePath, "absolute"},
		{"climbing name", hostile(entry{typ: tar.TypeReg, name: "a/../../x", data: "x"}), 0, ErrUnsafePath, "climbs out"},
		{"file named .", hostile(entry{typ: tar.TypeReg, name: ".", data: ""}), 0, ErrUnsafePath, "working directory"},
		{"hard link out", hostile(entry{typ: tar.TypeLink, name: "h", link: "../../etc/shadow"}), 0, ErrUnsafePath, "hard link"},
		{"hard link absolute", hostile(entry{typ: tar.TypeLink, name: "h", link: "/etc/shadow"}), 0, ErrUnsafePath, "hard link"},
		{"hard link to a symlink", hostile(entry{typ: tar.TypeSymlink, name: "s", link: "/etc/shadow"}, entry{typ: tar.TypeLink, name: "h", link: "s"}), 0, ErrUnsafePath, "symbolic link"},
		{"hard link through a symlink", hostile(entry{typ: tar.TypeSymlink, name: "s", link: "/etc"}, entry{typ: tar.TypeLink, name: "h", link: "s/shadow"}), 0, ErrUnsafePath, "symbolic link"},
		{"file through a symlink", hostile(entry{typ: tar.TypeSymlink, name: "out", link: "/etc"}, entry{typ: tar.TypeReg, name: "out/passwd", data: "root::0:0::/:/bin/sh\n"}), 0, ErrUnsafePath, `"out"`},
		{"deep through a symlink", hostile(entry{typ: tar.TypeDir, name: "a/"}, entry{typ: tar.TypeSymlink, name: "a/b", link: "../.."}, entry{typ: tar.TypeDir, name: "a/./b/c/"}), 0, ErrUnsafePath, `"a/b"`},
		{"empty symlink", hostile(entry{typ: tar.TypeSymlink, name: "s", link: ""}), 0, ErrFormat, "empty target"},
		{"device", hostile(entry{typ: tar.TypeChar, name: "sda"}), 0, ErrFormat, "type"},
		{"fifo", hostile(entry{typ: tar.TypeFifo, name: "p"}), 0, ErrFormat, "type"},
		{"over the bound", hostile(entry{typ: tar.TypeReg, name: "a", data: "12345"}, entry{typ: tar.TypeReg, name: "b", data: "678"}), 7, ErrTooLarge, `"b"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := read(bytes.NewReader(c.ar), c.bound)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.say) {
				t.Fatalf("got %v; want %v saying %q", err, c.want, c.say)
			}
			if errors.Is(err, ErrTruncated) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%v does not wrap io.ErrUnexpectedEOF", err)
			}
		})
	}
	// At the bound exactly: accepted.
	if _, _, err := read(bytes.NewReader(hostile(entry{typ: tar.TypeReg, name: "a", data: "12345"}, entry{typ: tar.TypeReg, name: "b", data: "67"})), 7); err != nil {
		t.Fatalf("7 bytes of files under a bound of 7: %v", err)
	}
}

// TestReaderError: the reader's own error comes back as it is.
func TestReaderError(t *testing.T) {
	content := tarOf(t, goodTree...)
	ar := archive(t, testManifest(content), content)
	boom := errors.New("boom")
	_, _, err := read(io.MultiReader(bytes.NewReader(ar[:len(ar)-600]), errReader{boom}), 0)
	if !errors.Is(err, boom) || errors.Is(err, ErrFormat) {
		t.Fatalf("got %v, want boom", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestIncrementalHash: the checker's prefix hashes (written piece by
// piece) equal the hash of the whole name.
func TestIncrementalHash(t *testing.T) {
	c := NewChecker(0)
	c.links[c.sum("a/bb/ccc")] = struct{}{}
	if got := c.through("a/bb/ccc/d/e"); got != "a/bb/ccc" {
		t.Fatalf("through = %q", got)
	}
	if got := c.through("a/bb/cc/d"); got != "" {
		t.Fatalf("through = %q", got)
	}
	var h maphash.Hash
	h.SetSeed(c.seeds[0])
	h.WriteString("x")
	h.WriteString("/y")
	if h.Sum64() != maphash.String(c.seeds[0], "x/y") {
		t.Fatal("maphash of pieces differs from that of the whole")
	}
}

// TestHeaderWrites: a manifest over its bound is not written.
func TestHeaderWrites(t *testing.T) {
	m := testManifest(nil)
	m.Env = []string{"BIG=" + strings.Repeat("x", MaxManifest)}
	if _, err := WriteHeader(io.Discard, m); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a manifest of more than %d bytes: %v", MaxManifest, err)
	}
}

// FuzzRead: whatever the bytes, reading neither panics nor accepts
// content that is not what its manifest's digest names, and what it
// accepts has only entries inside the directory.
func FuzzRead(f *testing.F) {
	content := tarOf(f, goodTree...)
	ar := archive(f, testManifest(content), content)
	f.Add(ar, int64(0))
	f.Add(ar[:40], int64(0))
	through := tarOf(f, entry{typ: tar.TypeSymlink, name: "s", link: "/"}, entry{typ: tar.TypeReg, name: "s/x"})
	f.Add(archive(f, testManifest(through), through), int64(3))
	f.Add([]byte(Magic+"\x00\x00\x00\x01\x00\x00\x00\x02{}"), int64(1))
	f.Fuzz(func(t *testing.T, b []byte, bound int64) {
		m, got, err := read(bytes.NewReader(b), bound)
		if err != nil {
			return
		}
		if int64(len(got)) != m.Size {
			t.Fatalf("accepted %d bytes of content, manifest says %d", len(got), m.Size)
		}
		// Accepted content has only inside names.
		tr := tar.NewReader(bytes.NewReader(got))
		for {
			hdr, err := tr.Next()
			if err != nil {
				break
			}
			if _, err := local(hdr.Name); err != nil {
				t.Fatalf("accepted entry %q: %v", hdr.Name, err)
			}
		}
	})
}

// FuzzCheck: tars of fuzzed entries never make Check panic, and every
// accepted name stays inside.
func FuzzCheck(f *testing.F) {
	f.Add("a/b", "c", byte(tar.TypeSymlink), "a/b/c", byte(tar.TypeReg))
	f.Add("../x", "", byte(tar.TypeReg), "y", byte(tar.TypeLink))
	f.Fuzz(func(t *testing.T, n1, l1 string, t1 byte, n2 string, t2 byte) {
		c := NewChecker(0)
		var names []string
		for _, h := range []*tar.Header{{Name: n1, Linkname: l1, Typeflag: t1}, {Name: n2, Linkname: n1, Typeflag: t2}} {
			if c.Check(h) != nil {
				return
			}
			names = append(names, h.Name)
		}
		for _, n := range names {
			if _, err := local(n); err != nil {
				t.Fatalf("accepted %q: %v", n, err)
			}
		}
		if t1 == tar.TypeSymlink {
			if c1, _ := local(n1); c1 != "." && c1 != "" && strings.HasPrefix(pathClean(n2), c1+"/") {
				t.Fatalf("accepted %q through the symlink %q", n2, n1)
			}
		}
	})
}

func pathClean(s string) string { c, _ := local(s); return c }
