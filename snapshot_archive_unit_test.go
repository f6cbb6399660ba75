package sandbox

// Engine-free tests of the snapshot archive: what WriteTo writes (never a
// credential), what ReadSnapshot makes of it (the same ID and settings,
// opts on top) and what it refuses. The engine tests (restores in another
// process) are in snapshot_archive_test.go.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/blob"
	"github.com/agentsandbox/sandbox/internal/snapfile"
)

// unitTar is a small working directory's tar, as a capture makes it.
func unitTar(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755, ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX})
	for _, name := range slices.Sorted(maps.Keys(files)) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(files[name])), Mode: 0o640, ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX})
		tw.Write([]byte(files[name]))
	}
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "d/link", Linkname: "/etc/passwd", Format: tar.FormatPAX})
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// unitSnapshot is a Snapshot of content made as Sandbox.Snapshot makes
// one, with the settings opts give.
func unitSnapshot(t testing.TB, content []byte, opts ...Option) *Snapshot {
	t.Helper()
	cfg, err := newConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := blob.Write(t.TempDir(), bytes.NewReader(content), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return &Snapshot{content: b, cfg: cfg, base: cfg.image, source: "source-id"}
}

const unitSecret = "Bearer sk-live-0123456789abcdef-never-in-an-archive"

var unitOpts = []Option{
	WithImage("registry.example/base:1"), WithUser("1234:5678"), WithWorkdir("/home/agent"), WithRuntime("runsc"),
	WithEnv("A=1", "B=two words"), WithLabels(map[string]string{"team": "rl"}),
	WithLimits(Limits{Memory: 256 << 20, Disk: 64 << 20, ExecTimeout: 5 * time.Second, CPUs: 0.5}),
	WithNetwork(NetworkPolicy{Allow: []string{"api.example.com", "10.1.2.0/24"},
		Credentials: []Credential{{Host: "api.example.com", Header: "Authorization", Value: unitSecret}}}),
}

// TestUnitSnapshotArchive: WriteTo writes the documented header and
// manifest and the content, never a credential's value in any encoding;
// ReadSnapshot gives back the same ID, content and settings (without
// the credential), with its opts on top.
func TestUnitSnapshotArchive(t *testing.T) {
	content := unitTar(t, map[string]string{"d/a": "alpha", "b": strings.Repeat("b", 100_000)})
	sn := unitSnapshot(t, content, unitOpts...)
	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo: %d bytes (%d in the buffer), %v", n, buf.Len(), err)
	}
	ar := buf.Bytes()
	for _, form := range []string{unitSecret, "sk-live-0123456789abcdef",
		base64.StdEncoding.EncodeToString([]byte(unitSecret)), base64.URLEncoding.EncodeToString([]byte(unitSecret)),
		hex.EncodeToString([]byte(unitSecret)), url.QueryEscape(unitSecret)} {
		if bytes.Contains(ar, []byte(form)) {
			t.Errorf("the archive holds the credential (as %q)", form)
		}
	}
	if !bytes.HasPrefix(ar, []byte("\x89SNAP\r\n\x1a\x00\x00\x00\x01")) || !bytes.HasSuffix(ar, content) {
		t.Fatalf("archive header % x, or the content is not at its end", ar[:16])
	}
	js := ar[16 : len(ar)-len(content)]
	for _, want := range []string{`"format":1`, `"digest":"` + sn.ID() + `"`, `"base_image":"registry.example/base:1"`,
		`"user":"1234:5678"`, `"workdir":"/home/agent"`, `"runtime":"runsc"`, `"env":["A=1","B=two words"]`,
		`"labels":{"team":"rl"}`, `"network":{"allow":["api.example.com","10.1.2.0/24"]}`, `"disk":67108864`, `"disk_given":true`} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("manifest lacks %s: %s", want, js)
		}
	}

	var logs bytes.Buffer
	got, err := ReadSnapshot(context.Background(), bytes.NewReader(ar),
		WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))), WithEnv("C=3"), WithLimits(Limits{PIDs: 99}))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Remove(context.Background())
	if got.ID() != sn.ID() || got.Size() != sn.Size() || got.base != sn.base || got.source != "source-id" {
		t.Errorf("read: ID %s size %d base %q source %q; written %s %d %q", got.ID(), got.Size(), got.base, got.source, sn.ID(), sn.Size(), sn.base)
	}
	if c, _ := io.ReadAll(got.content.Reader()); !bytes.Equal(c, content) {
		t.Error("the content read differs from the content written")
	}
	c, w := got.cfg, sn.cfg
	wantLimits := w.limits
	wantLimits.PIDs = 99
	if c.image != w.image || c.user != w.user || c.workdir != w.workdir || c.runtime != w.runtime || c.limits != wantLimits ||
		!slices.Equal(c.env, []string{"A=1", "B=two words", "C=3"}) || !maps.Equal(c.labels, w.labels) ||
		!slices.Equal(c.network.Allow, w.network.Allow) || c.network.Open || c.network.Credentials != nil || len(c.rules) != 2 ||
		!c.diskSet || c.tmpSet || c.timeout != DefaultTimeout {
		t.Errorf("settings read: %+v\nwritten: %+v", c, w)
	}
	if !strings.Contains(logs.String(), `"msg":"sandbox.snapshot.read"`) || !strings.Contains(logs.String(), sn.ID()) {
		t.Errorf("no sandbox.snapshot.read record: %s", logs.String())
	}

	// Written again, the archive is the same bytes.
	var again bytes.Buffer
	if _, err := got.WriteTo(&again); err != nil {
		t.Fatal(err)
	}
	wantAgain := unitSnapshot(t, content, append(unitOpts, WithEnv("C=3"), WithLimits(Limits{Memory: 256 << 20, Disk: 64 << 20, ExecTimeout: 5 * time.Second, CPUs: 0.5, PIDs: 99}))...)
	var want bytes.Buffer
	wantAgain.WriteTo(&want)
	if !strings.Contains(logs.String(), `"msg":"sandbox.snapshot.write"`) {
		t.Errorf("no sandbox.snapshot.write record in the read snapshot's log: %s", logs.String())
	}
	if !bytes.Equal(again.Bytes(), want.Bytes()) {
		t.Errorf("rewritten archive:\n%s\nwant\n%s", again.Bytes()[16:again.Len()-len(content)], want.Bytes()[16:want.Len()-len(content)])
	}

	// WithImage renames the base; no network in the manifest, none read.
	plain := unitSnapshot(t, content, WithImage("busybox"))
	buf.Reset()
	plain.WriteTo(&buf)
	if bytes.Contains(buf.Bytes(), []byte(`"network"`)) {
		t.Error("a manifest without network has a network")
	}
	mirror, err := ReadSnapshot(context.Background(), bytes.NewReader(buf.Bytes()), WithImage("mirror.example/busybox"))
	if err != nil {
		t.Fatal(err)
	}
	if mirror.base != "mirror.example/busybox" || !mirror.cfg.network.none() || mirror.cfg.user != "" {
		t.Errorf("read with WithImage: base %q network %+v user %q", mirror.base, mirror.cfg.network, mirror.cfg.user)
	}
	// An empty allow-list stays one.
	empty := unitSnapshot(t, content, WithNetwork(AllowHosts()))
	buf.Reset()
	empty.WriteTo(&buf)
	if e, err := ReadSnapshot(context.Background(), &buf); err != nil || e.cfg.network.Allow == nil || e.cfg.network.none() {
		t.Errorf("AllowHosts() read back: %v, %#v", err, e.cfg.network)
	}

	// Removed: not written.
	if err := plain.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.WriteTo(io.Discard); !errors.Is(err, ErrSnapshotRemoved) {
		t.Errorf("WriteTo after Remove: %v", err)
	}
}

