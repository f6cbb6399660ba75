package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"
)

// Pool keeps sandboxes started and ready, so that Get hands one out at
// once instead of waiting for New. Sandboxes are single use: the caller
// owns what Get returns and closes it; the pool starts a fresh one in its
// place. A Pool is safe for concurrent use.
//
// A sandbox's Limits.Lifetime runs from when the pool made it, not from
// Get. Each has run the command true once before it is handed out (its
// audit log shows it), which makes its first command about twice as fast.
type Pool struct {
	opts  []Option
	size  int
	ready chan *Sandbox

	ctx    context.Context // ends at Close: cancels sandboxes being made
	cancel context.CancelFunc
	wake   chan struct{} // a sandbox was taken: make another
	done   chan struct{} // the filler has stopped

	mu       sync.Mutex
	creating int
	handed   int
	created  int
	failures int
	lastErr  error
	failed   chan struct{} // closed (and replaced) when a New fails
	closeErr error
	closing  sync.Once
}

// PoolStats is a snapshot of a Pool's counters.
type PoolStats struct {
	Ready    int   // started and waiting for Get
	Creating int   // being started now
	Handed   int   // handed out by Get so far
	Created  int   // started so far
	Failures int   // New calls that failed so far
	LastErr  error // the last New error, nil after a success
}

// poolParallel bounds how many sandboxes a pool starts at once.
const poolParallel = 4

// poolBackoffMin and poolBackoff are the first and the longest wait
// between attempts while New keeps failing (doubled at each failure).
const (
	poolBackoffMin = 100 * time.Millisecond
	poolBackoff    = 30 * time.Second
)

