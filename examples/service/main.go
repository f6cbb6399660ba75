// Command service is an HTTP service whose handlers make leased sandboxes
// and run code in them. Its sandboxes outlive it: kill it — even with
// SIGKILL — and start it again, and it finds them (sandbox.List), reopens
// those still running (sandbox.Open) and reports those whose lease ran out
// while nothing renewed it.
//
//	go run ./service [-addr 127.0.0.1:8080] [-image REF] [-lease 1m] [-label examples-service] [-prune=true]
//
// (from the examples directory, a module of its own). It prints
// "listening on ADDR" once it serves; -addr 127.0.0.1:0 picks a free port.
// The image comes from -image, else SANDBOX_IMAGE, else
// sandbox.DefaultImage (pulled if the engine lacks it).
//
// The API, JSON in and out:
//
//	POST   /sandboxes            make a sandbox: 201 {"id": "..."}
//	GET    /sandboxes            the service's sandboxes, running and ended (sandbox.Info each)
//	POST   /sandboxes/{id}/exec  {"script": "..."}: runs it with /bin/sh -c in the sandbox's
//	                             working directory: {"exit_code", "stdout", "stderr", ...}
//	DELETE /sandboxes/{id}       end the sandbox for everyone: 204
//
// For example:
//
//	id=$(curl -s -X POST localhost:8080/sandboxes | jq -r .id)
//	curl -s localhost:8080/sandboxes/$id/exec -d '{"script": "echo hi > note; python3 -V"}'
//	kill -9 $(pgrep -f examples/service)   # or Ctrl-C; then start it again
//	curl -s localhost:8080/sandboxes/$id/exec -d '{"script": "cat note"}'
//
// Every sandbox is made with sandbox.WithLease(-lease) and labelled
// app=LABEL (-label), the mark by which the service finds its own: it
// answers only for sandboxes carrying its label, so replicas of one
// service share theirs (each opens on first use those another made) and
// services with different labels do not see each other's. While the
// service has a sandbox open, the library renews its lease (every quarter
// of it). When the service ends — SIGINT and SIGTERM detach every sandbox
// (Sandbox.Detach), SIGKILL or a crash simply stops the renewals — its
// sandboxes run on for up to -lease, and end by themselves once that long
// passed without a renewal: nothing leaks, even without a clean exit.
// Limits.Lifetime (one hour by default) bounds each sandbox too, renewed
// or not.
//
// At start the service lists its sandboxes: it reopens the running ones,
// and reports the ended ones (their lease ran out, or their Lifetime
// passed); with -prune it then calls sandbox.Prune, which removes what
// remains of ended leased sandboxes and whatever processes on this host
// that died left on the engine (never anything in use). Requests for an
// ended sandbox answer 410 Gone until it is pruned, 404 Not Found after.
//
// The service has no authentication: whoever reaches its address runs code
// in its sandboxes. Keep it on loopback, or put it behind what
// authenticates your users.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/agentsandbox/sandbox"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to serve HTTP on (port 0: a free one)")
	image := flag.String("image", "", "image of the sandboxes (default: $SANDBOX_IMAGE, else "+sandbox.DefaultImage+")")
	lease := flag.Duration("lease", time.Minute, "how long a sandbox outlives the service's last renewal (at least "+sandbox.MinLease.String()+")")
	label := flag.String("label", "examples-service", "value of the label app= that marks this service's sandboxes")
	prune := flag.Bool("prune", true, "at start, remove what remains of ended sandboxes (sandbox.Prune)")
	flag.Parse()
	log.SetOutput(os.Stdout)
	if *image == "" {
		*image = os.Getenv("SANDBOX_IMAGE")
	}
	if *image == "" {
		*image = sandbox.DefaultImage
	}
	if *lease < sandbox.MinLease {
		log.Fatalf("-lease %v: shorter than the shortest lease, %v", *lease, sandbox.MinLease)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s := &server{image: *image, lease: *lease, label: *label, held: map[string]*sandbox.Sandbox{}}
	if err := run(ctx, s, *addr, *prune); err != nil {
		log.Fatal(err)
	}
}

