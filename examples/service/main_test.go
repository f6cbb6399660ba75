package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/images"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

var (
	// image is SANDBOX_IMAGE or the project's busybox image: the scripts
	// need only a shell.
	image string
	// bin is the service's program, built once.
	bin string
)

func TestMain(m *testing.M) {
	os.Setenv("AGENTSANDBOX_PULL", "never") // tests never reach a registry (the service inherits it)
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	// On an engine that puts no resource limits in force (rootless Podman
	// on cgroup v1) New refuses the service's sandboxes, which have the
	// default limits: its tests do not apply there.
	if caps, err := sandbox.DefaultDriver.Caps(ctx); err == nil && caps.NoResourceLimits {
		fmt.Fprintf(os.Stderr, "not applicable on %v: it puts no resource limits in force (driver.Caps.NoResourceLimits), and the service's sandboxes have the default limits\n", caps.Engine)
		return 0
	}
	var err error
	if image = os.Getenv(images.EnvImage); image == "" {
		image, err = images.Ensure(ctx, images.Busybox, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "test image:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "examples-service-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "service")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the service: %v\n%s", err, out)
		return 1
	}
	return sandboxtest.Main(m)
}

// client makes no connection that outlives its request (sandboxtest.Main
// counts idle connections' goroutines as left behind).
var client = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// service is a running service process.
type service struct {
	t      *testing.T
	cmd    *exec.Cmd
	url    string
	stderr lockedBuffer

	mu     sync.Mutex
	lines  []string      // its standard output so far
	change chan struct{} // a line came
	done   chan struct{} // the output ended

	stopped sync.Once
	exit    error // how it exited, once stopped
}

// start runs the service with label, lease and the extra flags, and waits
// until it serves.
func start(t *testing.T, label, lease string, flags ...string) *service {
	t.Helper()
	args := append([]string{"-addr", "127.0.0.1:0", "-image", image, "-label", label, "-lease", lease}, flags...)
	s := &service{t: t, cmd: exec.Command(bin, args...), change: make(chan struct{}, 1), done: make(chan struct{})}
	s.cmd.Stderr = &s.stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go s.read(out)
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		t.Logf("a service's output:\n%s", s.output())
	})
	began := time.Now()
	line := s.waitFor("listening on ", 2*time.Minute)
	_, addr, _ := strings.Cut(line, "listening on ")
	s.url = "http://" + strings.TrimSpace(addr)
	t.Logf("the service served %v after its start", time.Since(began).Round(time.Millisecond))
	return s
}

func (s *service) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		s.mu.Lock()
		s.lines = append(s.lines, sc.Text())
		s.mu.Unlock()
		select {
		case s.change <- struct{}{}:
		default:
		}
	}
	close(s.done)
}

// output is what the service printed so far.
func (s *service) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// printed says whether the service printed a line containing substr.
func (s *service) printed(substr string) bool {
	return strings.Contains(s.output(), substr)
}

// waitFor returns the first line the service printed that contains
// substr, waiting up to timeout for it.
func (s *service) waitFor(substr string, timeout time.Duration) string {
	s.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		for _, l := range s.lines {
			if strings.Contains(l, substr) {
				s.mu.Unlock()
				return l
			}
		}
		s.mu.Unlock()
		select {
		case <-s.change:
		case <-s.done:
			s.t.Fatalf("the service ended without printing %q: %v; its output:\n%s\nits stderr:\n%s",
				substr, s.stop(0), s.output(), s.stderr.String())
		case <-deadline.C:
			s.t.Fatalf("the service did not print %q within %v; its output:\n%s", substr, timeout, s.output())
		}
	}
}

// stop sends sig (none if 0) and waits for the service to exit; it returns
// how it exited.
func (s *service) stop(sig syscall.Signal) error {
	s.stopped.Do(func() {
		if sig != 0 {
			s.cmd.Process.Signal(sig)
		}
		<-s.done
		s.exit = s.cmd.Wait()
	})
	return s.exit
}

// kill ends the service with SIGKILL: no Detach, no clean-up.
func (s *service) kill() {
	s.t.Helper()
	if err := s.stop(syscall.SIGKILL); err == nil || !strings.Contains(err.Error(), "killed") {
		s.t.Fatalf("SIGKILL: the service exited with %v", err)
	}
}

