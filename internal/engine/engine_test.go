package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A missing file inside a sandbox is an error the engine returned, not a
// sign that the engine is down; only a failed dial (for one, a socket path
// that does not exist) is.
func TestIsUnreachable(t *testing.T) {
	dialNoSocket := &net.OpError{Op: "dial", Net: "unix",
		Err: &os.SyscallError{Syscall: "connect", Err: syscall.ENOENT}}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"missing file", &fs.PathError{Op: "stat", Path: "/tmp/x", Err: fs.ErrNotExist}, false},
		{"bare not-exist", fmt.Errorf("read: %w", fs.ErrNotExist), false},
		{"engine message", fmt.Errorf("Could not find the file /x in container"), false},
		{"socket missing", fmt.Errorf("post: %w", dialNoSocket), true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"no answer", fmt.Errorf("x: %w", ErrNoAnswer), true},
		{"cli message", fmt.Errorf("Cannot connect to the Docker daemon at unix:///x"), true},
	}
	for _, c := range cases {
		if got := IsUnreachable(c.err); got != c.want {
			t.Errorf("%s: IsUnreachable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// An engine that accepts connections but never answers: the client's
// request fails with ErrNoAnswer after the answer bound, which is not the
// caller's deadline; a caller's deadline that comes first is reported as
// such.
func TestConnectNoAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	host := "tcp://" + ln.Addr().String()

	start := time.Now()
	_, err = Connect(context.Background(), host, 200*time.Millisecond, "")
	t.Logf("Connect gave up after %v: %v", time.Since(start), err)
	if !errors.Is(err, ErrNoAnswer) || errors.Is(err, context.DeadlineExceeded) || !IsTimeout(err) || !IsUnreachable(err) {
		t.Errorf("Connect to a silent engine: %v; want ErrNoAnswer, not context.DeadlineExceeded", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = Connect(ctx, host, time.Hour, "")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNoAnswer) {
		t.Errorf("Connect with the caller's deadline passing first: %v; want context.DeadlineExceeded", err)
	}
}

func TestRetryBusy(t *testing.T) {
	busyErr, otherErr := errors.New("busy"), errors.New("other")
	isBusy := func(err error) bool { return err == busyErr }
	n := 0
	if err := RetryBusy(context.Background(), func() error {
		if n++; n < 3 {
			return busyErr
		}
		return nil
	}, isBusy); err != nil || n != 3 {
		t.Errorf("busy twice then done: %v after %d tries", err, n)
	}
	n = 0
	if err := RetryBusy(context.Background(), func() error { n++; return otherErr }, isBusy); err != otherErr || n != 1 {
		t.Errorf("another error: %v after %d tries", err, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n = 0
	err := RetryBusy(ctx, func() error {
		if n++; n == 2 {
			cancel()
		}
		return busyErr
	}, isBusy)
	if err != busyErr || n != 2 {
		t.Errorf("cancelled while busy: %v after %d tries", err, n)
	}
}
