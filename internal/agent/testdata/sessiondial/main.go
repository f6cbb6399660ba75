// Command sessiondial connects to a leased agent's socket, as a program
// in the sandbox would try to: it sends the library's relay's proof
// (SCM_CREDENTIALS of the relay's user, os.Args[2]), or, as it may not (no
// capabilities), a plain byte; then it says what it got: "hello" for a
// session's greeting, "closed" if the agent closed the connection without
// one, or what failed (TestLeasedContainer runs it as a command).
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/internal/wire"
)

func main() {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Args[1], Net: "unix"})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()
	id, _ := strconv.Atoi(os.Args[2])
	cred := unix.UnixCredentials(&unix.Ucred{Pid: int32(os.Getpid()), Uid: uint32(id), Gid: uint32(id)})
	if _, _, err := c.WriteMsgUnix([]byte{0}, cred, nil); err != nil {
		fmt.Print("(no proof: ", err, ") ")
		c.Write([]byte{0})
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := wire.ReadFrame(c)
	switch {
	case err == nil && f.Kind == wire.Hello:
		fmt.Println("hello")
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		fmt.Println("closed")
	case err != nil:
		fmt.Println("read:", err)
	default:
		fmt.Println("frame", f)
	}
}