// call sends a request with body (JSON-encoded, if not nil) and returns the
// answer's status, decoding its JSON body into out (if not nil and the
// status is 2xx).
func (s *service) call(method, path string, body, out any) int {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.url+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v; the service's output:\n%s", method, path, err, s.output())
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	if resp.StatusCode/100 == 2 && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			s.t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
	if resp.StatusCode/100 != 2 {
		s.t.Logf("%s %s: %s %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	return resp.StatusCode
}

func (s *service) create() string {
	s.t.Helper()
	var made struct{ ID string }
	if code := s.call("POST", "/sandboxes", nil, &made); code != http.StatusCreated || made.ID == "" {
		s.t.Fatalf("POST /sandboxes: %d %+v", code, made)
	}
	return made.ID
}

func (s *service) exec(id, script string) (ExecResult, int) {
	s.t.Helper()
	var res ExecResult
	code := s.call("POST", "/sandboxes/"+id+"/exec", ExecRequest{Script: script}, &res)
	return res, code
}

func (s *service) list() map[string]Sandbox {
	s.t.Helper()
	var infos []Sandbox
	if code := s.call("GET", "/sandboxes", nil, &infos); code != http.StatusOK {
		s.t.Fatalf("GET /sandboxes: %d", code)
	}
	m := map[string]Sandbox{}
	for _, in := range infos {
		m[in.ID] = in
	}
	return m
}

// newLabel returns a label of the test's own, and ends every sandbox that
// carries it when the test ends (after its services were killed), then
// prunes what remains: no object of the library is left behind.
func newLabel(t *testing.T) string {
	label := fmt.Sprintf("examples-service-test-%s-%d", strings.ToLower(t.Name()), time.Now().UnixNano())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		match := sandbox.WithLabels(map[string]string{"app": label})
		infos, err := sandbox.List(ctx, match)
		if err != nil {
			t.Errorf("clean-up: %v", err)
			return
		}
		for _, in := range infos {
			if !in.Running {
				continue
			}
			t.Logf("clean-up: %s still runs: closing it", in.ID)
			if sb, err := sandbox.Open(ctx, in.ID); err != nil {
				t.Errorf("clean-up: %v", err)
			} else if err := sb.Close(); err != nil {
				t.Errorf("clean-up: %v", err)
			}
		}
		if _, err := sandbox.Prune(ctx); err != nil {
			t.Errorf("clean-up: %v", err)
		}
		if infos, err := sandbox.List(ctx, match); err != nil || len(infos) != 0 {
			t.Errorf("after the clean-up and Prune, the test's label still finds %+v (%v)", infos, err)
		}
	})
	return label
}

// The service is SIGKILLed with two sandboxes holding a file each: started
// again, it lists and reopens them, and the files are there. SIGTERM
// detaches them for the next start, and DELETE ends them.
func TestRestartReopens(t *testing.T) {
	t.Parallel()
	label := newLabel(t)
	svc := start(t, label, "1m")
	ids := []string{svc.create(), svc.create()}
	note := func(id string) string { return "note of " + id[:12] }
	for _, id := range ids {
		res, code := svc.exec(id, fmt.Sprintf("printf '%%s' '%s' > note && cat note", note(id)))
		if code != http.StatusOK || res.ExitCode != 0 || res.Stdout != note(id) {
			t.Fatalf("writing the note in %s: %d %+v", id, code, res)
		}
	}
	if res, code := svc.exec(ids[0], "echo out; echo err >&2; exit 3"); code != http.StatusOK ||
		res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
		t.Errorf("a failing script: %d %+v", code, res)
	}
	listed := svc.list()
	for _, id := range ids {
		in, ok := listed[id]
		if !ok || !in.Running || !in.Leased || !in.Open || in.Lease != "1m0s" || in.Image != image || in.Labels["app"] != label ||
			in.Expires == nil || in.Expires.Before(time.Now()) {
			t.Errorf("GET /sandboxes: %s is %+v (listed %v)", id, in, ok)
		}
	}
	if len(listed) != 2 {
		t.Errorf("GET /sandboxes lists %d sandboxes, want 2: %+v", len(listed), listed)
	}

	svc.kill()
	svc = start(t, label, "1m")
	for _, id := range ids {
		if !svc.printed("reopened " + id) {
			t.Errorf("the restarted service did not reopen %s; its output:\n%s", id, svc.output())
		}
	}
	listed = svc.list()
	for _, id := range ids {
		if in := listed[id]; !in.Running || !in.Open {
			t.Errorf("after the restart, GET /sandboxes: %s is %+v", id, in)
		}
		if res, code := svc.exec(id, "cat note"); code != http.StatusOK || res.ExitCode != 0 || res.Stdout != note(id) {
			t.Errorf("after the restart, the note in %s: %d %+v", id, code, res)
		}
	}
	if _, code := svc.exec("no-such-sandbox", "true"); code != http.StatusNotFound {
		t.Errorf("exec in an unknown sandbox: %d, want 404", code)
	}

	// A clean stop detaches; the next start reopens them again.
	if err := svc.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: the service exited with %v; its output:\n%s", err, svc.output())
	}
	for _, id := range ids {
		if !strings.Contains(svc.output(), "detached "+id) {
			t.Errorf("SIGTERM did not detach %s; the output:\n%s", id, svc.output())
		}
	}
	svc = start(t, label, "1m")
	for _, id := range ids {
		if !svc.printed("reopened " + id) {
			t.Errorf("the service did not reopen %s after a detach; its output:\n%s", id, svc.output())
		}
		if res, code := svc.exec(id, "cat note"); code != http.StatusOK || res.Stdout != note(id) {
			t.Errorf("after the detach and restart, the note in %s: %d %+v", id, code, res)
		}
		if code := svc.call("DELETE", "/sandboxes/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("DELETE %s: %d", id, code)
		}
		if _, code := svc.exec(id, "true"); code != http.StatusNotFound {
			t.Errorf("exec in %s after DELETE: %d, want 404", id, code)
		}
	}
	if listed := svc.list(); len(listed) != 0 {
		t.Errorf("GET /sandboxes after DELETE: %+v", listed)
	}
	if err := svc.stop(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
}

