//go:build linux

// Command agent runs inside every sandbox as the container's main process
// (PID 1). The library talks to it over the container's attach stream in
// the frames of internal/wire: it starts commands, streams their output
// with flow control, reaps them, and on request kills every process a
// command started, wherever it went.
//
// It runs as root with only the capabilities it needs (set by the library
// on the container), non-dumpable, with an empty capability bounding set
// for everything it starts; commands run as the sandbox user with no
// capabilities at all. Sandbox code can therefore not open its file
// descriptors, signal, stop or ptrace it. Each command carries a
// supplementary group of its own (its tag), which it and its descendants
// cannot drop without CAP_SETGID; a kill finds them by it in
// /proc/PID/status, which the kernel writes.
//
// With -relay it also carries TCP connections between the sandbox's
// loopback interface and the library (see relay.go): the sandbox reaches
// the library's egress proxy, and the library the sandbox's ports, with no
// network. With -drawn, a sandbox user the container's user namespace does
// not map (a rootless engine maps 65536 IDs) is moved into the IDs it maps.
//
// When its stdin ends (the owning process closed the sandbox or died) or
// its lifetime is over, it exits, and the kernel ends every process of the
// container with it. With -lease (and -listen) the instance is leased
// instead: it serves sessions on its socket (session.go) and ends once
// its lease was not renewed in time.
package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/internal/ident"
	"github.com/agentsandbox/sandbox/internal/wire"
)

// version is reported in the agent's greeting.
const version = "2"

// fileWorkers is how many file operations run at once (see workers).
const fileWorkers = 3

