package tarsafe

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// fuzzLayout is where FuzzExtractGuarantees extracts: the destination six
// levels below base, so that runs of ".." land where checkOutside sees
// them, next to a directory holding a victim file that must stay as it is.
// One layout serves every input of a fuzzing process, its destination
// emptied for each: creating directories is what takes the time, on a
// disk file system more than on tmpfs, which is used if there is one.
type fuzzLayout struct{ base, dest, victim string }

const (
	fuzzDest    = "1/2/3/4/5/6/dest"
	fuzzVictim  = "outside/victim"
	victimBytes = "the host's own file\n"
)

func newFuzzLayout(f *testing.F) fuzzLayout {
	f.Helper()
	base, err := os.MkdirTemp("/dev/shm", "tarsafe-fuzz-")
	if err != nil {
		base = f.TempDir()
	} else {
		f.Cleanup(func() { os.RemoveAll(base) })
	}
	l := fuzzLayout{base, filepath.Join(base, filepath.FromSlash(fuzzDest)), filepath.Join(base, filepath.FromSlash(fuzzVictim))}
	if err := os.MkdirAll(l.dest, 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(l.victim), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(l.victim, []byte(victimBytes), 0o644); err != nil {
		f.Fatal(err)
	}
	return l
}

// reset empties the destination.
func (l fuzzLayout) reset(tb testing.TB) {
	tb.Helper()
	// Faithful modes can lock RemoveAll out, should it not run as root.
	filepath.WalkDir(l.dest, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o755)
		}
		return nil
	})
	if err := os.RemoveAll(l.dest); err != nil {
		tb.Fatal(err)
	}
	if err := os.Mkdir(l.dest, 0o755); err != nil {
		tb.Fatal(err)
	}
}

// checkOutside fails if anything but the destination's parents, the
// destination and the victim (unchanged, with no other name) exists under
// base.
func (l fuzzLayout) checkOutside(tb testing.TB) {
	tb.Helper()
	allowed := map[string]bool{".": true, "outside": true, fuzzVictim: true}
	for p := fuzzDest; p != "."; p = path.Dir(p) {
		allowed[p] = true
	}
	err := filepath.WalkDir(l.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.base, p)
		rel = filepath.ToSlash(rel)
		if !allowed[rel] {
			tb.Errorf("%q created outside the destination", rel)
		}
		if rel == fuzzDest {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(l.victim, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG ||
		st.Mode&0o7777 != 0o644 || st.Nlink != 1 {
		tb.Errorf("victim outside the destination: %+v, %v", st, err)
	}
	if b, err := os.ReadFile(l.victim); err != nil || string(b) != victimBytes {
		tb.Errorf("victim outside the destination now holds %q, %v", b, err)
	}
}

// checkDest checks what Extract documents about the destination's tree:
// only directories, regular files and symlinks; regular files without
// setuid, setgid or sticky bits, hard-linked only among themselves (every
// link of an inode is in the tree), of at most opt.MaxBytes bytes in all;
// at most opt.MaxEntries files and symlinks; and, unless opt.Faithful,
// symlinks whose targets, followed through the tree as the kernel would,
// never leave it.
func checkDest(tb testing.TB, dest string, opt ExtractOptions) {
	tb.Helper()
	links := map[uint64]uint64{} // inode: names seen
	nlink := map[uint64]uint64{} // inode: link count
	var size int64
	var nonDirs int
	err := filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dest, p)
		rel = filepath.ToSlash(rel)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if opt.Faithful {
				// Exact modes could lock the walk out.
				if err := os.Chmod(p, 0o755); err != nil {
					return err
				}
			} else if st.Mode&(syscall.S_ISUID|syscall.S_ISGID|syscall.S_ISVTX) != 0 {
				tb.Errorf("directory %q has mode %o", rel, st.Mode)
			}
			return nil
		case syscall.S_IFREG:
			if st.Mode&(syscall.S_ISUID|syscall.S_ISGID|syscall.S_ISVTX) != 0 {
				tb.Errorf("file %q has mode %o", rel, st.Mode)
			}
			if links[st.Ino] == 0 {
				size += st.Size
			}
			links[st.Ino]++
			nlink[st.Ino] = uint64(st.Nlink)
		case syscall.S_IFLNK:
			if !opt.Faithful {
				if err := symlinkStaysIn(dest, rel); err != nil {
					tb.Error(err)
				}
			}
		default:
			tb.Errorf("%q has file type %o", rel, st.Mode&syscall.S_IFMT)
		}
		nonDirs++
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	for ino, n := range links {
		if nlink[ino] != n {
			tb.Errorf("inode %d: %d links in the destination, %d in all", ino, n, nlink[ino])
		}
	}
	if opt.MaxBytes > 0 && size > opt.MaxBytes {
		tb.Errorf("%d bytes of files, MaxBytes %d", size, opt.MaxBytes)
	}
	if opt.MaxEntries > 0 && nonDirs > opt.MaxEntries {
		tb.Errorf("%d files and links, MaxEntries %d", nonDirs, opt.MaxEntries)
	}
}

