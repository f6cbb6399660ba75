// Package engine holds the Docker plumbing shared by the sandbox package:
// the connection to the engine, its errors, and what the library made on it
// (Owned). The labels every object carries and the owner identity are
// package driver/owner's, which every backend shares.
package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
)

// Host returns the engine address a client for host would use: host itself,
// or DOCKER_HOST, or the default socket.
func Host(host string) string {
	if host != "" {
		return host
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return client.DefaultDockerHost
}

// Connect returns a client for the engine at host ("" means DOCKER_HOST or
// the default socket; TLS settings come from DOCKER_CERT_PATH and
// DOCKER_TLS_VERIFY as with the docker CLI). With version "" the API
// version is negotiated (one round trip); otherwise version is used as is.
// The error is the engine's own; callers decide how to present it.
//
// Every request of the client must see the start of the engine's answer
// within answer, whatever its context says: an engine that stopped
// answering fails the request (IsUnreachable) instead of holding it
// forever. Request and response bodies are not covered (bound them with the
// request's context and IdleBounded), nor are hijacked streams (bound their
// set-up with Attach). The client keeps up to 64 idle connections, so that
// many sandboxes sharing it do not dial for every request.
func Connect(ctx context.Context, host string, answer time.Duration, version string) (*Client, error) {
	addr := Host(host)
	// The client configures this transport for the host (socket dialer,
	// TLS) and keeps it as its base transport.
	tr := &http.Transport{ResponseHeaderTimeout: answer, MaxIdleConnsPerHost: 64}
	hc := &http.Client{Transport: tr}
	opts := []client.Opt{client.WithHTTPClient(hc), client.FromEnv, client.WithHost(addr)}
	if version != "" {
		opts = append(opts, client.WithVersion(version))
	} else {
		opts = append(opts, client.WithAPIVersionNegotiation())
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, err
	}
	// The client has configured (and keeps) the *http.Transport; wrap what
	// it sends through so that the transport's timeout is told apart from
	// the request's own deadline.
	hc.Transport = answerBound{rt: hc.Transport, answer: answer}
	if version == "" {
		ping, err := cli.Ping(ctx)
		if err != nil {
			cli.Close()
			return nil, err
		}
		cli.NegotiateAPIVersionPing(ping)
	}
	return &Client{Client: cli, tr: tr}, nil
}

// Client is a client from Connect.
type Client struct {
	*client.Client
	tr *http.Transport
}

// CloseIdleConnections closes the connections that no request uses now.
func (c *Client) CloseIdleConnections() { c.tr.CloseIdleConnections() }

// Close closes the client's idle connections; it is not used after.
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return c.Client.Close()
}

// answerBound turns the transport's "timeout awaiting response headers"
// into ErrNoAnswer. The transport's error also matches
// context.DeadlineExceeded, which would make it look like the caller's own
// deadline: it is that only when the request's context has ended.
type answerBound struct {
	rt     http.RoundTripper
	answer time.Duration
}

func (a answerBound) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := a.rt.RoundTrip(req)
	var ne net.Error
	if err != nil && req.Context().Err() == nil && errors.As(err, &ne) && ne.Timeout() {
		return nil, fmt.Errorf("%w: the engine sent no answer within %v (%s %s)", ErrNoAnswer, a.answer, req.Method, req.URL.Path)
	}
	return resp, err
}

// ErrIdle is returned by a reader from IdleBounded that saw no data in time.
var ErrIdle = errors.New("engine: no data in time")

// IdleBounded returns rc with every Read bounded: when a Read has waited
// idle without data, rc is closed (which ends the Read) and the Read
// returns ErrIdle. For response bodies and streams whose progress is
// expected (archives, progress messages).
func IdleBounded(rc io.ReadCloser, idle time.Duration) io.ReadCloser {
	r := &idleReader{rc: rc, idle: idle}
	r.t = time.AfterFunc(time.Hour, func() {
		r.fired.Store(true)
		rc.Close()
	})
	r.t.Stop()
	return r
}