// NewPool returns a pool that keeps size sandboxes, made with opts,
// started and ready. It checks opts at once and then fills in the
// background; ctx bounds only that check. Close the pool to remove every
// sandbox it holds.
func NewPool(ctx context.Context, size int, opts ...Option) (*Pool, error) {
	if size < 1 {
		return nil, fmt.Errorf("sandbox: NewPool: size %d, want at least 1", size)
	}
	if _, err := newConfig(opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := &Pool{
		opts: append([]Option(nil), opts...), size: size, ready: make(chan *Sandbox, size),
		wake: make(chan struct{}, 1), done: make(chan struct{}), failed: make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.fill()
	return p, nil
}

// fill keeps the pool full: it starts sandboxes (poolParallel at a time)
// whenever fewer than size are ready or being made, and backs off while
// New fails.
func (p *Pool) fill() {
	defer close(p.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan error, poolParallel)
	backoff := time.Duration(0)
	for {
		p.mu.Lock()
		want := p.size - len(p.ready) - p.creating
		for ; want > 0 && p.creating < poolParallel && backoff == 0; want-- {
			p.creating++
			wg.Go(func() { results <- p.make() })
		}
		p.mu.Unlock()
		var retry <-chan time.Time
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		case <-retry:
			backoff = 0
		case err := <-results:
			switch {
			case err == nil:
				backoff = 0
			case backoff == 0:
				backoff = poolBackoffMin
			default:
				backoff = min(2*backoff, poolBackoff)
			}
		}
	}
}

// make starts one sandbox and puts it in the pool, warmed: it has run a
// command (true, whether the image has it or not), so that the first
// command it is given finds the engine's and the kernel's caches for it
// filled (measured: 12-29 ms for a fresh sandbox's first Exec, 7-9 ms
// for the next).
func (p *Pool) make() error {
	sb, err := New(p.ctx, p.opts...)
	if err == nil {
		sb.Command(p.ctx, "true").Run()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.creating--
	if err != nil {
		if p.ctx.Err() != nil {
			return nil // closing
		}
		p.failures++
		p.lastErr = err
		close(p.failed)
		p.failed = make(chan struct{})
		return err
	}
	p.created++
	p.lastErr = nil
	if p.ctx.Err() != nil { // Close has begun: this one is not wanted
		p.mu.Unlock()
		sb.Close()
		p.mu.Lock()
		return nil
	}
	p.ready <- sb // never blocks: at most size are ready or being made
	return nil
}

// Get returns a started sandbox, waiting for one if none is ready. The
// caller owns it and must Close it. While the pool cannot make sandboxes
// (the engine fails), Get returns the error of the last attempt rather
// than wait; the pool keeps trying, backing off.
func (p *Pool) Get(ctx context.Context) (*Sandbox, error) {
	for {
		p.mu.Lock()
		failed, lastErr := p.failed, p.lastErr
		p.mu.Unlock()
		if p.ctx.Err() != nil {
			return nil, ErrClosed
		}
		var sb *Sandbox
		var ok bool
		select {
		case sb, ok = <-p.ready:
		default:
			if lastErr != nil {
				return nil, fmt.Errorf("sandbox: pool: %w", lastErr)
			}
			select {
			case sb, ok = <-p.ready:
			case <-failed:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-p.done:
				return nil, ErrClosed
			}
		}
		if !ok {
			return nil, ErrClosed
		}
		p.poke()
		if sb.check() != nil { // ended while it waited (Lifetime, killed)
			sb.Close()
			continue
		}
		p.mu.Lock()
		p.handed++
		p.mu.Unlock()
		return sb, nil
	}
}

// poke tells the filler a sandbox was taken.
func (p *Pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{
		Ready: len(p.ready), Creating: p.creating, Handed: p.handed,
		Created: p.created, Failures: p.failures, LastErr: p.lastErr,
	}
}

// Close stops the pool and removes every sandbox it holds, including those
// being started at that moment. Sandboxes already handed out are their
// callers' to close. Close is idempotent; Get after Close returns
// ErrClosed.
func (p *Pool) Close() error {
	p.closing.Do(func() {
		p.cancel()
		<-p.done
		close(p.ready)
		var errs []error
		for sb := range p.ready {
			errs = append(errs, sb.Close())
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// WithPool makes Snapshot.New and Snapshot.Fork restore into sandboxes
// taken from p (see Pool.Get), already started, instead of starting
// their own: a restore is then a hand-out and the unpacking of the
// snapshot's files. The pool's sandboxes must have the settings the
// restored ones would have (the snapshot's, with opts on top): the same
// image the snapshot's source was made from, limits, user, working
// directory, environment, runtime, labels, network policy and backend.
// A pool made with the options that made the source sandbox has them;
// otherwise the restore fails, naming the setting that differs. New
// ignores WithPool.
func WithPool(p *Pool) Option {
	return func(c *config) error {
		if p == nil {
			return errors.New("sandbox: WithPool: nil pool")
		}
		c.take = p.take
		return nil
	}
}

// take hands out a sandbox of the pool's for a restore with settings
// want, or an error naming a setting the pool's sandboxes differ in.
func (p *Pool) take(ctx context.Context, want *config) (*Sandbox, error) {
	sb, err := p.Get(ctx)
	if err != nil {
		return nil, err
	}
	if what := sb.differsFrom(want); what != "" {
		sb.Close()
		return nil, fmt.Errorf("sandbox: WithPool: the pool's sandboxes differ from the snapshot's in their %s: make the pool with the options the snapshot's source was made with", what)
	}
	return sb, nil
}

// differsFrom names the first setting in which s differs from a sandbox
// that would be made with cfg, or returns "".
func (s *Sandbox) differsFrom(cfg *config) string {
	c := &s.cfg
	switch {
	case s.base != cfg.base:
		return "image"
	case c.limits != cfg.limits:
		return "limits"
	case c.user != cfg.user:
		return "user"
	case c.workdir != cfg.workdir:
		return "working directory"
	case !slices.Equal(c.env, cfg.env):
		return "environment"
	case c.runtime != cfg.runtime:
		return "runtime"
	case !maps.Equal(c.labels, cfg.labels):
		return "labels"
	case !reflect.DeepEqual(c.network, cfg.network):
		return "network policy"
	case c.driver != cfg.driver || c.host != cfg.host:
		return "backend"
	}
	return ""
}
