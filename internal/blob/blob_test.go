package blob

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