type idleReader struct {
	rc    io.ReadCloser
	idle  time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func (r *idleReader) Read(p []byte) (int, error) {
	r.t.Reset(r.idle)
	n, err := r.rc.Read(p)
	r.t.Stop()
	if r.fired.Load() {
		return n, fmt.Errorf("%w: nothing for %v", ErrIdle, r.idle)
	}
	return n, err
}

func (r *idleReader) Close() error {
	r.t.Stop()
	return r.rc.Close()
}

// Attach runs f, an attach or exec-attach call, and gives up when it has not
// returned within d: the docker client reads the answer to a hijacking
// request without regard to its context, so an engine that stopped
// answering would hold it forever. A connection that comes back after
// Attach gave up is closed.
func Attach(ctx context.Context, d time.Duration, f func(context.Context) (types.HijackedResponse, error)) (types.HijackedResponse, error) {
	type result struct {
		h   types.HijackedResponse
		err error
	}
	ch := make(chan result, 1)
	actx, cancel := context.WithCancel(ctx)
	go func() {
		h, err := f(actx)
		ch <- result{h, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	giveUp := func() {
		cancel()
		go func() {
			if r := <-ch; r.err == nil {
				r.h.Close()
			}
		}()
	}
	select {
	case r := <-ch:
		cancel()
		return r.h, r.err
	case <-ctx.Done():
		giveUp()
		return types.HijackedResponse{}, ctx.Err()
	case <-t.C:
		giveUp()
		return types.HijackedResponse{}, fmt.Errorf("%w: attaching took over %v", ErrNoAnswer, d)
	}
}

// Watch returns a context derived from ctx that ends, with cause ErrIdle,
// once idle passes without a call to kick; stop releases it. It bounds a
// request whose body the engine may stop reading (an archive upload): wrap
// the body with Kicking so that every read of it counts as progress.
func Watch(ctx context.Context, idle time.Duration) (_ context.Context, kick, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(idle, func() { cancel(fmt.Errorf("%w: nothing moved for %v", ErrIdle, idle)) })
	return wctx, func() { t.Reset(idle) }, func() { t.Stop(); cancel(nil) }
}

// Kicking returns r with kick called before every Read.
func Kicking(r io.Reader, kick func()) io.Reader { return kickReader{r, kick} }

type kickReader struct {
	r    io.Reader
	kick func()
}

func (k kickReader) Read(p []byte) (int, error) {
	k.kick()
	return k.r.Read(p)
}

// Cause returns err, or the reason ctx (from Watch) ended if err is that
// context's cancellation.
func Cause(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrIdle) {
		return context.Cause(ctx)
	}
	return err
}

// busyRetryMin and busyRetryMax are RetryBusy's first and longest pause
// between tries.
const (
	busyRetryMin = 10 * time.Millisecond
	busyRetryMax = 500 * time.Millisecond
)

// RetryBusy calls op until it succeeds, fails with an error busy does not
// accept, or ctx ends, waiting between tries from 10 ms up to 500 ms. It is
// for removals the engine refuses while another removal (an auto-removed
// container) is still under way. It returns op's last error.
func RetryBusy(ctx context.Context, op func() error, busy func(error) bool) error {
	for delay := busyRetryMin; ; delay = min(2*delay, busyRetryMax) {
		err := op()
		if err == nil || !busy(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// DiedOfOOM reports whether the engine remembers the kernel's OOM killer
// acting in container id (made at or after since) within a second before
// the container's end (or, if the engine has not recorded the end yet,
// at all). The engine keeps only its most recent events: false when it
// no longer has them.
func DiedOfOOM(ctx context.Context, cli interface {
	Events(ctx context.Context, options events.ListOptions) (<-chan events.Message, <-chan error)
}, id string, since time.Time) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, errs := cli.Events(ctx, events.ListOptions{
		Since: strconv.FormatInt(since.Add(-time.Second).Unix(), 10),
		Until: strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("container", id), filters.Arg("event", string(events.ActionOOM)),
			filters.Arg("event", string(events.ActionDie))),
	})
	var oom, die int64
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return oom > 0 && (die == 0 || die-oom <= int64(time.Second))
			}
			switch m.Action {
			case events.ActionOOM:
				oom = m.TimeNano
			case events.ActionDie:
				die = m.TimeNano
			}
		case <-errs:
			return oom > 0 && (die == 0 || die-oom <= int64(time.Second))
		case <-ctx.Done():
			return false
		}
	}
}

// Info is what an engine says of itself that the library needs.
type Info struct {
	Arch     string // the engine's architecture, in Go's spelling or the kernel's
	Podman   bool   // Podman's Docker-compatible API, not Docker's
	Rootless bool   // the engine runs as a user other than root, in a user namespace
	CgroupV1 bool   // the engine's host has cgroup v1 (its containers' cgroups)
}

// InfoOf reads Info from an engine's version and info answers. Podman
// names itself among the version's components ("Podman Engine"); a
// rootless Docker lists "name=rootless" among its security options, a
// rootless Podman says Rootless (and newer ones the security option too).
func InfoOf(v types.Version, si SystemInfo) Info {
	info := Info{Arch: v.Arch, CgroupV1: si.CgroupVersion == "1", Rootless: si.Rootless}
	for _, c := range v.Components {
		if strings.Contains(c.Name, "Podman") {
			info.Podman = true
		}
	}
	for _, o := range si.SecurityOptions {
		if o == "name=rootless" || strings.HasPrefix(o, "name=rootless,") {
			info.Rootless = true
		}
	}
	return info
}

// SystemInfo is the part of an engine's info answer (GET /info) that the
// library reads, Podman's Rootless field included, which the Docker SDK's
// system.Info drops.
type SystemInfo struct {
	CgroupVersion   string   // "1" or "2"
	SecurityOptions []string // "name=seccomp,profile=default", "name=rootless", ...
	Rootless        bool     // Podman's: it runs as a user other than root
}

// SystemInfo asks the engine for its info answer, on the client's own
// connection and API version.
func (c *Client) SystemInfo(ctx context.Context) (SystemInfo, error) {
	u, err := client.ParseHostURL(c.DaemonHost())
	if err != nil {
		return SystemInfo{}, err
	}
	// As the SDK addresses its requests: a socket's requests name a dummy
	// host (the transport dials the socket), a TCP engine's its address.
	scheme, host, base := "http", client.DummyHost, ""
	if c.tr.TLSClientConfig != nil {
		scheme = "https"
	}
	if u.Scheme == "tcp" {
		host, base = u.Host, u.Path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+host+base+"/v"+c.ClientVersion()+"/info", nil)
	if err != nil {
		return SystemInfo{}, err
	}
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		return SystemInfo{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(IdleBounded(resp.Body, 30*time.Second), 1<<20))
	if err != nil {
		return SystemInfo{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return SystemInfo{}, fmt.Errorf("GET /info: %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var si SystemInfo
	if err := json.Unmarshal(body, &si); err != nil {
		return SystemInfo{}, fmt.Errorf("GET /info: %w", err)
	}
	return si, nil
}
