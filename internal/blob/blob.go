// Package blob keeps a snapshot's content on the library's side: an
// archive written once, named by its SHA-256 digest, read any number of
// times concurrently, and held in a temporary file that has no name from
// the moment it is made, so that it is gone when it is closed or the
// process ends, however it ends.
package blob

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// ErrTooLarge is returned by Write for content over its bound.
var ErrTooLarge = errors.New("blob: content over its bound")

// Blob is content written once. It is safe for concurrent use.
type Blob struct {
	f      *os.File
	size   int64
	digest string
}

// Write copies r into a new blob in directory dir (os.TempDir() if "").
// With max > 0, content of more than max bytes is an error wrapping
// ErrTooLarge.
func Write(dir string, r io.Reader, max int64) (*Blob, error) {
	w, err := NewWriter(dir, max)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Abort()
		return nil, err
	}
	return w.Finish()
}

// Writer makes a blob of what is written to it, for content that is
// checked as it streams in. Finish or Abort it.
type Writer struct {
	f   *os.File
	buf *bufio.Writer // in front of f: small writes are not one system call each
	h   hash.Hash
	n   int64
	max int64
	err error
}

// writeBuffer is the Writer's buffer in front of its file.
const writeBuffer = 1 << 20

// NewWriter starts a blob in directory dir (os.TempDir() if ""). With
// max > 0, writing more than max bytes fails with an error wrapping
// ErrTooLarge.
func NewWriter(dir string, max int64) (*Writer, error) {
	f, err := os.CreateTemp(dir, "agentsandbox-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	// Unlinked at once: the file lives as long as f is open.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("blob: %w", err)
	}
	return &Writer{f: f, buf: bufio.NewWriterSize(f, writeBuffer), h: sha256.New(), max: max}, nil
}

// Write adds p to the content.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.max > 0 && int64(len(p)) > w.max-w.n {
		w.err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, w.max)
		return 0, w.err
	}
	n, err := w.buf.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	if err != nil {
		w.err = fmt.Errorf("blob: %w", err)
	}
	return n, w.err
}

// Size is how many bytes were written so far.
func (w *Writer) Size() int64 { return w.n }

// Finish ends the content and returns the blob; after an error of Write
// it returns that error and frees the storage.
func (w *Writer) Finish() (*Blob, error) {
	err := w.err
	if err == nil {
		if err = w.buf.Flush(); err != nil {
			err = fmt.Errorf("blob: %w", err)
		}
	}
	if err != nil {
		w.f.Close()
		return nil, err
	}
	return &Blob{f: w.f, size: w.n, digest: "sha256:" + hex.EncodeToString(w.h.Sum(nil))}, nil
}

// Abort frees the storage of an unfinished blob.
func (w *Writer) Abort() {
	if w.err == nil {
		w.err = errors.New("blob: aborted")
	}
	w.f.Close()
}

// Digest names the content: "sha256:" and its hex digest.
func (b *Blob) Digest() string { return b.digest }

// Size is the content's length in bytes.
func (b *Blob) Size() int64 { return b.size }

// Reader returns a reader of the whole content, independent of others.
func (b *Blob) Reader() io.Reader { return io.NewSectionReader(b.f, 0, b.size) }

// copyBuffer is the buffer WriteTo copies through when the kernel does
// not copy.
const copyBuffer = 1 << 20

// WriteTo writes the whole content to w. To a regular file on the same
// file system it is copied by the kernel (on Linux), as cat copies;
// otherwise through a buffer of 1 MiB. It is safe beside other readers.
func (b *Blob) WriteTo(w io.Writer) (int64, error) {
	if f, ok := w.(*os.File); ok {
		if n, handled, err := b.copyToFile(f); handled {
			return n, err
		}
	}
	return io.CopyBuffer(writerOnly{w}, b.Reader(), make([]byte, min(b.size, copyBuffer)+1))
}

// writerOnly hides a ReaderFrom (an *os.File's copies 32 KiB at a
// time), so that io.CopyBuffer uses its buffer.
type writerOnly struct{ io.Writer }

// Close frees the blob's storage; readers fail afterwards.
func (b *Blob) Close() error { return b.f.Close() }
