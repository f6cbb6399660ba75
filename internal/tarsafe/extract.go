// Package tarsafe unpacks tar streams produced by untrusted containers onto
// the host without letting them escape the destination directory, and builds
// the tar streams that are copied into containers.
//
// Extract is the security boundary: the stream is assumed hostile. Every
// filesystem operation goes through an [os.Root] opened on the destination,
// and entry names, symlink targets and hard-link targets are additionally
// validated so that nothing that points outside the destination is created.
package tarsafe

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// ErrUnsafePath is wrapped by the error Extract returns when an entry tries
// to reach outside the destination directory: absolute, empty or escaping
// names, names containing NUL, symlinks whose target is absolute or leaves
// the destination, hard links to anything but a regular file extracted
// earlier from the same stream, and paths running through a symlink that
// leads outside.
var ErrUnsafePath = errors.New("tarsafe: unsafe path")

// ErrTooLarge is wrapped by the error Extract returns when the stream exceeds
// ExtractOptions.MaxBytes or ExtractOptions.MaxEntries.
var ErrTooLarge = errors.New("tarsafe: archive too large")

// maxSymlinkHops bounds symlink resolution, like the kernel's ELOOP limit.
const maxSymlinkHops = 40

// ExtractOptions limits what Extract accepts. Zero values mean unlimited.
type ExtractOptions struct {
	// MaxBytes caps the total size of regular-file contents.
	MaxBytes int64
	// MaxEntries caps the number of tar headers, skipped ones included.
	MaxEntries int
	// Faithful extracts what the archive says, for extraction inside a
	// sandbox, where nothing can lead anywhere the sandbox's user could not
	// go anyway: symlinks keep whatever target they have (absolute, or
	// climbing out), with their modification times; directories get
	// exactly the header's permission, sticky and setgid bits (not 0755
	// plus them), applied once the stream has ended, so that a directory
	// without write permission can still be filled by an owner without
	// CAP_DAC_OVERRIDE; a hard link may name any regular file in dir, so
	// nothing is remembered per entry. Entries are still never created
	// through a link that leads outside dir.
	Faithful bool
	// SkipLink, when set, is called for each symbolic link that would
	// otherwise stop Extract with ErrUnsafePath (its target absolute,
	// empty or leading outside dir), with the entry's cleaned name and
	// the target; the link is not created and extraction goes on.
	SkipLink func(name, target string)
}

// Extract unpacks the tar stream r (for example the body of Docker's
// GET /containers/{id}/archive) into the existing directory dir and never
// creates, modifies or follows anything outside dir.
//
// Directories, regular files, symlinks and hard links are extracted; all
// other entry types (character and block devices, FIFOs, pax global headers,
// unknown types) are skipped silently without looking at their names.
// Entry names are cleaned ("a/../b" is "b"), and "." may only name a
// directory, which is then ignored. Files and directories are owned by the
// calling process whatever the header says: regular files get the header's
// permission bits without setuid, setgid or sticky, and its modification
// time; directories get 0755 plus the header's permission bits, and keep
// the time of their creation. A symlink is stored with its target cleaned,
// and only if that target, resolved from the link's real directory, stays
// inside dir. A hard link must name a regular file extracted earlier from
// the same stream. Whatever exists at an entry's path is removed first
// (non-empty directories are kept for directory entries and are an error
// otherwise), so nothing is ever written through an existing symlink or
// hard link. Entries may pass through symlinks that stay inside dir, such
// as "a" -> "sub" followed by "a/file".
//
// Extract stops at the first error; what was extracted before it remains.
// Escape attempts return an error wrapping ErrUnsafePath and exceeding opt
// an error wrapping ErrTooLarge; both quote the offending entry name.
// Anything already in dir is trusted to stay in place while Extract runs.
func Extract(r io.Reader, dir string, opt ExtractOptions) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("tarsafe: %w", err)
	}
	defer root.Close()
	x := &extractor{root: root, tr: tar.NewReader(r), opt: opt, files: map[string]bool{}, dir: dir}
	for n := 1; ; n++ {
		hdr, err := x.tr.Next()
		if err == io.EOF {
			return x.dirModes()
		}
		// ErrInsecurePath (GODEBUG tarinsecurepath=0) comes with a usable
		// header; entry rejects such names itself.
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return fmt.Errorf("tarsafe: reading archive: %w", err)
		}
		if opt.MaxEntries > 0 && n > opt.MaxEntries {
			return fmt.Errorf("%w: more than %d entries at %q", ErrTooLarge, opt.MaxEntries, hdr.Name)
		}
		if err := x.entry(hdr); err != nil {
			return fmt.Errorf("tarsafe: extracting %q: %w", hdr.Name, err)
		}
	}
}

