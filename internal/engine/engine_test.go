package engine

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"testing"
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
