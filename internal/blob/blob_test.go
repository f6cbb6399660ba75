package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
)

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("snapshot\x00\xff"), 100_000)
	b, err := Write(dir, bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if want := "sha256:" + hex.EncodeToString(sum[:]); b.Digest() != want || b.Size() != int64(len(data)) {
		t.Fatalf("Digest, Size = %s, %d; want %s, %d", b.Digest(), b.Size(), want, len(data))
	}
	// Nothing named in dir: the file has no name.
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the blob left %d entries in its directory", len(ents))
	}
	// Concurrent readers each see the whole content.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			got, err := io.ReadAll(b.Reader())
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("Reader: %d bytes, %v", len(got), err)
			}
		})
	}
	wg.Wait()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(b.Reader()); err == nil {
		t.Fatal("a reader after Close read on")
	}
}

func TestWriteBound(t *testing.T) {
	if _, err := Write(t.TempDir(), strings.NewReader("12345"), 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("5 bytes under a bound of 4: %v", err)
	}
	b, err := Write(t.TempDir(), strings.NewReader("1234"), 4)
	if err != nil {
		t.Fatalf("4 bytes under a bound of 4: %v", err)
	}
	b.Close()
}

func TestWriteFailingReader(t *testing.T) {
	boom := errors.New("boom")
	if _, err := Write(t.TempDir(), io.MultiReader(strings.NewReader("x"), errReader{boom}), 0); !errors.Is(err, boom) {
		t.Fatalf("Write of a failing reader: %v", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestWriter: a blob written piece by piece, as ReadSnapshot checks its
// content, is the blob Write makes of the same bytes; past its bound it
// fails and keeps failing; Abort frees it.
func TestWriter(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("0123456789"), 300_000)
	w, err := NewWriter(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for p := data; len(p) > 0; {
		n := min(len(p), 513)
		if _, err := w.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	if w.Size() != int64(len(data)) {
		t.Fatalf("Size = %d", w.Size())
	}
	b, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	whole, err := Write(dir, bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	got, _ := io.ReadAll(b.Reader())
	if b.Digest() != whole.Digest() || !bytes.Equal(got, data) {
		t.Fatalf("piecewise blob %s (%d bytes), whole %s", b.Digest(), len(got), whole.Digest())
	}

	w, err = NewWriter(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("12345678")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("901")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("11 bytes under a bound of 10: %v", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a write after the bound: %v", err)
	}
	if _, err := w.Finish(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Finish after the bound: %v", err)
	}

	w, err = NewWriter(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("x"))
	w.Abort()
	if _, err := w.Finish(); err == nil {
		t.Fatal("Finish after Abort succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("%d entries left in the directory", len(ents))
	}
}

// TestWriteTo: WriteTo writes the whole content at the writer's offset,
// to a file (copied by the kernel), a file opened to append, a pipe and
// a buffer, while other readers read.
func TestWriteTo(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("blob\x00"), 700_000)
	b, err := Write(dir, bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want := append([]byte("head:"), data...)
	check := func(what string, got []byte, n int64, err error) {
		t.Helper()
		if err != nil || n != int64(len(data)) || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; content equal: %v", what, n, err, bytes.Equal(got, want))
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { // a reader beside
		if got, _ := io.ReadAll(b.Reader()); !bytes.Equal(got, data) {
			t.Error("a reader beside WriteTo read other bytes")
		}
	})
	for _, flag := range []int{os.O_RDWR, os.O_WRONLY | os.O_APPEND} {
		name := dir + "/out"
		f, err := os.OpenFile(name, os.O_CREATE|os.O_TRUNC|flag, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("head:")
		n, err := b.WriteTo(f)
		f.Close()
		got, _ := os.ReadFile(name)
		check(fmt.Sprintf("file (flags %#x)", flag), got, n, err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var piped []byte
	wg.Go(func() { piped, _ = io.ReadAll(pr) })
	pw.WriteString("head:")
	n, err := b.WriteTo(pw)
	pw.Close()
	wg.Wait()
	check("pipe", piped, n, err)
	buf := bytes.NewBufferString("head:")
	n, err = b.WriteTo(buf)
	check("buffer", buf.Bytes(), n, err)

	empty, err := Write(dir, strings.NewReader(""), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if n, err := empty.WriteTo(io.Discard); n != 0 || err != nil {
		t.Errorf("empty blob: %d, %v", n, err)
	}
}