type extractor struct {
	root  *os.Root
	tr    *tar.Reader
	opt   ExtractOptions
	bytes int64           // regular-file bytes written so far
	files map[string]bool // real paths of regular files extracted so far
	dirs  []dirMode       // Faithful: directory modes to set at the end
	dir   string          // the destination
}

type dirMode struct {
	name string
	perm fs.FileMode
}

// dirModes sets the directory modes of Faithful, deepest directories first.
func (x *extractor) dirModes() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.root.Chmod(x.dirs[i].name, x.dirs[i].perm); err != nil {
			return fmt.Errorf("tarsafe: %w", err)
		}
	}
	return nil
}

func unsafe(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrUnsafePath}, args...)...)
}

// cleanName validates a slash-separated name from the archive and returns it
// cleaned: "." or a relative path without empty, "." or ".." elements.
func cleanName(name string) (string, error) {
	c := path.Clean(name)
	if name == "" || !local(c) {
		return "", unsafe("invalid or escaping name")
	}
	return c, nil
}

// local reports whether the cleaned slash-separated path p stays lexically
// inside the directory it is relative to: it is not absolute, does not start
// with "..", holds no NUL and (on Windows) names no reserved device.
func local(p string) bool {
	return !strings.ContainsRune(p, 0) && filepath.IsLocal(filepath.FromSlash(p))
}

func (x *extractor) entry(hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		return nil // devices, FIFOs, global headers, unknown types
	}
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil
		}
		return unsafe("entry would replace the destination directory")
	}
	// Work on the real parent directory: its path contains no symlinks, so
	// ".." in a symlink target below can be checked exactly.
	parent, err := resolve(x.root, path.Dir(name))
	if err != nil {
		return err
	}
	if parent != "." {
		if err := x.root.MkdirAll(parent, 0o755); err != nil {
			return err
		}
	}
	dst := path.Join(parent, path.Base(name))
	perm := fs.FileMode(hdr.Mode) & fs.ModePerm

	switch hdr.Typeflag {
	case tar.TypeDir:
		if x.opt.Faithful {
			x.dirs = append(x.dirs, dirMode{dst, hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSticky | fs.ModeSetgid)})
			perm |= 0o700
		} else {
			perm |= 0o755
		}
		if fi, err := x.root.Lstat(dst); err != nil || !fi.IsDir() {
			if err := x.remove(dst); err != nil {
				return err
			}
			if err := x.root.Mkdir(dst, perm); err != nil {
				return err
			}
		}
		return x.root.Chmod(dst, perm)

	case tar.TypeSymlink:
		if x.opt.Faithful && hdr.Linkname != "" && !strings.ContainsRune(hdr.Linkname, 0) {
			if err := x.remove(dst); err != nil {
				return err
			}
			if err := x.root.Symlink(hdr.Linkname, dst); err != nil {
				return err
			}
			// dst was resolved: no link on the way to it.
			return setMtime(x.root, dst, hdr.ModTime)
		}
		target, err := x.linkTarget(parent, hdr.Linkname)
		if errors.Is(err, ErrUnsafePath) && x.opt.SkipLink != nil {
			x.opt.SkipLink(name, hdr.Linkname)
			return nil
		}
		if err != nil {
			return err
		}
		if err := x.remove(dst); err != nil {
			return err
		}
		return x.root.Symlink(filepath.FromSlash(target), dst)

	case tar.TypeLink:
		lname, err := cleanName(hdr.Linkname)
		if err != nil {
			return unsafe("hard link target %q is invalid or escapes", hdr.Linkname)
		}
		old, err := resolve(x.root, lname)
		if err != nil {
			return err
		}
		// Faithful: any regular file in dir (the sandbox's user could link
		// it anyway), so that memory does not grow with the entries.
		if fi, err := x.root.Lstat(old); err != nil || !(x.opt.Faithful || x.files[old]) || !fi.Mode().IsRegular() {
			return unsafe("hard link target %q is not a regular file from this archive", hdr.Linkname)
		}
		if err := x.remove(dst); err != nil {
			return err
		}
		if err := x.root.Link(old, dst); err != nil {
			return err
		}
		x.note(dst)
		return nil
	}

	// Regular file.
	if x.opt.MaxBytes > 0 && hdr.Size > x.opt.MaxBytes-x.bytes {
		return fmt.Errorf("%w: more than %d bytes of file data", ErrTooLarge, x.opt.MaxBytes)
	}
	x.bytes += hdr.Size
	if err := x.remove(dst); err != nil {
		return err
	}
	f, err := x.root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = writeSparse(f, x.tr)
	if err == nil {
		err = f.Chmod(perm) // on the descriptor: no umask, no path race
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x.note(dst)
	return setMtime(x.root, dst, hdr.ModTime)
}

