// Package snapfile encodes and decodes the archive a snapshot travels in
// between processes (Snapshot.WriteTo, ReadSnapshot), and checks, as it
// streams, that the content an untrusted archive carries is a snapshot's:
// a tar of a working directory, bounded, whose every entry stays inside
// it.
//
// The format, version 1 (docs/snapshot-format.md):
//
//	magic     8 bytes   89 53 4E 41 50 0D 0A 1A ("\x89SNAP\r\n\x1a")
//	version   4 bytes   big-endian uint32, 1
//	length    4 bytes   big-endian uint32, the manifest's length, at most MaxManifest
//	manifest  length bytes of JSON (Manifest)
//	content   Manifest.Size bytes: a tar archive (PAX) of the working directory
//
// Nothing follows the content: a reader reads exactly the archive, so
// archives can be sent back to back on one stream. Manifest.Digest is the
// SHA-256 of the content, which a reader checks before it trusts it.
package snapfile

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// Magic opens every archive. Like PNG's signature, its first byte is not
// ASCII and it holds a CR LF and a ^Z, so that a transfer that mangles
// text (7 bits, line endings) is caught at once.
const Magic = "\x89SNAP\r\n\x1a"

// Version is the format this package writes and the only one it reads. A
// change a reader of this version could misread (a field whose meaning
// changes, content in another form) takes a new version; a field readers
// may ignore does not.
const Version = 1

// MaxManifest bounds the manifest's length. A manifest is a few KiB (its
// environment, labels and network rules are what make it grow).
const MaxManifest = 1 << 20

// headerLen is the length of the magic, version and length.
const headerLen = len(Magic) + 4 + 4

// Errors of reading an archive; the errors returned wrap them and say
// more.
var (
	// ErrFormat: not an archive of this format, a manifest that is not
	// valid, or content that is not a snapshot's tar.
	ErrFormat = errors.New("snapfile: not a valid snapshot archive")
	// ErrVersion: an archive of another version of the format.
	ErrVersion = errors.New("snapfile: unsupported format version")
	// ErrTruncated: the archive ends before its end (also wraps
	// io.ErrUnexpectedEOF).
	ErrTruncated = errors.New("snapfile: archive truncated")
	// ErrTooLarge: a manifest or content over its bound.
	ErrTooLarge = errors.New("snapfile: over its bound")
	// ErrUnsafePath: an entry of the content that would land outside the
	// working directory.
	ErrUnsafePath = errors.New("snapfile: entry outside the working directory")
)

// Manifest is the archive's JSON manifest: the content's digest and size
// and the settings a restore needs. It never holds a credential of the
// network policy: only its rules.
type Manifest struct {
	Format  int               `json:"format"`            // Version
	Digest  string            `json:"digest"`            // "sha256:" and 64 lower-case hex digits, of the content
	Size    int64             `json:"size"`              // the content's length in bytes
	Base    string            `json:"base_image"`        // the image the source sandbox was made from
	Source  string            `json:"source,omitempty"`  // the source sandbox's ID
	User    string            `json:"user,omitempty"`    // as given to WithUser; "" for a user of the sandbox's own
	Workdir string            `json:"workdir"`           // absolute
	Limits  Limits            `json:"limits"`            // the source's limits, as they were in force
	Env     []string          `json:"env,omitempty"`     // given with WithEnv, "KEY=value"
	Labels  map[string]string `json:"labels,omitempty"`  // given with WithLabels
	Runtime string            `json:"runtime,omitempty"` // the OCI runtime, "" for the engine's default
	Network *Network          `json:"network,omitempty"` // nil: no network
}