// run reopens the service's sandboxes, serves until ctx is done, then
// detaches them.
func run(ctx context.Context, s *server, addr string, prune bool) error {
	defer s.detachAll()
	if err := s.recover(ctx, prune); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Printf("listening on %s", ln.Addr())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Printf("stopping: finishing the requests under way (up to 30 s)")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// server holds the sandboxes this process has open.
type server struct {
	image string
	lease time.Duration
	label string

	mu   sync.Mutex
	held map[string]*sandbox.Sandbox // by ID
}

// labels mark the service's sandboxes.
func (s *server) labels() map[string]string { return map[string]string{"app": s.label} }

// recover lists the service's sandboxes left by an earlier run (or by a
// replica), reopens the running ones and reports the ended ones; with
// prune, it then removes what remains of those.
func (s *server) recover(ctx context.Context, prune bool) error {
	infos, err := sandbox.List(ctx, sandbox.WithLabels(s.labels()))
	if err != nil {
		return fmt.Errorf("listing the sandboxes labelled app=%s: %w", s.label, err)
	}
	ended := 0
	for _, in := range infos {
		switch {
		case !in.Leased:
			log.Printf("skipped %s: tied to the process that made it (made without a lease)", in.ID)
		case !in.Running:
			ended++
			log.Printf("ended %s: made %s, its lease (%v) ran out with no process renewing it, or its lifetime passed",
				in.ID, in.Created.Format(time.RFC3339), in.Lease)
		default:
			sb, err := sandbox.Open(ctx, in.ID)
			if err != nil {
				// It may have ended since List, or the engine failed.
				log.Printf("could not reopen %s: %v", in.ID, err)
				continue
			}
			s.mu.Lock()
			s.held[in.ID] = sb
			s.mu.Unlock()
			log.Printf("reopened %s: made %s, lease %v, it would have ended at %s",
				in.ID, in.Created.Format(time.RFC3339), in.Lease, in.Expires.Format(time.RFC3339))
		}
	}
	if ended > 0 && prune {
		n, err := sandbox.Prune(ctx)
		if err != nil {
			log.Printf("prune: %v", err)
		} else {
			log.Printf("pruned %d objects of ended sandboxes and dead processes", n)
		}
	}
	return nil
}

// detachAll lets go of every sandbox the process has open: they run on,
// for the next start of the service (or a replica) to reopen, until their
// lease ends.
func (s *server) detachAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, sb := range s.held {
		if err := sb.Detach(); err != nil {
			log.Printf("detach %s: %v", id, err)
		}
		delete(s.held, id)
		log.Printf("detached %s: it runs on for %v without a renewal", id, s.lease)
	}
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sandboxes", s.create)
	mux.HandleFunc("GET /sandboxes", s.list)
	mux.HandleFunc("POST /sandboxes/{id}/exec", s.exec)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.remove)
	return mux
}

// create makes a leased sandbox.
func (s *server) create(w http.ResponseWriter, r *http.Request) {
	sb, err := sandbox.New(r.Context(), sandbox.WithImage(s.image), sandbox.WithLease(s.lease),
		sandbox.WithLabels(s.labels()))
	if err != nil {
		fail(w, "create a sandbox", err)
		return
	}
	s.mu.Lock()
	s.held[sb.ID()] = sb
	s.mu.Unlock()
	log.Printf("made %s", sb.ID())
	reply(w, http.StatusCreated, map[string]string{"id": sb.ID()})
}

// Sandbox is a sandbox as GET /sandboxes shows it.
type Sandbox struct {
	ID      string            `json:"id"`
	Image   string            `json:"image"`
	Labels  map[string]string `json:"labels"`
	Created time.Time         `json:"created"`
	Leased  bool              `json:"leased"`
	Lease   string            `json:"lease,omitempty"`
	Expires *time.Time        `json:"expires,omitempty"` // the lease's end as last renewed, if running
	Running bool              `json:"running"`
	Open    bool              `json:"open"` // this process has it open (and renews its lease)
}

// list answers the service's sandboxes, running and ended, oldest first.
func (s *server) list(w http.ResponseWriter, r *http.Request) {
	infos, err := sandbox.List(r.Context(), sandbox.WithLabels(s.labels()))
	if err != nil {
		fail(w, "list the sandboxes", err)
		return
	}
	out := make([]Sandbox, len(infos))
	s.mu.Lock()
	for i, in := range infos {
		out[i] = Sandbox{ID: in.ID, Image: in.Image, Labels: in.Labels, Created: in.Created,
			Leased: in.Leased, Running: in.Running, Open: s.held[in.ID] != nil}
		if in.Leased {
			out[i].Lease = in.Lease.String()
		}
		if !in.Expires.IsZero() {
			out[i].Expires = &in.Expires
		}
	}
	s.mu.Unlock()
	reply(w, http.StatusOK, out)
}