func main() {
	args, err := agentargs.Parse(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		os.Exit(2)
	}
	if len(args.KeepEnv) > 0 {
		onlyEnv(args.KeepEnv)
	}
	if args.Install != "" || args.Connect != "" {
		var err error
		if args.Install != "" {
			err = install(args.Install, args.Isolate)
		} else {
			err = connect(args.Connect)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: %v\n", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	uid, gid, err := ident.Resolve(cmp.Or(args.User, "0:0"), "/etc/passwd", "/etc/group")
	var mapped uint64
	if err == nil {
		mapped, err = mappedIDs()
	}
	if err == nil && args.Drawn {
		uid, gid, err = intoMapped(uid, gid, mapped)
	}
	if err == nil {
		err = takeWorkdir(uid, gid)
	}
	if err == nil {
		err = setRlimits(args.FileSize, args.OpenFiles, args.Procs)
	}
	var ln *net.UnixListener // pod mode: made before the mounts are locked
	if err == nil && args.Listen != "" {
		if ln, err = listenAt(args.Listen); err == nil && len(args.Writable) > 0 {
			err = lockMounts(args.Writable)
		}
	}
	if err == nil {
		err = lockDev(uid)
	}
	if err == nil {
		err = harden()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		os.Exit(2)
	}
	// Ignored signals stay ignored in what the agent starts: writing past
	// the file size limit then fails with EFBIG instead of killing the
	// writer without a word.
	signal.Ignore(syscall.SIGXFSZ)
	// As PID 1 of the container's PID namespace, the agent gets from inside
	// only the signals it handles; SIGKILL and SIGSTOP never reach it. Go
	// handles the others by exiting (or, for the synchronous ones such as
	// SIGSEGV, by crashing when they come from kill), so a command running
	// as root could end the sandbox with kill -TERM 1 or kill -SEGV 1:
	// take them all and drop them. A signal Go relays to a channel is one
	// sent by a process; a real fault of the agent's own still crashes it.
	// (Handled, not ignored: what the agent starts gets them at their
	// defaults.)
	drop := make(chan os.Signal, 16)
	signal.Notify(drop, droppedSignals...)
	go func() {
		for range drop {
		}
	}()
	// One P: the agent mostly waits on its pipes and children, and with a
	// second P every wake-up also wakes an idle thread to look for work
	// (measured: more CPU per command, not less, with many sandboxes at
	// once). Blocking system calls still run beside it on their threads.
	runtime.GOMAXPROCS(1)
	debug.SetMemoryLimit(64 << 20)
	if args.Lifetime > 0 {
		time.AfterFunc(args.Lifetime, func() { os.Exit(0) })
	}
	in := newInstance(startWorkers(fileWorkers), newOOMScore())
	if args.Activity { // only when asked: its threads count against the PIDs limit
		if m, err := newMonitor(in.activity); err == nil {
			m.relayPort = args.RelayPort
			in.mon = m
		} else {
			fmt.Fprintf(os.Stderr, "agent: no activity record: %v\n", err)
		}
	}
	// Only now, with every thread that a goroutine keeps for itself
	// started (the file workers', the monitor's): those took idle threads
	// that were there, and the spare ones must stay spare.
	prewarmThreads(spareThreads)
	in.tags = tagsFor(mapped)
	in.greeting = wire.Greeting{Version: version, PID: os.Getpid(), UID: uid, GID: gid, Limits: seenLimits(args.Procs), Lease: args.Lease, NoActivity: in.mon == nil}
	if args.RelayPort != 0 {
		if err := in.listenRelay(args.RelayPort); err != nil {
			fmt.Fprintf(os.Stderr, "agent: %v\n", err)
			os.Exit(2)
		}
	}
	if args.Lease > 0 {
		// Leased: every connection from the library's relay (exec'd by
		// the engine: see relayProof) is a session; stdin is no tether
		// (it may be closed).
		in.execOnly = true
		err := in.runLeased(ln, args.Lease)
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		os.Exit(2)
	}
	// The stream from and to the library, through the runtime's poller:
	// no thread sits blocked in a read, so a frame that arrives wakes only
	// the goroutine that waits for it. Larger pipes to and from the engine
	// (containerd's FIFOs): fewer wake-ups per megabyte of a file or of
	// output. Best effort.
	var r io.Reader
	var w io.Writer
	var relayPID int
	if args.Listen != "" {
		go tether(pollable(0, "stdin"))
		c, pid, err := accept(ln, in.relayUID)
		relayPID = pid
		if err != nil {
			fmt.Fprintf(os.Stderr, "agent: %v\n", err)
			os.Exit(2)
		}
		c.SetReadBuffer(1 << 20)
		c.SetWriteBuffer(1 << 20)
		r, w = c, c
	} else {
		for _, fd := range []int{0, 1} {
			unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 1<<20)
		}
		r, w = pollable(0, "stdin"), pollable(1, "stdout")
	}
	a := in.newSession(newBatcher(w), relayPID, nil)
	in.startReaper()
	if err := a.w.WriteJSON(wire.Hello, 0, in.greeting); err != nil {
		os.Exit(0)
	}
	// Buffered: a frame's header and payload, and the frames that came
	// together, in one read.
	a.serve(bufio.NewReaderSize(r, 64<<10)) // returns when stdin ends
	os.Exit(0)
}

// droppedSignals are the signals a process in the sandbox could send the
// agent that would otherwise end it: every standard signal but SIGKILL and
// SIGSTOP (which cannot reach a PID namespace's init from inside),
// SIGCHLD (the reaper's) and SIGXFSZ (ignored). Real-time signals are
// ignored by Go unless asked for.
var droppedSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGILL, syscall.SIGTRAP,
	syscall.SIGABRT, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGUSR1, syscall.SIGSEGV,
	syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTERM, syscall.SIGSTKFLT,
	syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGURG,
	syscall.SIGXCPU, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGWINCH, syscall.SIGIO,
	syscall.SIGPWR, syscall.SIGSYS,
}

// takeWorkdir gives the working directory (the mount of the sandbox's
// disk, made by root) to the sandbox user.
func takeWorkdir(uid, gid uint32) error {
	var st unix.Stat_t
	if err := unix.Stat(".", &st); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	if st.Uid == uid && st.Gid == gid {
		return nil
	}
	if err := unix.Chown(".", int(uid), int(gid)); err != nil {
		return fmt.Errorf("giving the working directory to %d:%d: %w (does the container have CAP_CHOWN?)", uid, gid, err)
	}
	return nil
}