// Limits are a sandbox's limits (sandbox.Limits), durations in
// nanoseconds.
type Limits struct {
	CPUs          float64 `json:"cpus"`
	Memory        int64   `json:"memory"`
	PIDs          int64   `json:"pids"`
	Disk          int64   `json:"disk"`
	FileSize      int64   `json:"file_size"`
	OpenFiles     int64   `json:"open_files"`
	ExecTimeoutNS int64   `json:"exec_timeout_ns"`
	OutputBytes   int64   `json:"output_bytes"`
	LifetimeNS    int64   `json:"lifetime_ns"`
	TmpSize       int64   `json:"tmp_size"`
	// DiskGiven and TmpSizeGiven say Disk and TmpSize were given rather
	// than defaults, which a backend keeping the working directory in
	// memory may size down to fit Memory.
	DiskGiven    bool `json:"disk_given,omitempty"`
	TmpSizeGiven bool `json:"tmp_size_given,omitempty"`
}

// Network is the network policy's rules, without credentials.
type Network struct {
	Allow []string `json:"allow"` // NetworkPolicy.Allow; [] (not null) for a proxy that allows nothing
	Open  bool     `json:"open,omitempty"`
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// check validates what a reader relies on before the content.
func (m *Manifest) check() error {
	switch {
	case m.Format != Version:
		return fmt.Errorf("%w: the manifest says format %d, the header %d", ErrFormat, m.Format, Version)
	case !digestRE.MatchString(m.Digest):
		return fmt.Errorf("%w: the manifest's digest %q is not sha256:<64 hex digits>", ErrFormat, trim(m.Digest))
	case m.Size < 0:
		return fmt.Errorf("%w: the manifest's content size %d is negative", ErrFormat, m.Size)
	case m.Base == "":
		return fmt.Errorf("%w: the manifest names no base image", ErrFormat)
	case m.Workdir == "":
		return fmt.Errorf("%w: the manifest names no working directory", ErrFormat)
	}
	return nil
}

// trim shortens s for an error message.
func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// WriteHeader writes the magic, version and m, which must describe the
// content that the caller writes next. m.Format is set to Version.
func WriteHeader(w io.Writer, m *Manifest) (int64, error) {
	m.Format = Version
	js, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("snapfile: manifest: %w", err)
	}
	if len(js) > MaxManifest {
		return 0, fmt.Errorf("%w: the manifest takes %d bytes, more than %d (the environment, labels or network rules are too large)", ErrTooLarge, len(js), MaxManifest)
	}
	buf := make([]byte, 0, headerLen+len(js))
	buf = append(buf, Magic...)
	buf = binary.BigEndian.AppendUint32(buf, Version)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(js)))
	buf = append(buf, js...)
	n, err := w.Write(buf)
	return int64(n), err
}

