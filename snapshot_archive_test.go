package sandbox_test

// Snapshots that travel, against the real engine: a snapshot written with
// WriteTo is read by another process (this test binary, run again), which
// restores it with New, Fork and a Pool and finds the same files, modes
// and times, and the same settings without the credentials; damaged
// archives of a real snapshot are refused; and the MiB/s of WriteTo and
// ReadSnapshot beside cat of the same bytes.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox"
)

// travelSecret is a credential the source sandbox's proxy has: no archive
// may hold it.
const travelSecret = "Bearer travel-0f1e2d3c4b5a69788796a5b4c3d2e1f0"

// travelOpts are the settings of the source sandbox, but its credential:
// what a pool restoring its snapshot needs.
func travelOpts() []sandbox.Option {
	return []sandbox.Option{
		sandbox.WithImage(busyboxImage), sandbox.WithEnv("ROLE=travel"),
		sandbox.WithLabels(map[string]string{"test": "travel"}),
		sandbox.WithLimits(sandbox.Limits{Disk: 64 << 20, PIDs: 64}),
		sandbox.WithNetwork(sandbox.AllowHosts("files.example.invalid")),
	}
}

// travelEnv names the archive TestSnapshotTravelsHelper reads, and
// travelOutEnv the file it writes its findings to.
const (
	travelEnv    = "AGENTSANDBOX_TRAVEL_ARCHIVE"
	travelOutEnv = "AGENTSANDBOX_TRAVEL_OUT"
)

// travelReport is what the helper found.
type travelReport struct {
	ID        string
	Manifests map[string]string // by restore: "new", "fork1", "fork2", "pool"
	Settings  string            // env and processes of the restored sandbox
	Err       string
}

// travelCheck is what each restored sandbox answers besides its manifest:
// its environment (the proxy, no CA: the credential did not travel), its
// limits, and whether the source's process runs in it (it must not).
const travelCheck = `echo "role=$ROLE proxy=${HTTPS_PROXY:+set} ca=${SSL_CERT_FILE:-none}"
ps -o comm | grep -qx sleep && echo "sleep runs" || echo "no sleep"
id -u | awk '{print ($1 >= 1000000000) ? "own user" : "user " $1}'
cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max`

// TestSnapshotTravelsHelper is not a test: run as a child process by
// TestSnapshotTravels, it reads the archive, restores it with New, Fork
// and a Pool, reports what it finds, and closes everything.
func TestSnapshotTravelsHelper(t *testing.T) {
	path := os.Getenv(travelEnv)
	if path == "" {
		t.Skip("helper process for TestSnapshotTravels")
	}
	rep := travelReport{Manifests: map[string]string{}}
	if err := travelHelper(t, path, &rep); err != nil {
		rep.Err = err.Error()
	}
	js, _ := json.Marshal(rep)
	if err := os.WriteFile(os.Getenv(travelOutEnv), js, 0o600); err != nil {
		t.Fatal(err)
	}
}

func travelHelper(t *testing.T, path string, rep *travelReport) error {
	ctx := testCtx(t)
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sn, err := sandbox.ReadSnapshot(ctx, f)
	if err != nil {
		return fmt.Errorf("ReadSnapshot: %w", err)
	}
	defer sn.Remove(context.Background())
	rep.ID = sn.ID()
	var sbs []*sandbox.Sandbox
	defer func() {
		for _, sb := range sbs {
			sb.Close()
		}
	}()
	look := func(name string, sb *sandbox.Sandbox) error {
		sbs = append(sbs, sb)
		for _, s := range []struct {
			script string
			into   *string
		}{{manifestScript, new(string)}, {travelCheck, &rep.Settings}} {
			r, err := sb.Exec(ctx, s.script)
			if err != nil || r.ExitCode != 0 {
				return fmt.Errorf("%s: Exec: %v %+v", name, err, r)
			}
			*s.into = r.Stdout
			if s.script == manifestScript {
				rep.Manifests[name] = r.Stdout
			}
		}
		return nil
	}
	sb, err := sn.New(ctx)
	if err != nil {
		return fmt.Errorf("New: %w", err)
	}
	if err := look("new", sb); err != nil {
		return err
	}
	forks, err := sn.Fork(ctx, 2)
	if err != nil {
		return fmt.Errorf("Fork: %w", err)
	}
	for i, f := range forks {
		if err := look(fmt.Sprintf("fork%d", i+1), f); err != nil {
			return err
		}
	}
	pool, err := sandbox.NewPool(ctx, 1, travelOpts()...)
	if err != nil {
		return err
	}
	defer pool.Close()
	sb, err = sn.New(ctx, sandbox.WithPool(pool))
	if err != nil {
		return fmt.Errorf("New with a pool: %w", err)
	}
	return look("pool", sb)
}