// lockDev takes /dev (the engine's tmpfs of device nodes, root's and
// writable) from root, so that a command running as root, which holds no
// capabilities but owns what root owns, cannot keep files there: it loses
// its write bits and goes to lockID, a user no command runs as (or, in a
// user namespace that does not map it, such as rootless Podman's, to
// nobody), and a command cannot take it back without CAP_CHOWN or
// CAP_FOWNER (harden drops CAP_CHOWN next). Its device nodes stay as they
// are. A /dev that is read-only, or not root's (lockMounts took it in a
// pod), is left alone.
func lockDev(uid uint32) error {
	var st unix.Stat_t
	if err := unix.Stat("/dev", &st); err != nil || st.Uid != 0 {
		return nil
	}
	err := unix.Chmod("/dev", st.Mode&0o7777&^0o222)
	if err == unix.EROFS {
		return nil
	}
	if err == nil {
		for _, owner := range []int{lockID, 65534, 65533} {
			if uint32(owner) == uid {
				continue
			}
			// EINVAL: owner is not mapped in this user namespace.
			if err = unix.Chown("/dev", owner, owner); err != unix.EINVAL {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("taking /dev from root: %w (does the container have CAP_CHOWN?)", err)
	}
	return nil
}

// pollable returns descriptor fd as a file read and written through the
// runtime's poller (non-blocking), or plainly if it cannot be.
func pollable(fd int, name string) *os.File {
	syscall.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

// harden makes the agent untouchable from the sandbox: not dumpable (its
// /proc entries belong to root, and ptrace is refused), with an empty
// capability bounding set, which every process it starts inherits, and
// without CAP_CHOWN, which it needed only to give the working directory
// away (and, in a pod, to lock the engine's mounts: lockMounts).
func harden() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		data[i].Effective &^= 1 << unix.CAP_CHOWN
		data[i].Permitted &^= 1 << unix.CAP_CHOWN
		data[i].Inheritable &^= 1 << unix.CAP_CHOWN
	}
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset (dropping CAP_CHOWN): %w", errno)
	}
	// The bounding set is per thread, and a command inherits the set of
	// whichever thread forks it: drop on every thread of the runtime.
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if errno != 0 && errno != syscall.EINVAL {
			return fmt.Errorf("prctl(PR_CAPBSET_DROP, %d): %w (does the container have CAP_SETPCAP?)", c, errno)
		}
	}
	return nil
}

// spareThreads is how many idle threads the agent makes for the runtime
// (see prewarmThreads): a few system calls that block at once, and the
// second P of a monitored fork. With those the runtime made while the
// agent started, the agent idles at 12 threads without the activity
// record (15 with it): Limits.PIDs' minimum of 16 leaves a command room.
const spareThreads = 4

// prewarmHold is how long each of prewarmThreads' goroutines holds its
// thread, so that the runtime starts them all at once.
const prewarmHold = 20 * time.Millisecond

// prewarmThreads makes the Go runtime start n OS threads now and keep them
// idle: a command that has used up the container's PIDs limit (a fork
// bomb) must not keep the agent from getting a thread when it needs one to
// kill the bomb (the runtime cannot do without: "failed to create new OS
// thread" is fatal). A goroutine that locks a thread for good takes an
// idle one, so this comes after every such goroutine has started.
func prewarmThreads(n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			time.Sleep(prewarmHold)
		})
	}
	wg.Wait()
}

// drawnFloor is the lowest ID a drawn user is moved to: clear of the
// image's own users.
const drawnFloor = 10_000

// mappedIDs returns how many IDs from 0 up the container's user namespace
// maps, for users and groups alike.
func mappedIDs() (uint64, error) {
	n, err := mappedFromZero("/proc/self/uid_map")
	if err != nil {
		return 0, err
	}
	gn, err := mappedFromZero("/proc/self/gid_map")
	return min(n, gn), err
}

// intoMapped moves a drawn uid and gid (the same number) that the
// container's user namespace does not map — a rootless engine maps 65536
// IDs, the library draws from 1e9 up — to one it maps: from drawnFloor up,
// below the tags (see tagsFor).
func intoMapped(uid, gid uint32, mapped uint64) (uint32, uint32, error) {
	if uint64(uid) < mapped && uint64(gid) < mapped {
		return uid, gid, nil
	}
	if mapped < 2*drawnFloor+tagSpan {
		return 0, 0, fmt.Errorf("the user namespace maps only %d IDs: no room for the sandbox user %d", mapped, uid)
	}
	id := uint32(drawnFloor + uint64(uid)%(mapped-tagSpan-drawnFloor))
	return id, id, nil
}

// mappedFromZero returns how many IDs from 0 up a /proc/self/*_map file
// maps without a gap.
func mappedFromZero(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	type span struct{ inside, count uint64 }
	var spans []span
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var sp span
		var outside uint64
		if _, err := fmt.Sscan(line, &sp.inside, &outside, &sp.count); err != nil {
			return 0, fmt.Errorf("%s: %q: %w", file, line, err)
		}
		spans = append(spans, sp)
	}
	var n uint64
	for grew := true; grew; {
		grew = false
		for _, sp := range spans {
			if sp.inside <= n && sp.inside+sp.count > n {
				n, grew = sp.inside+sp.count, true
			}
		}
	}
	return n, nil
}