// ReadHeader reads the magic, version and manifest from r, and checks
// them. It reads nothing past the manifest.
func ReadHeader(r io.Reader) (*Manifest, error) {
	var h [headerLen]byte
	if n, err := io.ReadFull(r, h[:]); err != nil {
		if n > 0 && n < len(Magic) && !bytes.HasPrefix([]byte(Magic), h[:n]) {
			return nil, fmt.Errorf("%w: it starts with %q, not the snapshot archive's magic %q", ErrFormat, h[:n], Magic)
		}
		return nil, truncated("header", err)
	}
	if string(h[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("%w: it starts with %q, not the snapshot archive's magic %q", ErrFormat, h[:len(Magic)], Magic)
	}
	if v := binary.BigEndian.Uint32(h[len(Magic):]); v != Version {
		return nil, fmt.Errorf("%w: the archive is of format version %d; this library reads version %d (an archive of a later version needs a later library)", ErrVersion, v, Version)
	}
	n := binary.BigEndian.Uint32(h[len(Magic)+4:])
	if n > MaxManifest {
		return nil, fmt.Errorf("%w: %w: the manifest would take %d bytes, more than its bound of %d", ErrFormat, ErrTooLarge, n, MaxManifest)
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(r, js); err != nil {
		return nil, truncated("manifest", err)
	}
	m := new(Manifest)
	if err := json.Unmarshal(js, m); err != nil {
		return nil, fmt.Errorf("%w: the manifest is not valid JSON: %v", ErrFormat, err)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return m, nil
}

func truncated(what string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: it ends inside its %s: %w", ErrTruncated, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("snapfile: reading the %s: %w", what, err)
}

// copyBuffer is the size of the reads CopyContent makes.
const copyBuffer = 1 << 20

// CopyContent copies the content, exactly size bytes of r, to w, and
// checks as it goes (see Checker) that it is a snapshot's tar of at most
// bound bytes of file contents (0: no bound): a tar archive whose end is
// followed by nothing but zeros. It reads nothing past the content.
func CopyContent(w io.Writer, r io.Reader, size, bound int64) error {
	src := &countReader{r: io.LimitReader(r, size)}
	bufSize := int(min(max(size, 4096), copyBuffer)) // small content, small buffers
	br := bufio.NewReaderSize(src, bufSize)
	tee := io.TeeReader(br, w)
	tr := tar.NewReader(tee)
	c := NewChecker(bound)
	buf := make([]byte, bufSize)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return contentErr(src, size, "", err)
		}
		if err := c.Check(hdr); err != nil {
			return err
		}
		if _, err := io.CopyBuffer(discard{}, tr, buf); err != nil {
			return contentErr(src, size, hdr.Name, err)
		}
	}
	// The tar's end: what follows must be the zeros of its end blocks and
	// padding.
	if _, err := io.CopyBuffer(zeros{w}, br, buf); err != nil {
		return err
	}
	if src.n != size {
		return fmt.Errorf("%w: the content ends after %d of its %d bytes: %w", ErrTruncated, src.n, size, io.ErrUnexpectedEOF)
	}
	return nil
}

// contentErr describes an error reading the content's tar at entry name.
func contentErr(src *countReader, size int64, name string, err error) error {
	at := ""
	if name != "" {
		at = fmt.Sprintf(" at entry %q", trim(name))
	}
	switch {
	case src.err != nil: // the reader's own error, not the tar's
		return fmt.Errorf("snapfile: reading the content%s: %w", at, src.err)
	case errors.Is(err, io.ErrUnexpectedEOF) && src.n < size:
		return fmt.Errorf("%w: the content ends after %d of its %d bytes%s: %w", ErrTruncated, src.n, size, at, io.ErrUnexpectedEOF)
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrUnsafePath), errors.Is(err, ErrFormat):
		return err
	}
	return fmt.Errorf("%w: the content is not a valid tar archive%s: %v", ErrFormat, at, err)
}

// countReader counts what it reads and keeps the reader's error.
type countReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// discard is io.Discard without ReadFrom, so that io.CopyBuffer uses the
// buffer given (io.Discard's own is 8 KiB).
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// zeros passes on only zero bytes.
type zeros struct{ w io.Writer }

func (z zeros) Write(p []byte) (int, error) {
	for i, b := range p {
		if b != 0 {
			return i, fmt.Errorf("%w: data after the end of the content's tar archive", ErrFormat)
		}
	}
	return z.w.Write(p)
}

// Checker checks a snapshot's tar entries, in order, for Check. Its memory
// grows by 16 bytes (and a map entry's overhead) per symbolic link.
type Checker struct {
	bound int64 // most bytes of file contents; 0: no bound
	bytes int64 // of file contents so far
	n     int64 // entries so far
	seeds [2]maphash.Seed
	links map[[2]uint64]struct{} // the names of the symbolic links so far, hashed
}

// NewChecker returns a checker of an archive of at most bound bytes of
// file contents (0: no bound).
func NewChecker(bound int64) *Checker {
	return &Checker{bound: bound, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, links: map[[2]uint64]struct{}{}}
}