// TestSnapshotTravels: a snapshot of a sandbox with a few MiB of files
// and a running process, written to a file, is read by another process,
// which restores it (New, Fork, WithPool) with the same files, modes,
// times and links, and the source's settings without its credential;
// the archive never holds the credential; damaged copies of it are
// refused.
func TestSnapshotTravels(t *testing.T) {
	if os.Getenv(travelEnv) != "" {
		t.Skip("in the helper process")
	}
	t.Parallel()
	ctx := testCtx(t)
	src := newSandbox(t, append(travelOpts(), sandbox.WithNetwork(sandbox.NetworkPolicy{
		Allow:       []string{"files.example.invalid"},
		Credentials: []sandbox.Credential{{Host: "files.example.invalid", Header: "Authorization", Value: travelSecret}},
	}))...)
	snapRun(t, src, treeScript+`
head -c 3145728 /dev/urandom > big.bin && chmod 640 big.bin && touch -d '2011-11-11 11:11:11' big.bin
mkdir -p deep/er && head -c 1048576 /dev/urandom > deep/er/one.bin
`, 0)
	// A process that runs across the snapshot, holding a file of the
	// working directory open.
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	proc := src.Command(pctx, "sh", "-c", "exec 3>>held.log; echo started >&3; exec sleep 3600")
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	defer proc.Wait()
	waitExec(t, src, "grep -q started held.log && ps -o comm | grep -qx sleep")
	before := manifest(t, src)
	sn := takeSnapshot(t, src)

	path := filepath.Join(t.TempDir(), "snapshot.agentsandbox")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sn.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	ar, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(ar)) || n < 4<<20 {
		t.Fatalf("WriteTo wrote %d bytes, the file has %d", n, len(ar))
	}
	for _, form := range []string{travelSecret, "travel-0f1e2d3c4b5a69788796a5b4c3d2e1f0", base64.StdEncoding.EncodeToString([]byte(travelSecret))} {
		if bytes.Contains(ar, []byte(form)) {
			t.Errorf("the archive holds the credential (as %q)", form)
		}
	}
	t.Logf("snapshot %s: %d bytes of content, %d of archive", sn.ID(), sn.Size(), n)

	// Another process reads it and restores it.
	out := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSnapshotTravelsHelper$", "-test.count=1", "-test.v=false", "-test.timeout=15m")
	cmd.Env = append(os.Environ(), travelEnv+"="+path, travelOutEnv+"="+out)
	if said, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, said)
	}
	js, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep travelReport
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Err != "" {
		t.Fatalf("the other process: %s", rep.Err)
	}
	if rep.ID != sn.ID() {
		t.Errorf("the other process read snapshot %s, written %s", rep.ID, sn.ID())
	}
	for _, name := range []string{"new", "fork1", "fork2", "pool"} {
		if got := rep.Manifests[name]; got != before {
			t.Errorf("restored (%s) in the other process:\n%s\nwant (the source's):\n%s", name, got, before)
		}
	}
	if want := "role=travel proxy=set ca=none\nno sleep\nown user\n64\n"; rep.Settings != want {
		t.Errorf("the restored sandboxes' settings: %q, want %q", rep.Settings, want)
	}

	// Damaged copies of it are refused, each with its error.
	content := int(n - sn.Size()) // where the content starts
	flip := bytes.Clone(ar)
	flip[content+len(ar[content:])/2] ^= 0x40
	for _, c := range []struct {
		name string
		ar   []byte
		want []error
	}{
		{"a byte flipped", flip, []error{sandbox.ErrSnapshotCorrupt}},
		{"cut short", ar[:len(ar)-4096], []error{sandbox.ErrSnapshotCorrupt, io.ErrUnexpectedEOF}},
		{"cut in the manifest", ar[:content-10], []error{sandbox.ErrSnapshotCorrupt, io.ErrUnexpectedEOF}},
		{"the content alone", ar[content:], []error{sandbox.ErrSnapshotCorrupt}},
	} {
		got, err := sandbox.ReadSnapshot(ctx, bytes.NewReader(c.ar))
		if err == nil {
			got.Remove(ctx)
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: %v; want %v", c.name, err, w)
			}
		}
	}
	// Read in this process with a smaller disk than its files: refused.
	if _, err := sandbox.ReadSnapshot(ctx, bytes.NewReader(ar), sandbox.WithLimits(sandbox.Limits{Disk: 2 << 20})); !errors.Is(err, sandbox.ErrTooLarge) ||
		!strings.Contains(err.Error(), "WithLimits") {
		t.Errorf("read with a 2 MiB disk: %v; want ErrTooLarge", err)
	}
	stop()
}

