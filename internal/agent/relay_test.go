//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/internal/agentconn"
)

// fileStream is the library's end of the pipe to an in-process agent.
type fileStream struct{ *os.File }

func (f fileStream) CloseWrite() error { return f.Close() }

// relayAgent runs an agent in this process with a relay port (0: none)
// and returns the library's connection to it.
func relayAgent(t *testing.T, port int) *agentconn.Conn {
	t.Helper()
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	a := newAgent(newBatcher(outW), startWorkers(1), newOOMScore())
	if port != 0 {
		if err := a.listenRelay(port); err != nil {
			t.Fatal(err)
		}
	}
	served := make(chan struct{})
	go func() {
		a.serve(inR)
		close(served)
	}()
	c := agentconn.Start(fileStream{inW}, outR, 5*time.Second)
	// The agent's output stays open: a real agent exits when it cannot
	// write, and answers may still be on their way.
	t.Cleanup(func() {
		c.Close()
		<-served
	})
	return c
}

// freePort is a port of 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// echoBack serves one connection: it reads everything, then writes back
// the SHA-256 of what it read and the bytes themselves, then closes.
func echoBack(t *testing.T, l net.Listener) {
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		data, _ := io.ReadAll(c)
		sum := sha256.Sum256(data)
		c.Write(sum[:])
		c.Write(data)
	}()
}

// roundTrip writes data, half-closes, and checks the echo.
func roundTrip(t *testing.T, c net.Conn, data []byte) {
	t.Helper()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	sum := sha256.Sum256(data)
	if len(got) != 32+len(data) || !bytes.Equal(got[:32], sum[:]) || !bytes.Equal(got[32:], data) {
		t.Fatalf("echo of %d bytes: got %d bytes, sums equal %v", len(data), len(got), len(got) >= 32 && bytes.Equal(got[:32], sum[:]))
	}
}

func TestRelayDial(t *testing.T) {
	c := relayAgent(t, 0)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	echoBack(t, l)
	conn, err := c.Dial(context.Background(), l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	data := make([]byte, 5<<20+7) // many windows, not a multiple of a frame
	rand.Read(data)
	roundTrip(t, conn, data)
}

func TestRelayDialRefused(t *testing.T) {
	c := relayAgent(t, 0)
	port := freePort(t)
	_, err := c.Dial(context.Background(), port)
	var de *agentconn.DialError
	if !errors.As(err, &de) || de.Port != port || !strings.Contains(de.Msg, "connection refused") {
		t.Fatalf("dial of a closed port: %v", err)
	}
	if _, err := c.Dial(context.Background(), 70000); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("dial of port 70000: %v", err)
	}
}

func TestRelayAccept(t *testing.T) {
	port := freePort(t)
	c := relayAgent(t, port)
	// A program in the sandbox connects to the relay port; the library
	// takes the connection and echoes.
	done := make(chan error, 1)
	go func() {
		conn, err := c.Accept(context.Background())
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		data, err := io.ReadAll(conn)
		sum := sha256.Sum256(data)
		conn.Write(sum[:])
		conn.Write(data)
		done <- err
	}()
	sb, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	data := make([]byte, 3<<20)
	rand.Read(data)
	roundTrip(t, sb, data)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// An Accept given up on is withdrawn: the next connection goes to the
// next Accept, not to the one nobody waits for.
func TestRelayAcceptWithdrawn(t *testing.T) {
	port := freePort(t)
	c := relayAgent(t, port)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Accept(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled accept: %v", err)
	}
	sb, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	sb.Write([]byte("hello"))
	conn, err := c.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	// Closing the library's end closes the sandbox's.
	conn.Close()
	sb.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := sb.Read(buf); err == nil {
		t.Fatalf("read %d bytes from a closed relay", n)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the sandbox's end stayed open after Close")
	}
}

func TestRelayNoPort(t *testing.T) {
	c := relayAgent(t, 0)
	if _, err := c.Accept(context.Background()); err == nil || !strings.Contains(err.Error(), "no relay port") {
		t.Fatalf("accept without a relay port: %v", err)
	}
}

// Deadlines work as on a TCP connection, and the window holds: a program
// that never reads lets the library write only so far.
func TestRelayDeadlines(t *testing.T) {
	c := relayAgent(t, 0)
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := make(chan net.Conn, 1)
	go func() {
		s, err := l.Accept()
		if err == nil {
			held <- s // never reads, never writes
		}
	}()
	conn, err := c.Dial(context.Background(), l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := <-held
	defer s.Close()
	conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	n, err := conn.Write(make([]byte, 64<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write of 64 MiB to a program that does not read: %d bytes, %v", n, err)
	}
	// What the kernel's socket buffers take, and the window.
	if n >= 32<<20 {
		t.Fatalf("%d bytes written to a program that does not read", n)
	}
	// A cleared deadline lets a read wait again.
	conn.SetDeadline(time.Time{})
	s.Write([]byte("x"))
	b := make([]byte, 1)
	if _, err := conn.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read after clearing the deadline: %q %v", b, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestMappedFromZero(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		maps string
		want uint64
	}{
		{"         0          0 4294967295\n", 4294967295},                              // the initial namespace
		{"         0       1001          1\n         1     100000      65536\n", 65537}, // rootless Podman
		{"         0     100000      65536\n", 65536},
		{"         1     100000      65536\n", 0},                                   // nothing at 0
		{"         0       1001          1\n         5     100000         10\n", 1}, // a gap
	} {
		f := dir + "/map"
		os.WriteFile(f, []byte(c.maps), 0o644)
		if n, err := mappedFromZero(f); err != nil || n != c.want {
			t.Errorf("%q: %d, %v; want %d", c.maps, n, err, c.want)
		}
	}
}

// In a rootless engine's namespace (65537 IDs from 0) a drawn user moves
// below the tags, and the tags are the namespace's top IDs; in the initial
// namespace nothing moves and tags start at tagBase.
func TestIntoMappedAndTags(t *testing.T) {
	const rootless = 65537
	uid, gid, err := intoMapped(1_234_567_890, 1_234_567_890, rootless)
	if err != nil || uid != gid || uid < drawnFloor || uint64(uid) >= rootless-tagSpan {
		t.Errorf("intoMapped in a rootless namespace: %d:%d, %v", uid, gid, err)
	}
	if uid, gid, err := intoMapped(1_234_567_890, 1_234_567_890, 4294967295); err != nil || uid != 1_234_567_890 || gid != uid {
		t.Errorf("intoMapped in the initial namespace: %d:%d, %v", uid, gid, err)
	}
	if _, _, err := intoMapped(1_234_567_890, 1_234_567_890, 1000); err == nil {
		t.Error("intoMapped with 1000 IDs: no error")
	}
	if r := tagsFor(4294967295); r.span != 0 {
		t.Errorf("tags in the initial namespace: %+v", r)
	}
	if r := tagsFor(rootless); r.base != rootless-tagSpan || r.span != tagSpan-1 {
		t.Errorf("tags in a rootless namespace: %+v", r)
	}
	// The relay's ID is none of the tags, nor a drawn user.
	if id := relayUID(rootless); id != rootless-1 || id == uid {
		t.Errorf("the relay's ID in a rootless namespace: %d", id)
	}
	if id := relayUID(4294967295); id != relayID {
		t.Errorf("the relay's ID in the initial namespace: %d", id)
	}
}