// Check refuses an entry that a capture of a working directory does not
// make or that would reach outside it:
//   - an entry other than a directory, regular file, symbolic link or
//     hard link (ErrFormat);
//   - a name that is empty, absolute, holds NUL, or climbs out with ".."
//     (ErrUnsafePath);
//   - a hard link whose target is such a name, or a symbolic link of the
//     archive (ErrUnsafePath);
//   - an entry (or hard link target) whose path runs through a symbolic
//     link of the archive: a capture never makes one, and extracted it
//     could be written through the link, wherever it leads (ErrUnsafePath);
//   - a symbolic link with an empty target or one holding NUL (ErrFormat);
//   - regular files adding up to more than the bound (ErrTooLarge).
//
// Symbolic links may point anywhere (an absolute path, out of the
// directory): a snapshot keeps them as they were, and a restore never
// writes through them.
func (c *Checker) Check(hdr *tar.Header) error {
	c.n++
	name, err := local(hdr.Name)
	if err != nil {
		return fmt.Errorf("%w: entry %d, %q: %v", ErrUnsafePath, c.n, trim(hdr.Name), err)
	}
	if name == "." && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("%w: entry %d, %q: only a directory may name the working directory itself", ErrUnsafePath, c.n, trim(hdr.Name))
	}
	if l := c.through(name); l != "" {
		return fmt.Errorf("%w: entry %d, %q: its path runs through the symbolic link %q of the archive", ErrUnsafePath, c.n, trim(hdr.Name), trim(l))
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
	case tar.TypeReg:
		if c.bound > 0 && hdr.Size > c.bound-c.bytes {
			return fmt.Errorf("%w: entry %d, %q: file contents add up to more than the bound of %d bytes", ErrTooLarge, c.n, trim(hdr.Name), c.bound)
		}
		c.bytes += hdr.Size
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: entry %d, %q: a symbolic link with an empty target or one holding NUL", ErrFormat, c.n, trim(hdr.Name))
		}
		c.links[c.sum(name)] = struct{}{}
	case tar.TypeLink:
		target, err := local(hdr.Linkname)
		if err == nil && target == "." {
			err = errors.New("it names the working directory")
		}
		if err != nil {
			return fmt.Errorf("%w: entry %d, %q: hard link target %q: %v", ErrUnsafePath, c.n, trim(hdr.Name), trim(hdr.Linkname), err)
		}
		l := c.through(target)
		if l == "" {
			if _, ok := c.links[c.sum(target)]; ok {
				l = target
			}
		}
		if l != "" {
			return fmt.Errorf("%w: entry %d, %q: hard link target %q runs through the symbolic link %q of the archive", ErrUnsafePath, c.n, trim(hdr.Name), trim(hdr.Linkname), trim(l))
		}
	default:
		return fmt.Errorf("%w: entry %d, %q: of type %q, which a snapshot never holds (only directories, regular files and links)", ErrFormat, c.n, trim(hdr.Name), hdr.Typeflag)
	}
	return nil
}

// local cleans a name of the archive, refusing one that does not stay in
// the directory.
func local(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("empty name")
	case strings.ContainsRune(name, 0):
		return "", errors.New("the name holds NUL")
	case path.IsAbs(name):
		return "", errors.New("absolute name")
	}
	c := path.Clean(name)
	if c != "." && !filepath.IsLocal(c) {
		return "", errors.New("the name climbs out of the working directory")
	}
	return c, nil
}

// through returns the first proper ancestor of the cleaned name that is
// a symbolic link of the archive, or "".
func (c *Checker) through(name string) string {
	if len(c.links) == 0 {
		return ""
	}
	var h [2]maphash.Hash
	h[0].SetSeed(c.seeds[0])
	h[1].SetSeed(c.seeds[1])
	start := 0
	for i := 0; i < len(name); i++ {
		if name[i] != '/' {
			continue
		}
		h[0].WriteString(name[start:i])
		h[1].WriteString(name[start:i])
		start = i
		if _, ok := c.links[[2]uint64{h[0].Sum64(), h[1].Sum64()}]; ok {
			return name[:i]
		}
	}
	return ""
}

// sum hashes a cleaned name as through hashes its ancestors.
func (c *Checker) sum(name string) [2]uint64 {
	return [2]uint64{maphash.String(c.seeds[0], name), maphash.String(c.seeds[1], name)}
}