// benchArchive makes a snapshot of about 64 MiB (16 files of 4 MiB of
// random bytes and a few small ones) and writes it to a file; it returns
// the snapshot and the file's path.
func benchArchive(b *testing.B) (*sandbox.Snapshot, string) {
	b.Helper()
	src := newSandbox(b)
	snapRun(b, src, `for i in $(seq 16); do head -c 4194304 /dev/urandom > f$i; done; mkdir d; for i in $(seq 200); do echo $i > d/$i; done`, 0)
	sn := takeSnapshot(b, src)
	path := filepath.Join(b.TempDir(), "bench.agentsandbox")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := sn.WriteTo(f); err != nil {
		b.Fatal(err)
	}
	return sn, path
}

// benchOut is a file the benchmark writes to, beside the archive.
func benchOut(b *testing.B, path string) *os.File {
	b.Helper()
	out, err := os.Create(path + ".out")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { out.Close() })
	return out
}

// rewind empties out and puts its offset at 0.
func rewind(b *testing.B, f *os.File) {
	if err := f.Truncate(0); err != nil {
		b.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSnapshotWriteTo: WriteTo of a 64 MiB snapshot to a file, in
// MiB/s; its floor is BenchmarkCatFloor, cat of the same bytes to a file
// in the same directory.
//
//	go test -run '^$' -bench 'SnapshotWriteTo|ReadSnapshot|CatFloor' -benchtime 20x -count 3 .
func BenchmarkSnapshotWriteTo(b *testing.B) {
	sn, path := benchArchive(b)
	out := benchOut(b, path)
	st, _ := os.Stat(path)
	b.SetBytes(st.Size())
	cpu := cpuTime()
	b.ResetTimer()
	for range b.N {
		rewind(b, out)
		if _, err := sn.WriteTo(out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportCPU(b, cpu)
}

// BenchmarkReadSnapshot: ReadSnapshot of a 64 MiB archive from a file
// (checked, hashed and kept in a temporary file), in MiB/s.
func BenchmarkReadSnapshot(b *testing.B) {
	ctx := context.Background()
	sn, path := benchArchive(b)
	in, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	st, _ := in.Stat()
	b.SetBytes(st.Size())
	cpu := cpuTime()
	b.ResetTimer()
	for range b.N {
		if _, err := in.Seek(0, io.SeekStart); err != nil {
			b.Fatal(err)
		}
		got, err := sandbox.ReadSnapshot(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if got.ID() != sn.ID() {
			b.Fatalf("read %s, wrote %s", got.ID(), sn.ID())
		}
		got.Remove(ctx)
	}
	b.StopTimer()
	reportCPU(b, cpu)
}

// BenchmarkCatFloor: cat of the same 64 MiB archive to a file in the same
// directory, the floor of WriteTo and ReadSnapshot. (GNU cat copies with
// copy_file_range(2), in the kernel; so does WriteTo to a file.)
func BenchmarkCatFloor(b *testing.B) {
	_, path := benchArchive(b)
	out := benchOut(b, path)
	st, _ := os.Stat(path)
	b.SetBytes(st.Size())
	b.ResetTimer()
	for range b.N {
		rewind(b, out)
		cmd := exec.Command("cat", path)
		cmd.Stdout = out
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHashCopyFloor: the same 64 MiB read, hashed with SHA-256 and
// written to a file in this process through a 1 MiB buffer: the part of
// ReadSnapshot's work that cat does not do (it must hash what it reads to
// check the digest, so the bytes pass through user space), without the
// tar's checks. (coreutils' sha256sum, without SHA-NI, is slower than
// Go's hash and no floor.)
func BenchmarkHashCopyFloor(b *testing.B) {
	_, path := benchArchive(b)
	out := benchOut(b, path)
	in, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Close()
	st, _ := in.Stat()
	b.SetBytes(st.Size())
	buf := make([]byte, 1<<20)
	cpu := cpuTime()
	b.ResetTimer()
	for range b.N {
		rewind(b, out)
		if _, err := in.Seek(0, io.SeekStart); err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.CopyBuffer(struct{ io.Writer }{io.MultiWriter(out, h)}, struct{ io.Reader }{in}, buf); err != nil {
			b.Fatal(err)
		}
		h.Sum(nil)
	}
	b.StopTimer()
	reportCPU(b, cpu)
}