// note records the regular file dst as extracted, a target for hard links
// that follow (Faithful extraction needs no record).
func (x *extractor) note(dst string) {
	if !x.opt.Faithful {
		x.files[dst] = true
	}
}

// linkTarget checks the target of a symlink to be created in the
// symlink-free directory parent and returns it cleaned.
func (x *extractor) linkTarget(parent, linkname string) (string, error) {
	if linkname == "" || path.IsAbs(linkname) || filepath.IsAbs(linkname) {
		return "", unsafe("absolute or empty symlink target %q", linkname)
	}
	// Cleaning leaves ".." only at the front, and they climb from the
	// symlink-free parent, so the lexical check below is exact for them;
	// what follows only descends, and resolve checks it.
	target := path.Clean(linkname)
	full := path.Join(parent, target)
	if !local(full) {
		return "", unsafe("symlink target %q escapes", linkname)
	}
	if _, err := resolve(x.root, full); err != nil {
		return "", err
	}
	return target, nil
}

// zeros is one block of writeSparse's.
var zeros [64 << 10]byte

// writeSparse copies r into the empty file f, leaving a hole wherever a
// whole block of zeros comes, so that a sparse file (whose holes the
// archive carries as zeros) takes no more disk than it did where it came
// from.
func writeSparse(f *os.File, r io.Reader) error {
	buf := make([]byte, len(zeros))
	var off int64
	for {
		n, err := fill(r, buf)
		if n == len(buf) && bytes.Equal(buf, zeros[:]) {
			off += int64(n)
		} else if n > 0 {
			if _, werr := f.WriteAt(buf[:n], off); werr != nil {
				return werr
			}
			off += int64(n)
		}
		if err == io.EOF {
			return f.Truncate(off) // a hole at the end
		}
		if err != nil {
			return err
		}
	}
}

// fill reads into buf until it is full or r fails; unlike io.ReadFull it
// reports r's own error (io.EOF only at a clean end).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// remove deletes whatever is at name (never following a final symlink);
// a missing name is fine, a non-empty directory is an error.
func (x *extractor) remove(name string) error {
	if err := x.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// resolve returns where the slash-separated path p really is inside root,
// following symlinks as the kernel would; components that do not exist are
// taken lexically. The result contains no symlinks and no "..". It fails
// with ErrUnsafePath if the walk would leave root.
func resolve(root *os.Root, p string) (string, error) {
	var cur []string // resolved components
	todo := strings.Split(p, "/")
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "", unsafe("path %q leads outside the destination", p)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		next := path.Join(path.Join(cur...), c)
		fi, err := root.Lstat(next)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			cur = append(cur, c)
			continue
		}
		if hops++; hops > maxSymlinkHops {
			return "", fmt.Errorf("resolving %q: too many symlinks", p)
		}
		target, err := root.Readlink(next)
		if err != nil {
			return "", err
		}
		if target == "" || filepath.IsAbs(target) || path.IsAbs(target) {
			return "", unsafe("path %q runs through symlink %q to %q", p, next, target)
		}
		todo = append(strings.Split(filepath.ToSlash(target), "/"), todo...)
	}
	if len(cur) == 0 {
		return ".", nil
	}
	return path.Join(cur...), nil
}
