package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/agentsandbox/sandbox/internal/blob"
)

// A removed snapshot's New, Fork and Image fail with ErrSnapshotRemoved,
// which matches ErrClosed, not ErrImageNotFound: the image is not what is
// missing. No engine: the refusal comes before any backend is asked.
func TestUnitSnapshotRemoved(t *testing.T) {
	ctx := context.Background()
	content, err := blob.Write(t.TempDir(), bytes.NewReader(nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	sn := &Snapshot{content: content, cfg: defaults(), base: "img:1"}
	if err := sn.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sn.Remove(ctx); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	for name, f := range map[string]func() error{
		"New":   func() error { _, err := sn.New(ctx); return err },
		"Fork":  func() error { _, err := sn.Fork(ctx, 2); return err },
		"Image": func() error { _, err := sn.Image(ctx); return err },
	} {
		err := f()
		switch {
		case !errors.Is(err, ErrSnapshotRemoved), !errors.Is(err, ErrClosed):
			t.Errorf("%s of a removed snapshot: %v, want ErrSnapshotRemoved (and ErrClosed)", name, err)
		case errors.Is(err, ErrImageNotFound), errors.Is(err, fs.ErrNotExist):
			t.Errorf("%s of a removed snapshot: %v, says an image or file is missing", name, err)
		}
	}
	if errors.Is(ErrClosed, ErrSnapshotRemoved) {
		t.Error("ErrClosed matches ErrSnapshotRemoved: a closed sandbox is no removed snapshot")
	}
}