// unitArchive encodes manifest m (its digest and size set from content
// unless set) and content.
func unitArchive(t testing.TB, m snapfile.Manifest, content []byte) []byte {
	t.Helper()
	if m.Digest == "" {
		sum := sha256.Sum256(content)
		m.Digest = "sha256:" + hex.EncodeToString(sum[:])
	}
	if m.Size == 0 {
		m.Size = int64(len(content))
	}
	if m.Base == "" {
		m.Base = "busybox"
	}
	if m.Workdir == "" {
		m.Workdir = "/workspace"
	}
	var b bytes.Buffer
	if _, err := snapfile.WriteHeader(&b, &m); err != nil {
		t.Fatal(err)
	}
	b.Write(content)
	return b.Bytes()
}

// TestUnitReadSnapshotRefused: each damaged or hostile archive is refused
// with its error, and nothing is left behind.
func TestUnitReadSnapshotRefused(t *testing.T) {
	good := unitTar(t, map[string]string{"f": "data"})
	goodAr := unitArchive(t, snapfile.Manifest{}, good)
	tarOf := func(hs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			h.Format = tar.FormatPAX
			tw.WriteHeader(h)
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
		tw.Close()
		return b.Bytes()
	}
	flipped := bytes.Clone(goodAr)
	flipped[bytes.Index(flipped, []byte("data"))] ^= 1 // a byte of a file's data: only the digest tells
	big := tarOf(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: 3 << 20})
	v2 := bytes.Clone(goodAr)
	v2[11] = 2
	for _, c := range []struct {
		name string
		ar   []byte
		opts []Option
		want []error
		say  string
	}{
		{"not a snapshot", []byte("GIF89a and so on and so on"), nil, []error{ErrSnapshotCorrupt}, "magic"},
		{"version 2", v2, nil, []error{ErrUnsupported}, "version 2"},
		{"manifest too large", append([]byte(snapfile.Magic), 0, 0, 0, 1, 0, 0x20, 0, 1), nil, []error{ErrSnapshotCorrupt, ErrTooLarge}, "bound"},
		{"digest mismatch", flipped, nil, []error{ErrSnapshotCorrupt}, "digest"},
		{"truncated", goodAr[:len(goodAr)-100], nil, []error{ErrSnapshotCorrupt, io.ErrUnexpectedEOF}, "ends"},
		{"truncated manifest", goodAr[:30], nil, []error{ErrSnapshotCorrupt, io.ErrUnexpectedEOF}, "manifest"},
		{"absolute entry", unitArchive(t, snapfile.Manifest{}, tarOf(&tar.Header{Typeflag: tar.TypeReg, Name: "/etc/cron.d/x", Size: 1})), nil,
			[]error{ErrSnapshotCorrupt, ErrUnsafePath}, "absolute"},
		{"climbing entry", unitArchive(t, snapfile.Manifest{}, tarOf(&tar.Header{Typeflag: tar.TypeReg, Name: "../../x", Size: 1})), nil,
			[]error{ErrSnapshotCorrupt, ErrUnsafePath}, "climbs out"},
		{"hard link out", unitArchive(t, snapfile.Manifest{}, tarOf(&tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../etc/shadow"})), nil,
			[]error{ErrSnapshotCorrupt, ErrUnsafePath}, "hard link"},
		{"through a link", unitArchive(t, snapfile.Manifest{}, tarOf(&tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc"},
			&tar.Header{Typeflag: tar.TypeReg, Name: "l/passwd", Size: 4})), nil, []error{ErrSnapshotCorrupt, ErrUnsafePath}, "symbolic link"},
		{"a device", unitArchive(t, snapfile.Manifest{}, tarOf(&tar.Header{Typeflag: tar.TypeBlock, Name: "sda"})), nil, []error{ErrSnapshotCorrupt}, "type"},
		{"files over the disk limit", unitArchive(t, snapfile.Manifest{Limits: snapfile.Limits{Disk: 2 << 20}}, big), nil, []error{ErrTooLarge}, "bound"},
		{"files over the reader's disk limit", unitArchive(t, snapfile.Manifest{}, big), []Option{WithLimits(Limits{Disk: 1 << 20})}, []error{ErrTooLarge}, "WithLimits"},
		{"content over the archive bound", unitArchive(t, snapfile.Manifest{Limits: snapfile.Limits{Disk: 1 << 20}, Size: 1 << 40}, good), nil, []error{ErrTooLarge}, "capture"},
		{"a reserved label", unitArchive(t, snapfile.Manifest{Labels: map[string]string{"dev.agentsandbox.owner": "x"}}, good), nil, []error{ErrSnapshotCorrupt}, "reserved"},
		{"workdir under /proc", unitArchive(t, snapfile.Manifest{Workdir: "/proc/self"}, good), nil, []error{ErrSnapshotCorrupt}, "/proc"},
		{"bad limits", unitArchive(t, snapfile.Manifest{Limits: snapfile.Limits{PIDs: 3}}, good), nil, []error{ErrSnapshotCorrupt}, "PIDs"},
		{"bad network rule", unitArchive(t, snapfile.Manifest{Network: &snapfile.Network{Allow: []string{"a b"}}}, good), nil, []error{ErrSnapshotCorrupt}, "WithNetwork"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("TMPDIR", dir)
			sn, err := ReadSnapshot(context.Background(), bytes.NewReader(c.ar), c.opts...)
			if err == nil {
				sn.Remove(context.Background())
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !errors.Is(err, w) {
					t.Errorf("%v: not %v", err, w)
				}
			}
			if !strings.Contains(err.Error(), c.say) {
				t.Errorf("%v: does not say %q", err, c.say)
			}
		})
	}
	// The good one is read, and what follows it is not.
	r := bytes.NewReader(append(bytes.Clone(goodAr), "next"...))
	sn, err := ReadSnapshot(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	sn.Remove(context.Background())
	if rest, _ := io.ReadAll(r); string(rest) != "next" {
		t.Errorf("ReadSnapshot read past the archive: %q left", rest)
	}
	// An ended context stops the read.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ReadSnapshot(ctx, bytes.NewReader(goodAr)); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadSnapshot with an ended context: %v", err)
	}
}