// ExecRequest is the body of POST /sandboxes/{id}/exec.
type ExecRequest struct {
	Script string `json:"script"`
}

// ExecResult is its answer.
type ExecResult struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	TimedOut   bool   `json:"timed_out,omitempty"` // killed after the sandbox's Limits.ExecTimeout (60 s by default)
	Truncated  bool   `json:"truncated,omitempty"` // output past Limits.OutputBytes (1 MiB) was dropped
	OOMKilled  bool   `json:"oom_killed,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}

// exec runs a script in a sandbox.
func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		reply(w, http.StatusBadRequest, map[string]string{"error": "the body must be JSON {\"script\": \"...\"} of at most 1 MiB: " + err.Error()})
		return
	}
	sb, err := s.sandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		fail(w, "open the sandbox", err)
		return
	}
	res, err := sb.Exec(r.Context(), req.Script)
	if err != nil {
		s.forget(sb, err)
		fail(w, "run the script", err)
		return
	}
	reply(w, http.StatusOK, ExecResult{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr,
		TimedOut: res.TimedOut, Truncated: res.Truncated, OOMKilled: res.OOMKilled, DurationMS: res.Duration.Milliseconds()})
}

// remove ends a sandbox for everyone.
func (s *server) remove(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r.Context(), r.PathValue("id"))
	if err != nil {
		fail(w, "open the sandbox", err)
		return
	}
	s.mu.Lock()
	if s.held[sb.ID()] == sb {
		delete(s.held, sb.ID())
	}
	s.mu.Unlock()
	if err := sb.Close(); err != nil {
		fail(w, "close the sandbox", err)
		return
	}
	log.Printf("closed %s", sb.ID())
	w.WriteHeader(http.StatusNoContent)
}

// sandbox returns the sandbox id, opening it if this process does not have
// it open yet (a replica made it, or it was made before a restart this
// process did not see). Only the service's own sandboxes are opened.
func (s *server) sandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	s.mu.Lock()
	sb := s.held[id]
	s.mu.Unlock()
	if sb != nil {
		return sb, nil
	}
	// Open takes any leased sandbox on the engine: check the label first.
	infos, err := sandbox.List(ctx, sandbox.WithLabels(s.labels()))
	if err != nil {
		return nil, err
	}
	found := false
	for _, in := range infos {
		if in.ID == id {
			found = true
			break
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: %q: none labelled app=%s has that ID (GET /sandboxes lists them)", sandbox.ErrNotFound, id, s.label)
	}
	sb, err = sandbox.Open(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if held := s.held[id]; held != nil {
		// Another request opened it meanwhile: keep one session.
		sb.Detach()
		return held, nil
	}
	s.held[id] = sb
	log.Printf("opened %s", id)
	return sb, nil
}

// forget drops a sandbox that has ended (another process closed it, or
// its lifetime passed) or was closed, after err from one of its methods.
func (s *server) forget(sb *sandbox.Sandbox, err error) {
	if !errors.Is(err, sandbox.ErrSandboxGone) && !errors.Is(err, sandbox.ErrClosed) {
		return
	}
	s.mu.Lock()
	if s.held[sb.ID()] == sb {
		delete(s.held, sb.ID())
		log.Printf("ended %s: %v", sb.ID(), err)
	}
	s.mu.Unlock()
	sb.Detach() // lets go of what this process holds; ErrClosed if closed already
}

// fail answers err as JSON {"error": ...} with the status that says what
// kind of failure it is.
func fail(w http.ResponseWriter, what string, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, sandbox.ErrSandboxGone), errors.Is(err, sandbox.ErrClosed):
		code = http.StatusGone
	case errors.Is(err, sandbox.ErrNotLeased):
		code = http.StatusConflict
	case errors.Is(err, sandbox.ErrEngineUnavailable), errors.Is(err, sandbox.ErrUnresponsive):
		code = http.StatusServiceUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	if code == http.StatusInternalServerError {
		log.Printf("%s: %v", what, err)
	}
	reply(w, code, map[string]string{"error": fmt.Sprintf("%s: %v", what, err)})
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
