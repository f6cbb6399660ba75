// Package blob keeps a snapshot's content on the library's side: an
// archive written once, named by its SHA-256 digest, read any number of
// times concurrently, and held in a temporary file that has no name from
// the moment it is made, so that it is gone when it is closed or the
// process ends, however it ends.
package blob

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	f, err := os.CreateTemp(dir, "agentsandbox-snapshot-*")
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	// Unlinked at once: the file lives as long as f is open.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("blob: %w", err)
	}
	h := sha256.New()
	src := r
	if max > 0 {
		src = io.LimitReader(r, max+1)
	}
	n, err := io.Copy(io.MultiWriter(f, h), src)
	if err == nil && max > 0 && n > max {
		err = fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Blob{f: f, size: n, digest: "sha256:" + hex.EncodeToString(h.Sum(nil))}, nil
}

// Digest names the content: "sha256:" and its hex digest.
func (b *Blob) Digest() string { return b.digest }

// Size is the content's length in bytes.
func (b *Blob) Size() int64 { return b.size }

// Reader returns a reader of the whole content, independent of others.
func (b *Blob) Reader() io.Reader { return io.NewSectionReader(b.f, 0, b.size) }

// Close frees the blob's storage; readers fail afterwards.
func (b *Blob) Close() error { return b.f.Close() }