// symlinkStaysIn follows the symlink at rel (slash-separated, below dest,
// in a directory that is no symlink) the way the kernel resolves a path,
// taking missing components lexically, and returns an error if that ever
// leaves dest. It is written independently of Extract's resolve.
func symlinkStaysIn(dest, rel string) error {
	var cur []string // where the walk is, below dest; never a symlink
	if d := path.Dir(rel); d != "." {
		cur = strings.Split(d, "/")
	}
	todo := []string{path.Base(rel)}
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return fmt.Errorf("symlink %q leads outside the destination", rel)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		p := filepath.Join(dest, filepath.FromSlash(path.Join(path.Join(cur...), c)))
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			cur = append(cur, c)
			continue
		}
		if hops++; hops > 40 {
			return nil // ELOOP: the kernel goes nowhere
		}
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		if filepath.IsAbs(target) {
			return fmt.Errorf("symlink %q: %q on its way has the absolute target %q", rel, p, target)
		}
		todo = append(strings.Split(filepath.ToSlash(target), "/"), todo...)
	}
	return nil
}

// fileBytes is how many bytes of regular files the archive data claims,
// as far as it parses (sparse files at their apparent size).
func fileBytes(data []byte) int64 {
	var n int64
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if hdr == nil || (err != nil && err != tar.ErrInsecurePath) {
			return n
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse {
			n += max(hdr.Size, 0)
		}
	}
}

// fuzzOptions are the option sets every input is extracted with.
var fuzzOptions = []ExtractOptions{
	{},
	{MaxBytes: 1000, MaxEntries: 5},
	{Faithful: true},
	{Faithful: true, MaxBytes: 100, MaxEntries: 3},
}

// unlimitedBytes is the most file data an input may claim for the option
// sets without MaxBytes: a sparse entry claims any size with a few bytes,
// and without a limit Extract writes all of it, as documented.
const unlimitedBytes = 4 << 20

// FuzzExtractGuarantees extracts arbitrary bytes as a tar stream with each
// set of options into a fresh directory, and checks what Extract
// guarantees once it has returned, error or not: nothing was created,
// changed or linked outside the destination (checkOutside), and inside it
// only what the documentation allows (checkDest: no symlink leads out
// unless Faithful, limits hold). (FuzzExtract, in tarsafe_test.go, checks
// containment with one set of options.)
func FuzzExtractGuarantees(f *testing.F) {
	for _, seed := range fuzzSeeds(f) {
		f.Add(seed)
	}
	l := newFuzzLayout(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		unlimitedOK := fileBytes(data) <= unlimitedBytes
		for _, opt := range fuzzOptions {
			if opt.MaxBytes == 0 && !unlimitedOK {
				continue
			}
			l.reset(t)
			err := Extract(bytes.NewReader(data), l.dest, opt)
			checkDest(t, l.dest, opt)
			l.checkOutside(t)
			if t.Failed() {
				t.Fatalf("options %+v (Extract: %v)", opt, err)
			}
		}
	})
}

