package tarsafe

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"
)

// ent is one crafted tar entry.
type ent struct {
	typ        byte
	name, link string
	body       string
	mode       int64
}

func file(name, body string) ent { return ent{typ: tar.TypeReg, name: name, body: body, mode: 0o644} }
func dirEnt(name string) ent     { return ent{typ: tar.TypeDir, name: name, mode: 0o755} }
func symlink(name, to string) ent {
	return ent{typ: tar.TypeSymlink, name: name, link: to, mode: 0o777}
}
func hardlink(name, to string) ent {
	return ent{typ: tar.TypeLink, name: name, link: to, mode: 0o644}
}

var testTime = time.Unix(1700000000, 0)

func mktar(tb testing.TB, ents ...ent) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		hdr := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, ModTime: testTime}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			tb.Fatalf("WriteHeader(%q): %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// layout places the destination three levels below base so that "..",
// "../.." and "../../.." all land somewhere checkContained can see, next to
// an "outside" sibling that must stay empty.
type layout struct{ base, dest, outside string }

func newLayout(tb testing.TB) layout {
	tb.Helper()
	base := tb.TempDir()
	l := layout{base, filepath.Join(base, "p", "q", "dest"), filepath.Join(base, "outside")}
	for _, d := range []string{l.dest, l.outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return l
}

// checkContained fails if anything exists under base except the destination
// tree and the empty outside directory.
func (l layout) checkContained(tb testing.TB) {
	tb.Helper()
	allowed := map[string]bool{".": true, "p": true, "p/q": true, "p/q/dest": true, "outside": true}
	err := filepath.WalkDir(l.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.base, p)
		rel = filepath.ToSlash(rel)
		if rel == "p/q/dest" {
			return fs.SkipDir
		}
		if !allowed[rel] {
			tb.Errorf("found %q outside the destination", rel)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// checkSymlinks fails if a symlink below dest points outside of it.
func checkSymlinks(tb testing.TB, dest string) {
	tb.Helper()
	root, err := os.OpenRoot(dest)
	if err != nil {
		tb.Fatal(err)
	}
	defer root.Close()
	err = filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		rel, _ := filepath.Rel(dest, p)
		target, _ := os.Readlink(p)
		if filepath.IsAbs(target) {
			tb.Errorf("symlink %q has absolute target %q", rel, target)
		}
		if _, err := root.Stat(rel); err != nil && strings.Contains(err.Error(), "escapes") {
			tb.Errorf("symlink %q -> %q escapes: %v", rel, target, err)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func extract(tb testing.TB, l layout, data []byte, opt ExtractOptions) error {
	tb.Helper()
	return Extract(bytes.NewReader(data), l.dest, opt)
}

func mustExtract(tb testing.TB, l layout, ents ...ent) {
	tb.Helper()
	if err := extract(tb, l, mktar(tb, ents...), ExtractOptions{}); err != nil {
		tb.Fatal(err)
	}
}

func readFile(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

type escapeCase struct {
	name  string
	plant func(tb testing.TB, l layout) // prepares dest before extraction
	ents  func(l layout) []ent
}

func plantSymlink(target func(l layout) string) func(testing.TB, layout) {
	return func(tb testing.TB, l layout) {
		if err := os.Symlink(target(l), filepath.Join(l.dest, "out")); err != nil {
			tb.Fatal(err)
		}
	}
}

var escapeCases = []escapeCase{
	{name: "dotdot", ents: func(layout) []ent { return []ent{file("../evil", "x")} }},
	{name: "dotdot in the middle", ents: func(layout) []ent { return []ent{file("a/../../evil", "x")} }},
	{name: "deep dotdot", ents: func(layout) []ent { return []ent{file("ok", "x"), file("../../../evil", "x")} }},
	{name: "dotdot dir", ents: func(layout) []ent { return []ent{dirEnt("../evil/")} }},
	{name: "absolute", ents: func(l layout) []ent { return []ent{file(l.outside+"/passwd", "x")} }},
	{name: "absolute dir", ents: func(l layout) []ent { return []ent{dirEnt(l.outside + "/d/")} }},
	{name: "empty name", ents: func(layout) []ent { return []ent{file("", "x")} }},
	{name: "dot as file", ents: func(layout) []ent { return []ent{file(".", "x")} }},
	{name: "symlink to root", ents: func(l layout) []ent {
		return []ent{symlink("l", "/"), file("l"+l.outside+"/x", "x")}
	}},
	{name: "symlink to absolute outside", ents: func(l layout) []ent {
		return []ent{symlink("l", l.outside), file("l/x", "x")}
	}},
	{name: "symlink dotdot", ents: func(layout) []ent { return []ent{symlink("l", "../../"), file("l/x", "x")} }},
	{name: "symlink dotdot in subdir", ents: func(layout) []ent {
		return []ent{dirEnt("sub/"), symlink("sub/l", "../../x")}
	}},
	{name: "symlink dotdot after dir", ents: func(layout) []ent { return []ent{symlink("l", "sub/../../x")} }},
	{name: "symlink below dot alias", ents: func(layout) []ent {
		// Lexically s/.. is the destination, physically its parent.
		return []ent{symlink("s", "."), symlink("s/l", ".."), file("s/l/x", "x")}
	}},
	{name: "symlink below subdir alias", ents: func(layout) []ent {
		return []ent{dirEnt("a/"), symlink("a/s", "."), symlink("a/s/l", "../.."), file("a/s/l/x", "x")}
	}},
	{name: "symlink empty target", ents: func(layout) []ent { return []ent{symlink("l", "")} }},
	{name: "hard link absolute", ents: func(layout) []ent { return []ent{hardlink("h", "/etc/passwd")} }},
	{name: "hard link dotdot", ents: func(layout) []ent { return []ent{hardlink("h", "../x")} }},
	{name: "hard link missing", ents: func(layout) []ent { return []ent{hardlink("h", "nothere")} }},
	{name: "hard link to symlink", ents: func(layout) []ent {
		// Hard-linking the link itself would move its ".." up one level.
		return []ent{dirEnt("sub/"), symlink("sub/up", ".."), hardlink("h", "sub/up")}
	}},
	{name: "hard link to dir", ents: func(layout) []ent { return []ent{dirEnt("d/"), hardlink("h", "d")} }},
	{name: "hard link to host file", plant: func(tb testing.TB, l layout) {
		if err := os.WriteFile(filepath.Join(l.dest, "secret"), []byte("s"), 0o600); err != nil {
			tb.Fatal(err)
		}
	}, ents: func(layout) []ent { return []ent{hardlink("h", "secret")} }},
	{name: "planted absolute symlink", plant: plantSymlink(func(l layout) string { return l.outside }),
		ents: func(layout) []ent { return []ent{file("out/x", "x")} }},
	{name: "planted relative symlink", plant: plantSymlink(func(layout) string { return "../../../outside" }),
		ents: func(layout) []ent { return []ent{file("out/x", "x")} }},
	{name: "planted symlink mkdir", plant: plantSymlink(func(l layout) string { return l.outside }),
		ents: func(layout) []ent { return []ent{dirEnt("out/d/")} }},
	{name: "symlink through planted symlink", plant: plantSymlink(func(l layout) string { return l.outside }),
		ents: func(layout) []ent { return []ent{symlink("l", "out/x")} }},
}

func TestExtractRefusesEscapes(t *testing.T) {
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayout(t)
			if tc.plant != nil {
				tc.plant(t, l)
			}
			err := extract(t, l, mktar(t, tc.ents(l)...), ExtractOptions{})
			if !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("err = %v, want ErrUnsafePath", err)
			}
			l.checkContained(t)
			if tc.plant == nil {
				checkSymlinks(t, l.dest)
			}
		})
	}
}

func TestExtractErrorQuotesName(t *testing.T) {
	l := newLayout(t)
	name := "../a\nb\xff"
	err := extract(t, l, mktar(t, file(name, "x")), ExtractOptions{})
	if !errors.Is(err, ErrUnsafePath) || !strings.Contains(err.Error(), strconv.Quote(name)) {
		t.Fatalf("err = %v, want ErrUnsafePath quoting %q", err, name)
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error contains a raw newline: %q", err)
	}
}

func TestCleanName(t *testing.T) {
	for name, want := range map[string]string{
		"a": "a", "./a/": "a", "a//b/./c": "a/b/c", "a/../b": "b", ".": ".", "./": ".",
		"": "", "/": "", "/a": "", "..": "", "../a": "", "a/../..": "", "a\x00b": "",
	} {
		got, err := cleanName(name)
		if want == "" {
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("cleanName(%q) = %q, %v; want ErrUnsafePath", name, got, err)
			}
		} else if got != want || err != nil {
			t.Errorf("cleanName(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
}

func TestExtractSymlinksInside(t *testing.T) {
	l := newLayout(t)
	mustExtract(t, l,
		symlink("a", "sub"), file("a/file", "1"), // dangling until a/file creates sub
		symlink("b", "."), file("b/x", "2"),
		dirEnt("d/"), symlink("d/up", ".."), file("d/up/y", "3"),
		symlink("t", "."), symlink("c", "t/.."), // stored cleaned: "."
		symlink("d/e/deep", "../../sub/file"),
		symlink("dangling", "nowhere/x"),
	)
	for name, want := range map[string]string{"sub/file": "1", "x": "2", "y": "3", "d/e/deep": "1"} {
		if got := readFile(t, filepath.Join(l.dest, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(l.dest, "a")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("a is not a symlink: %v %v", fi, err)
	}
	if got, _ := os.Readlink(filepath.Join(l.dest, "c")); got != "." {
		t.Errorf("c -> %q, want %q", got, ".")
	}
	l.checkContained(t)
	checkSymlinks(t, l.dest)
}

func TestExtractOddNames(t *testing.T) {
	names := []string{"with space", `quo"te's`, "new\nline", "ünïcödé/日本語.txt", "bad\xff\xfeutf8", "tab\there", strings.Repeat("long", 60)}
	var ents []ent
	for _, n := range names {
		ents = append(ents, file(n, "content of "+n))
	}
	l := newLayout(t)
	mustExtract(t, l, ents...)
	for _, n := range names {
		if got := readFile(t, filepath.Join(l.dest, n)); got != "content of "+n {
			t.Errorf("%q = %q", n, got)
		}
	}
	l.checkContained(t)
}

func TestExtractLargeFile(t *testing.T) {
	data := make([]byte, 10<<20)
	rand.Read(data)
	l := newLayout(t)
	mustExtract(t, l, file("big", string(data)))
	if got := readFile(t, filepath.Join(l.dest, "big")); got != string(data) {
		t.Fatal("10 MiB file differs after extraction")
	}
}

func TestExtractLimits(t *testing.T) {
	two := mktar(t, file("a", strings.Repeat("x", 600)), file("b", strings.Repeat("y", 400)))
	for _, tc := range []struct {
		opt  ExtractOptions
		fail bool
	}{
		{ExtractOptions{}, false},
		{ExtractOptions{MaxBytes: 1000, MaxEntries: 2}, false},
		{ExtractOptions{MaxBytes: 999}, true},
		{ExtractOptions{MaxBytes: 100}, true},
		{ExtractOptions{MaxEntries: 1}, true},
	} {
		l := newLayout(t)
		err := extract(t, l, two, tc.opt)
		if tc.fail != errors.Is(err, ErrTooLarge) || (!tc.fail && err != nil) {
			t.Errorf("%+v: err = %v, want failure %v", tc.opt, err, tc.fail)
		}
	}
}

func TestExtractModesAndTimes(t *testing.T) {
	l := newLayout(t)
	suid := file("suid", "x")
	suid.mode = 0o4755 | 0o2000 | 0o1000
	private := file("private", "x")
	private.mode = 0o600
	ro := dirEnt("ro/")
	ro.mode = 0o500
	open := dirEnt("open/")
	open.mode = 0o1777
	data := mktar(t, suid, private, ro, file("ro/f", "x"), open)
	// Ownership in the header must be ignored.
	var buf bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(data)), tar.NewWriter(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		hdr.Uid, hdr.Gid = 12345, 54321
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	if err := extract(t, l, buf.Bytes(), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{
		"suid": 0o755, "private": 0o600, "ro": fs.ModeDir | 0o755, "open": fs.ModeDir | 0o777,
	} {
		fi, err := os.Lstat(filepath.Join(l.dest, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid()) {
			t.Errorf("%s: owner %d:%d, want the current process", name, st.Uid, st.Gid)
		}
		if !fi.IsDir() && !fi.ModTime().Equal(testTime) {
			t.Errorf("%s: mtime %v, want %v", name, fi.ModTime(), testTime)
		}
	}
}

func TestExtractSkipsSpecialFiles(t *testing.T) {
	l := newLayout(t)
	mustExtract(t, l,
		ent{typ: tar.TypeFifo, name: "fifo", mode: 0o644},
		ent{typ: tar.TypeChar, name: "null", mode: 0o666},
		ent{typ: tar.TypeBlock, name: "../../../blk", mode: 0o666}, // skipped before name checks
		file("after", "x"),
	)
	entries, _ := os.ReadDir(l.dest)
	if len(entries) != 1 || entries[0].Name() != "after" {
		t.Errorf("dest holds %v, want only after", entries)
	}
	l.checkContained(t)
}

func TestExtractOverwrite(t *testing.T) {
	l := newLayout(t)
	victim := filepath.Join(l.outside, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(l.dest, "f"), []byte("old content"), 0o644))
	must(os.Link(victim, filepath.Join(l.dest, "hl")))       // host hard link to outside
	must(os.Symlink(victim, filepath.Join(l.dest, "sl")))    // host symlink to outside file
	must(os.Symlink(l.outside, filepath.Join(l.dest, "sd"))) // host symlink to outside dir
	mustExtract(t, l, file("f", "new"), file("hl", "evil"), file("sl", "evil"), dirEnt("sd/"), file("sd/x", "y"))
	for name, want := range map[string]string{"f": "new", "hl": "evil", "sl": "evil", "sd/x": "y"} {
		if got := readFile(t, filepath.Join(l.dest, name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := readFile(t, victim); got != "host" {
		t.Errorf("outside file changed to %q", got)
	}
	if entries, _ := os.ReadDir(l.outside); len(entries) != 1 {
		t.Errorf("outside holds %v", entries)
	}
}

func TestExtractHardLink(t *testing.T) {
	l := newLayout(t)
	mustExtract(t, l, file("f", "data"), symlink("s", "sub"), hardlink("s/h", "./f"), hardlink("h2", "s/h"))
	f, _ := os.Stat(filepath.Join(l.dest, "f"))
	for _, name := range []string{"sub/h", "h2"} {
		h, err := os.Stat(filepath.Join(l.dest, name))
		if err != nil || !os.SameFile(f, h) {
			t.Errorf("%s is not a hard link to f: %v", name, err)
		}
	}
}

func TestExtractFormatErrors(t *testing.T) {
	good := mktar(t, file("a", strings.Repeat("x", 2000)))
	// A pax header with a NUL inside the path record.
	var nul bytes.Buffer
	tw := tar.NewWriter(&nul)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "a\u00e9b", Format: tar.FormatPAX})
	tw.Close()
	raw := bytes.Replace(nul.Bytes(), []byte("a\u00e9b\n"), []byte("a\x00\x00b\n"), 1)
	for name, data := range map[string][]byte{
		"truncated": good[:1000],
		"garbage":   bytes.Repeat([]byte("junk"), 300),
		"nul":       raw,
	} {
		l := newLayout(t)
		err := extract(t, l, data, ExtractOptions{})
		if err == nil || errors.Is(err, ErrUnsafePath) {
			t.Errorf("%s: err = %v, want a format error", name, err)
		}
		l.checkContained(t)
	}
	if err := Extract(bytes.NewReader(good), filepath.Join(t.TempDir(), "missing"), ExtractOptions{}); err == nil {
		t.Error("missing destination: no error")
	}
}

// snapshot describes a tree: type, permissions, contents or target, mtime.
func snapshot(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			desc += " " + readFile(tb, p) + " " + fi.ModTime().UTC().String()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		}
		out[filepath.ToSlash(rel)] = desc
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func TestFromFSRoundTrip(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a", "b b", "ü"), 0o755))
	files := map[string]fs.FileMode{"top.txt": 0o644, "run.sh": 0o755, "a/secret": 0o600, "a/b b/ü/x.txt": 0o640, "a/empty": 0o644}
	for name, mode := range files {
		p := filepath.Join(src, name)
		must(os.WriteFile(p, []byte("data:"+name), mode))
		must(os.Chmod(p, mode))
		must(os.Chtimes(p, time.Time{}, time.Unix(1600000000, 123456789)))
	}
	must(os.Symlink("a/b b/ü/x.txt", filepath.Join(src, "link")))
	must(os.Symlink("../top.txt", filepath.Join(src, "a", "up")))

	var buf bytes.Buffer
	must(FromFS(&buf, os.DirFS(src), ".", Header{Uid: 1000, Gid: 1000}))
	l := newLayout(t)
	must(extract(t, l, buf.Bytes(), ExtractOptions{}))
	want, got := snapshot(t, src), snapshot(t, l.dest)
	delete(want, ".")
	delete(got, ".")
	if len(got) != len(want) {
		t.Errorf("extracted %d entries, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%q: got %q, want %q", k, got[k], v)
		}
	}

	// A subtree under a prefix.
	buf.Reset()
	must(FromFS(&buf, os.DirFS(src), "a", Header{Prefix: "workspace/"}))
	l = newLayout(t)
	must(extract(t, l, buf.Bytes(), ExtractOptions{}))
	if got := readFile(t, filepath.Join(l.dest, "workspace", "b b", "ü", "x.txt")); got != "data:a/b b/ü/x.txt" {
		t.Errorf("prefixed file = %q", got)
	}
}

func TestFromFSMapFS(t *testing.T) {
	mt := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	long := strings.Repeat("ñ", 120)
	fsys := fstest.MapFS{
		"x":           {Mode: fs.ModeDir | 0o700},
		"x/y.txt":     {Data: []byte("hello"), Mode: fs.ModeSetuid | 0o640},
		"x/" + long:   {Data: []byte("long")},
		"x/link":      {Data: []byte("y.txt"), Mode: fs.ModeSymlink | 0o777},
		"other/z.txt": {Data: []byte("z")},
	}
	var buf bytes.Buffer
	if err := FromFS(&buf, fsys, "x", Header{Uid: 1234, Gid: 5678, Prefix: "ws", ModTime: mt}); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Uid != 1234 || hdr.Gid != 5678 || hdr.Uname != "" || !hdr.ModTime.Equal(mt) {
			t.Errorf("%s: uid %d gid %d uname %q mtime %v", hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.ModTime)
		}
		switch hdr.Name {
		case "ws/x/y.txt", "ws/y.txt":
			if b, _ := io.ReadAll(tr); string(b) != "hello" || hdr.Mode != 0o640 {
				t.Errorf("y.txt: %q mode %o", b, hdr.Mode)
			}
		case "ws/link":
			if hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != "y.txt" {
				t.Errorf("link: type %c -> %q", hdr.Typeflag, hdr.Linkname)
			}
		}
	}
	want := []string{"ws/", "ws/link", "ws/y.txt", "ws/" + long}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Errorf("names %q, want %q", names, want)
	}
}

func TestFromFSErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		fsys   fs.FS
		prefix string
	}{
		"fifo":            {fsys: fstest.MapFS{"p": {Mode: fs.ModeNamedPipe}}},
		"symlink no read": {fsys: struct{ fs.FS }{fstest.MapFS{"l": {Data: []byte("x"), Mode: fs.ModeSymlink}}}},
		"bad prefix":      {fsys: fstest.MapFS{"f": {}}, prefix: "../up"},
		"absolute prefix": {fsys: fstest.MapFS{"f": {}}, prefix: "/abs"},
	} {
		if err := FromFS(io.Discard, tc.fsys, ".", Header{Prefix: tc.prefix}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSingleFile(t *testing.T) {
	var buf bytes.Buffer
	if err := SingleFile(&buf, "run me.py", []byte("print(1)"), 0o4755, 1000, 1001); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(tr)
	if hdr.Name != "run me.py" || hdr.Typeflag != tar.TypeReg || hdr.Mode != 0o755 || hdr.Uid != 1000 || hdr.Gid != 1001 ||
		string(body) != "print(1)" || time.Since(hdr.ModTime) > time.Minute {
		t.Errorf("header %+v body %q", hdr, body)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("second entry: %v", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", "/abs", "dir/", "nul\x00"} {
		if err := SingleFile(io.Discard, bad, nil, 0o644, 0, 0); err == nil {
			t.Errorf("SingleFile(%q): no error", bad)
		}
	}
}

func FuzzExtract(f *testing.F) {
	seedLayout := layout{outside: "/nonexistent/outside"}
	for _, tc := range escapeCases {
		f.Add(mktar(f, tc.ents(seedLayout)...))
	}
	f.Add(mktar(f, symlink("a", "sub"), file("a/file", "1"), symlink("b", "."), file("b/x", "2"),
		dirEnt("d/"), symlink("d/up", ".."), file("d/up/y", "3"), hardlink("h", "x")))
	f.Add(mktar(f, dirEnt("x/"), file("x/f", "data"), symlink("x/l", "f"), ent{typ: tar.TypeFifo, name: "p"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		l := newLayout(t)
		err := Extract(bytes.NewReader(data), l.dest, ExtractOptions{MaxBytes: 1 << 20, MaxEntries: 256})
		l.checkContained(t)
		checkSymlinks(t, l.dest)
		_ = err
	})
}

// TestExtractFaithful: with Faithful, links keep any target and their
// times, directories get exactly their header's bits (sticky included),
// set once everything is in them, and entries still never go through a
// link that leads out.
func TestExtractFaithful(t *testing.T) {
	dest := t.TempDir()
	ro := dirEnt("ro")
	ro.mode = 0o555
	sticky := dirEnt("sticky")
	sticky.mode = 0o1777
	data := mktar(t, ro, file("ro/f", "in a read-only dir"), sticky,
		symlink("abs", "/usr/bin/python3"), symlink("up", "../tmp"), symlink("ro/up2", "../../etc/passwd"))
	if err := Extract(bytes.NewReader(data), dest, ExtractOptions{Faithful: true}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"abs": "/usr/bin/python3", "up": "../tmp", "ro/up2": "../../etc/passwd"} {
		p := filepath.Join(dest, name)
		if got, err := os.Readlink(p); err != nil || got != want {
			t.Errorf("link %s -> %q, %v; want %q", name, got, err, want)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil || st.Mtim.Sec != testTime.Unix() {
			t.Errorf("link %s mtime %d, %v; want %d", name, st.Mtim.Sec, err, testTime.Unix())
		}
	}
	for name, want := range map[string]fs.FileMode{"ro": fs.ModeDir | 0o555, "sticky": fs.ModeDir | fs.ModeSticky | 0o777} {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", name, fi.Mode(), err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dest, "ro/f")); err != nil || string(b) != "in a read-only dir" {
		t.Errorf("ro/f: %q, %v", b, err)
	}
	os.Chmod(filepath.Join(dest, "ro"), 0o755) // for TempDir's cleanup

	// Through a link that leads out: refused, nothing written outside.
	dest2 := t.TempDir()
	data = mktar(t, symlink("out", "/"), file("out/pwned", "x"))
	err := Extract(bytes.NewReader(data), dest2, ExtractOptions{Faithful: true})
	if !errors.Is(err, ErrUnsafePath) {
		t.Errorf("entry through an absolute link: %v, want ErrUnsafePath", err)
	}
	if _, err := os.Lstat("/pwned"); err == nil {
		t.Errorf("/pwned was created")
	}
}

// TestExtractSkipLink runs the escape cases with SkipLink set: escaping
// symlinks are reported and left out, everything else is still refused,
// and nothing leaves the destination either way.
func TestExtractSkipLink(t *testing.T) {
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayout(t)
			if tc.plant != nil {
				tc.plant(t, l)
			}
			var skipped []string
			err := extract(t, l, mktar(t, tc.ents(l)...), ExtractOptions{SkipLink: func(name, target string) {
				skipped = append(skipped, name+" -> "+target)
			}})
			if err != nil && !errors.Is(err, ErrUnsafePath) {
				t.Fatalf("err = %v, want nil or ErrUnsafePath", err)
			}
			if err == nil && len(skipped) == 0 {
				t.Fatalf("no error and nothing skipped")
			}
			l.checkContained(t)
			if tc.plant == nil {
				checkSymlinks(t, l.dest)
			}
		})
	}

	// The rest of the archive is extracted around skipped links.
	l := newLayout(t)
	var skipped []string
	err := extract(t, l, mktar(t,
		dirEnt("venv/"), dirEnt("venv/bin/"),
		symlink("venv/bin/python", "/usr/bin/python3"),
		symlink("venv/bin/up", "../../../x"),
		symlink("venv/bin/py", "python"),
		file("venv/bin/activate", "# activate"),
		symlink("venv/lib64", "lib"),
	), ExtractOptions{SkipLink: func(name, target string) { skipped = append(skipped, name+" -> "+target) }})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[venv/bin/python -> /usr/bin/python3 venv/bin/up -> ../../../x]"; fmt.Sprint(skipped) != want {
		t.Errorf("skipped %v, want %s", skipped, want)
	}
	if got := readFile(t, filepath.Join(l.dest, "venv/bin/activate")); got != "# activate" {
		t.Errorf("activate = %q", got)
	}
	for name, want := range map[string]string{"venv/bin/py": "python", "venv/lib64": "lib"} {
		if got, err := os.Readlink(filepath.Join(l.dest, name)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", name, got, err, want)
		}
	}
	for _, name := range []string{"venv/bin/python", "venv/bin/up"} {
		if _, err := os.Lstat(filepath.Join(l.dest, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("skipped link %s exists: %v", name, err)
		}
	}
}

// TestExtractSparse checks that runs of zeros become holes: a 64 MiB file
// of zeros with a few bytes of data takes a few blocks, and reads back
// exactly.
func TestExtractSparse(t *testing.T) {
	const size = 64 << 20
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "sparse", Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("head"))
	tw.Write(make([]byte, size/2-8))
	tw.Write([]byte("midl"))
	tw.Write(make([]byte, size/2))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l := newLayout(t)
	if err := extract(t, l, buf.Bytes(), ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(l.dest, "sparse")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512
	t.Logf("apparent size %d, on disk %d", fi.Size(), blocks)
	if fi.Size() != size {
		t.Errorf("size %d, want %d", fi.Size(), size)
	}
	if blocks > 1<<20 {
		t.Errorf("%d bytes on disk for a file of zeros and 8 bytes of data", blocks)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	copy(want, "head")
	copy(want[size/2-4:], "midl")
	if !bytes.Equal(data, want) {
		t.Error("contents differ")
	}

	// A cut archive is still an error, however the cut falls.
	for _, cut := range []int{1024, 512 + 70<<10, 512 + 64<<10} {
		err := Extract(bytes.NewReader(buf.Bytes()[:cut]), t.TempDir(), ExtractOptions{})
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("archive cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
}