// A SIGKILLed service's sandbox ends once its lease runs out; the service,
// started again, reports it ended, answers 410 for it until Prune removes
// it, 404 after.
func TestLeaseRunsOut(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	label := newLabel(t)
	lease := sandbox.MinLease.String()
	svc := start(t, label, lease)
	id := svc.create()
	if res, code := svc.exec(id, "echo kept > note"); code != http.StatusOK || res.ExitCode != 0 {
		t.Fatalf("writing the note: %d %+v", code, res)
	}
	svc.kill()
	killed := time.Now()

	// Bounded by the lease and the bound the library promises (10 s).
	bound := sandbox.MinLease + 10*time.Second
	pctx, pcancel := context.WithTimeout(ctx, bound)
	defer pcancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		infos, err := sandbox.List(pctx, sandbox.WithLabels(map[string]string{"app": label}))
		if err == nil && len(infos) == 1 && infos[0].ID == id && !infos[0].Running {
			break
		}
		if err == nil && (len(infos) != 1 || infos[0].ID != id) {
			t.Fatalf("List: %+v, want %s alone", infos, id)
		}
		select {
		case <-pctx.Done():
			t.Fatalf("the sandbox still ran %v after the service was killed (lease %v): %+v, %v", bound, lease, infos, err)
		case <-tick.C:
		}
	}
	t.Logf("the lease (%s) ended the sandbox %v after the service was killed", lease, time.Since(killed).Round(100*time.Millisecond))

	// Not pruned: it is listed ended, and answers 410.
	svc = start(t, label, lease, "-prune=false")
	if !svc.printed("ended " + id) {
		t.Errorf("the restarted service did not report %s ended; its output:\n%s", id, svc.output())
	}
	if in, ok := svc.list()[id]; !ok || in.Running || !in.Leased || in.Open || in.Expires != nil {
		t.Errorf("GET /sandboxes after the lease ran out: %+v (listed %v)", in, ok)
	}
	if _, code := svc.exec(id, "cat note"); code != http.StatusGone {
		t.Errorf("exec in the ended sandbox: %d, want 410", code)
	}
	svc.kill()

	// Pruned at start: it is no longer known.
	svc = start(t, label, lease)
	if !svc.printed("ended "+id) || !svc.printed("pruned ") {
		t.Errorf("the restarted service did not report %s ended and pruned; its output:\n%s", id, svc.output())
	}
	if listed := svc.list(); len(listed) != 0 {
		t.Errorf("GET /sandboxes after Prune: %+v", listed)
	}
	if _, code := svc.exec(id, "cat note"); code != http.StatusNotFound {
		t.Errorf("exec in the pruned sandbox: %d, want 404", code)
	}
	if err := svc.stop(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
}