// fuzzSeeds are real archives of every kind the fuzzer should start from.
func fuzzSeeds(tb testing.TB) [][]byte {
	seedLayout := layout{outside: "/nonexistent/outside"}
	var seeds [][]byte
	for _, tc := range escapeCases {
		seeds = append(seeds, mktar(tb, tc.ents(seedLayout)...))
	}
	seeds = append(seeds,
		mktar(tb, dirEnt("d/"), file("d/f", "data"), file("top", "x"), symlink("d/l", "f"), hardlink("d/h", "d/f")),
		mktar(tb, file("../up", "x"), file("/abs", "x"), file("a/../../b", "x")),
		mktar(tb, symlink("l", "../.."), file("l/x", "through the link")),
		mktar(tb, symlink("l", "/etc"), file("l/passwd", "through the link")),
		mktar(tb, symlink("a", "sub"), file("a/file", "1"), symlink("b", "."), file("b/x", "2")),
		mktar(tb, dirEnt("s/"), symlink("s/up", ".."), symlink("s/up2", "up/.."), file("s/up2/x", "y")),
		mktar(tb, file("f", "x"), hardlink("h", "f"), hardlink("h2", "h"), file("f", "replaced"), hardlink("h3", "/etc/passwd")),
		mktar(tb, dirEnt("ro"), file("ro/f", "x"), symlink("ro", "/"), file("ro/y", "z")),
		mktar(tb, ent{typ: tar.TypeChar, name: "dev"}, ent{typ: tar.TypeFifo, name: "../fifo"}, file("ok", "x")),
	)
	seeds = append(seeds, withHeaders(tb,
		&tar.Header{Typeflag: tar.TypeReg, Name: "pax/" + strings.Repeat("é", 120), Format: tar.FormatPAX, Size: 3},
		&tar.Header{Typeflag: tar.TypeReg, Name: "../" + strings.Repeat("é", 120), Format: tar.FormatPAX, Size: 3},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "paxlink", Linkname: strings.Repeat("../", 60) + "etc", Format: tar.FormatPAX},
		&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "global", PAXRecords: map[string]string{"path": "/etc/passwd"}},
	))
	seeds = append(seeds, withHeaders(tb,
		&tar.Header{Typeflag: tar.TypeReg, Name: strings.Repeat("long/", 60) + "name", Format: tar.FormatGNU, Size: 3},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "gnulink", Linkname: strings.Repeat("x/", 100) + "../../..", Format: tar.FormatGNU},
	))
	// A file claiming far more data than the stream holds.
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "huge", Size: 1 << 40, Mode: 0o644}); err != nil {
		tb.Fatal(err)
	}
	huge.WriteString("only this")
	seeds = append(seeds, huge.Bytes())
	// Old GNU sparse files: a small one, and one of a terabyte of holes.
	seeds = append(seeds, gnuSparse(tb, "sparse", 20, [][2]int64{{0, 5}, {10, 5}}, "helloworld"))
	seeds = append(seeds, gnuSparse(tb, "sparse-huge", 1<<40, [][2]int64{{1<<40 - 5, 5}}, "tail!"))
	// PAX sparse files, format 0.1 (map in the records) and 1.0 (map at
	// the start of the data).
	seeds = append(seeds, paxSparse(tb, map[string]string{"GNU.sparse.size": "100", "GNU.sparse.numblocks": "1",
		"GNU.sparse.map": "50,5", "GNU.sparse.name": "../pax-sparse-0.1"}, "fived"))
	seeds = append(seeds, paxSparse(tb, map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
		"GNU.sparse.realsize": "1099511627776", "GNU.sparse.name": "pax-sparse-1.0"},
		"1\n50\n5\n"+strings.Repeat("\x00", 512-7)+"fived"))
	return seeds
}

// withHeaders is an archive of the given headers, each followed by
// hdr.Size bytes of data.
func withHeaders(tb testing.TB, hdrs ...*tar.Header) []byte {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag != tar.TypeXGlobalHeader {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			tb.Fatalf("%q: %v", h.Name, err)
		}
		if _, err := io.Copy(tw, io.LimitReader(strings.NewReader(strings.Repeat("d", int(h.Size))), h.Size)); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// gnuSparse is an archive of one old GNU sparse file ('S') of apparent size
// real, whose data fragments (offset, length) hold data, built by hand:
// archive/tar no longer writes them.
func gnuSparse(tb testing.TB, name string, real int64, frags [][2]int64, data string) []byte {
	tb.Helper()
	if len(frags) > 4 {
		tb.Fatal("gnuSparse: at most 4 fragments")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), Format: tar.FormatGNU}); err != nil {
		tb.Fatal(err)
	}
	io.WriteString(tw, data)
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	b := buf.Bytes()
	h := b[:512]
	octal := func(field []byte, v int64) {
		s := strconv.FormatInt(v, 8)
		if len(s) > len(field)-1 { // base-256 for what octal cannot hold
			for i := range field {
				field[i] = 0
			}
			binary.BigEndian.PutUint64(field[len(field)-8:], uint64(v))
			field[0] = 0x80
			return
		}
		copy(field, strings.Repeat("0", len(field)-1-len(s))+s+"\x00")
	}
	h[156] = tar.TypeGNUSparse
	for i, fr := range frags {
		octal(h[386+24*i:386+24*i+12], fr[0])
		octal(h[386+24*i+12:386+24*i+24], fr[1])
	}
	h[482] = 0 // no extension blocks
	octal(h[483:495], real)
	checksum(h)
	return b
}

// checksum sets the checksum of the header block h.
func checksum(h []byte) {
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h[:512] {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// paxSparse is an archive of one file with the given PAX records and data,
// built by hand: archive/tar does not write GNU.sparse records.
func paxSparse(tb testing.TB, records map[string]string, data string) []byte {
	tb.Helper()
	var rec strings.Builder
	for _, k := range slices.Sorted(maps.Keys(records)) {
		line := " " + k + "=" + records[k] + "\n"
		n := len(line) + 1
		for len(strconv.Itoa(n))+len(line) != n {
			n++
		}
		fmt.Fprintf(&rec, "%d%s", n, line)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// The extended header, written as a regular file and retyped.
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "PaxHeaders/x", Size: int64(rec.Len()), Format: tar.FormatUSTAR}); err != nil {
		tb.Fatal(err)
	}
	io.WriteString(tw, rec.String())
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "x", Size: int64(len(data)), Mode: 0o644, Format: tar.FormatUSTAR}); err != nil {
		tb.Fatal(err)
	}
	io.WriteString(tw, data)
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	b := buf.Bytes()
	b[156] = tar.TypeXHeader
	checksum(b)
	return b
}
