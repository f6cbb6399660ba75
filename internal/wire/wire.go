// Package wire is the protocol between the library and the agent that runs
// inside every sandbox (internal/agent), spoken over the container's attach
// stream (the library writes frames to the agent's stdin and reads frames
// from its stdout) or over a connection to the agent's unix socket, made
// through an `agent -connect` the engine execs. A leased agent serves
// every such connection as a session of its own (see Greeting.Lease).
//
// A frame is a 9-byte header — kind (1 byte), channel (4 bytes, big
// endian), payload length (4 bytes, big endian) — and at most MaxData bytes
// of payload. A channel is one command (or one request) and is chosen by
// the library; frames of different channels interleave freely.
//
// Output is flow-controlled per channel: the agent sends at most Window
// bytes of a command's output that the library has not acknowledged (Ack),
// so a command that writes without end can neither flood the library's
// memory nor hold up other channels.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Kind says what a frame carries.
type Kind uint8

// Frames the library sends.
const (
	Exec       Kind = 1 + iota // start a command: JSON ExecRequest
	Stdin                      // bytes for the command's stdin
	CloseStdin                 // end of the command's stdin
	Kill                       // kill every process the command started
	Ack                        // the library consumed output: 4-byte count
	Ping                       // answered by Pong
	OOM                        // answered by OOMCount
	File                       // a file operation: JSON FileRequest
	Dial                       // connect to a port of the sandbox's loopback: JSON DialRequest
	Accept                     // take the next connection to the agent's relay port
	Lease                      // query or renew the instance's lease: JSON LeaseRequest
	Resize                     // set a PTY command's terminal size: JSON ResizeRequest
	Attach                     // attach to a command by its ID: JSON AttachRequest
	List                       // list the instance's commands: answered by SessionList
	UsageQuery                 // what the sandbox uses: JSON UsageRequest, answered by UsageState
	Watch                      // watch a directory: JSON WatchRequest, answered by Started and Events
)

// Frames the agent sends.
const (
	Started     Kind = 64 + iota // the command runs: JSON Start
	Stdout                       // output; an empty payload is end of stream
	Stderr                       // output; an empty payload is end of stream
	Exited                       // the command ended: JSON Exit
	Failed                       // the request failed: an error message
	Pong                         // answer to Ping
	OOMCount                     // answer to OOM: JSON int (-1: unknown)
	Killed                       // the kill is done: JSON KillResult
	Hello                        // first frame of the agent: JSON Greeting
	Done                         // a file operation ended: JSON FileResult
	LeaseState                   // answer to Lease: JSON LeaseInfo
	SessionList                  // answer to List: JSON []Session
	Taken                        // another session attached the command: this channel gets no more of it
	UsageState                   // answer to UsageQuery: JSON Usage
	Events                       // a watch's events: WatchRecords; an empty payload is the watch's end
	Activity                     // what a command did: JSON []Act, as it happens and before its Exited (see Act)
)

var kindNames = map[Kind]string{
	Exec: "exec", Stdin: "stdin", CloseStdin: "close-stdin", Kill: "kill", Ack: "ack",
	Ping: "ping", OOM: "oom", Started: "started", Stdout: "stdout", Stderr: "stderr",
	Exited: "exited", Failed: "failed", Pong: "pong", OOMCount: "oom-count",
	Killed: "killed", Hello: "hello", File: "file", Done: "done",
	Dial: "dial", Accept: "accept", Lease: "lease", LeaseState: "lease-state",
	Resize: "resize", Attach: "attach", List: "list", SessionList: "session-list", Taken: "taken",
	UsageQuery: "usage", UsageState: "usage-state",
	Watch: "watch", Events: "events", Activity: "activity",
}

func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

const (
	// MaxData is the largest payload of a frame.
	MaxData = 64 << 10
	// Window is how many bytes of one command's output the agent sends
	// ahead of the library's acknowledgements.
	Window = 1 << 20
	// HeaderSize is the size of a frame's header.
	HeaderSize = 9
	// RelayWindow is the window of a relayed connection (Dial, Accept) in
	// each direction: smaller than a command's, as a sandbox may hold many
	// connections open at once.
	RelayWindow = 256 << 10
)

// Frame is one message.
type Frame struct {
	Kind    Kind
	Channel uint32
	Data    []byte
}

func (f Frame) String() string {
	return fmt.Sprintf("%v #%d (%d bytes)", f.Kind, f.Channel, len(f.Data))
}

// ErrTooLarge is returned by ReadFrame for a frame whose payload exceeds
// MaxData: the stream is corrupt or hostile and must be dropped.
var ErrTooLarge = errors.New("wire: frame too large")

// ReadFrame reads one frame from r. The payload is freshly allocated.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[5:])
	if n > MaxData {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	f := Frame{Kind: Kind(h[0]), Channel: binary.BigEndian.Uint32(h[1:5])}
	if n > 0 {
		f.Data = make([]byte, n)
		if _, err := io.ReadFull(r, f.Data); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}

// Writer writes frames to an underlying stream, one whole frame at a time,
// from any number of goroutines.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write sends one frame. A payload longer than MaxData is split into
// several frames of the same kind and channel (never for an empty
// payload, which some kinds use as a marker).
func (w *Writer) Write(kind Kind, channel uint32, data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		chunk := data[:min(len(data), MaxData)]
		w.buf = append(w.buf[:0], byte(kind), 0, 0, 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint32(w.buf[1:5], channel)
		binary.BigEndian.PutUint32(w.buf[5:9], uint32(len(chunk)))
		w.buf = append(w.buf, chunk...)
		if _, err := w.w.Write(w.buf); err != nil {
			return err
		}
		data = data[len(chunk):]
		if len(data) == 0 {
			return nil
		}
	}
}

// WriteJSON sends v, encoded as JSON, as one frame.
func (w *Writer) WriteJSON(kind Kind, channel uint32, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxData {
		return fmt.Errorf("%w: %v of %d bytes", ErrTooLarge, kind, len(b))
	}
	return w.Write(kind, channel, b)
}

// WriteCount sends a frame whose payload is the 4-byte count n (Ack).
func (w *Writer) WriteCount(kind Kind, channel uint32, n uint32) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return w.Write(kind, channel, b[:])
}

// Count decodes the payload of a WriteCount frame.
func Count(data []byte) (uint32, error) {
	if len(data) != 4 {
		return 0, fmt.Errorf("wire: count of %d bytes", len(data))
	}
	return binary.BigEndian.Uint32(data), nil
}

// ExecRequest starts a command.
type ExecRequest struct {
	Args  []string // Args[0] is looked up in the command's PATH unless it has a slash
	Env   []string // added to the container's environment; later entries win
	Dir   string   // absolute
	User  string   // "uid", "uid:gid", or names from the image's /etc/passwd and /etc/group
	Stdin bool     // stdin comes in Stdin frames; without it, stdin is /dev/null
	// TTY, if set, runs the command on a pseudo-terminal the agent makes:
	// the terminal is its stdin, stdout and stderr and its controlling
	// terminal (in a session of its own), owned by the command's user;
	// its output (stderr merged, as a terminal does) comes in Stdout
	// frames and Stderr ends at once. CloseStdin writes the terminal's
	// end-of-file character (VEOF, normally C-d) rather than closing it;
	// without Stdin, that character is written at the start. A TTY whose
	// size is out of range (see MaxTTYSize) or whose Term is not a plain
	// name is refused with Failed.
	TTY *TTY `json:",omitempty"`
	// Keep, in a leased instance, lets the command outlive the session
	// that started it: when that session ends, the command runs on,
	// detached, its output kept in a ring of RingSize bytes per stream
	// (older output dropped, and counted) until a session attaches to
	// it (Attach). Without Keep, or in a tethered instance, a session's
	// end kills its commands.
	Keep bool `json:",omitempty"`
	// Group ends the command's processes with it: once its process has
	// exited, every process it started that is left is killed (before
	// Exited is sent), as a closed terminal window would hang them up,
	// but without exception.
	Group bool `json:",omitempty"`
	// NoActivity starts the command without the activity record: no Act
	// frames, no monitor in its way.
	NoActivity bool `json:",omitempty"`
	// MaxActivity bounds the command's activity record (0: DefaultMaxActivity).
	MaxActivity int `json:",omitempty"`
}

// RingSize is how many bytes of each output stream of a detached command
// the agent keeps (see ExecRequest.Keep).
const RingSize = 512 << 10

// AttachRequest attaches the session to the command named ID, on the
// channel of the Attach frame. The agent answers Started (JSON Start) or
// Failed (no such command); then, if output was dropped while no one
// was attached, one line saying how much, on Stderr (on Stdout for a PTY
// command); then the kept output, and from there on the command as on the
// channel that started it (output under a new window, Stdin, Resize,
// Kill, Exited; the streams' ends and Exited come at once for a command
// that ended meanwhile). A command attached to another session is taken
// from it: that session gets Taken on its channel, and nothing more of
// the command there.
type AttachRequest struct {
	ID string
}

// Session describes a command of the instance (the answer to List):
// those that run, and the most recent of those that ended (at most
// MaxEnded).
type Session struct {
	ID       string
	Terminal bool     // a PTY command
	Args     []string // the program and its arguments (each cut to MaxArgBytes, at most MaxArgs)
	Started  int64    // Unix nanoseconds
	Running  bool
	Attached bool // a session receives its output now
}

// Bounds of the answer to List.
const (
	MaxEnded    = 16
	MaxArgs     = 16
	MaxArgBytes = 256
)

// TTY is a pseudo-terminal's settings. A Rows or Cols of 0 is
// DefaultRows or DefaultCols, an empty Term DefaultTerm.
type TTY struct {
	Rows, Cols uint16
	Term       string // the command's TERM
}

// The terminal's defaults, and the largest size the agent accepts (rows
// and columns alike).
const (
	DefaultRows = 24
	DefaultCols = 80
	DefaultTerm = "xterm-256color"
	MaxTTYSize  = 1000
	MaxTermName = 64
)

// NoPTY is in the text of the Failed answer to an Exec with a TTY that
// the agent could not make a pseudo-terminal for (no usable /dev/ptmx).
const NoPTY = "no pseudo-terminal"

// ResizeRequest sets the size of a PTY command's terminal: the kernel
// delivers SIGWINCH to its foreground process group. Resize frames get no
// answer; the agent ignores one with a size out of range (0 or more than
// MaxTTYSize), one that does not decode and one for a channel that is not
// a PTY command.
type ResizeRequest struct {
	Rows, Cols uint16
}

// CheckTTY returns why t is refused, or nil.
func CheckTTY(t TTY) error {
	if t.Rows > MaxTTYSize || t.Cols > MaxTTYSize {
		return fmt.Errorf("wire: terminal size %d×%d: at most %d×%d", t.Rows, t.Cols, MaxTTYSize, MaxTTYSize)
	}
	if len(t.Term) > MaxTermName {
		return fmt.Errorf("wire: TERM of %d bytes: at most %d", len(t.Term), MaxTermName)
	}
	for _, c := range []byte(t.Term) {
		if c <= ' ' || c >= 0x7f || c == '=' || c == '/' {
			return fmt.Errorf("wire: TERM %q: not a plain name", t.Term)
		}
	}
	return nil
}

// Start says a command runs; for a file Read, it comes before the data
// and gives the file's size (a hint: the file may change meanwhile, and
// files of /proc say 0).
type Start struct {
	PID  int   `json:",omitempty"`
	Size int64 `json:",omitempty"`
	// ID names a command among every command of the instance (of all its
	// sessions): the agent gives one to every command it starts.
	ID string `json:",omitempty"`
	// Replay, in the answer to an Attach, is how many of the Stdout bytes
	// that follow are kept output replayed (the line saying what was
	// dropped included), not the command's live output: a terminal
	// emulator must not answer the queries in them.
	Replay int64 `json:",omitempty"`
}

// Exit says how a command ended.
type Exit struct {
	Code   int  // exit status, or 128+signal
	Signal int  // the signal that ended it, 0 if it exited
	Killed bool // ended by a Kill request
	// The command's resource usage, as wait4 gives it: its process's own
	// and that of the descendants it waited for.
	UserNS   int64 `json:",omitempty"` // user CPU time, nanoseconds
	SystemNS int64 `json:",omitempty"` // system CPU time, nanoseconds
	MaxRSS   int64 `json:",omitempty"` // the largest peak resident set of any of them, bytes
	// Dropped counts activity events over the command's bound: seen, not
	// sent.
	Dropped int `json:",omitempty"`
	// NoActivity says the agent kept no activity record for the command
	// (the kernel has no seccomp user notification: gVisor).
	NoActivity bool `json:",omitempty"`
}

// Act is one event of a command's activity record, as the agent's monitor
// saw it. The agent sends a command's events in Activity frames as they
// happen (within a few milliseconds; possibly before Started, for the
// command's own first exec), in the order they happened, all before the
// command's Exited frame; events of its processes that come after that are
// not sent. Events that happen while the command is detached wait for a
// session to attach (they go with its next event or its exit); those of a
// command that exits detached are not sent.
type Act struct {
	Kind string // "exec", "exit", "connect", "file"
	PID  int
	PPID int   `json:",omitempty"`
	UID  int   `json:",omitempty"`
	Time int64 // Unix nanoseconds
	// exec
	Path string   `json:",omitempty"`
	Args []string `json:",omitempty"`
	// exit
	Code   int    `json:",omitempty"` // exit status, -1 when ended by a signal
	Signal string `json:",omitempty"`
	CPUNS  int64  `json:",omitempty"`
	MaxRSS int64  `json:",omitempty"`
	// connect
	Net  string `json:",omitempty"` // "ip4", "ip6"
	Addr string `json:",omitempty"`
	Port int    `json:",omitempty"`
	// file: Op is "create", "modify", "remove" or "rename"; Path (above)
	// the path changed, absolute; From a rename's old path, a hard link's
	// existing file or a symbolic link's target; Size and Mode (Go's
	// fs.FileMode bits) the file's as the change began; Refused says
	// the kernel refuses the change (read-only, or not permitted).
	Op      string `json:",omitempty"`
	From    string `json:",omitempty"`
	Size    int64  `json:",omitempty"`
	Mode    uint32 `json:",omitempty"`
	Refused bool   `json:",omitempty"`
}

// DefaultMaxActivity is the bound of a command's activity record when the
// request names none.
const DefaultMaxActivity = 10000

// DialRequest asks the agent to connect to Port on the sandbox's loopback
// interface (127.0.0.1).
//
// A relayed connection (Dial, or Accept of a connection a sandbox program
// made to the agent's relay port) is a channel like a command's: the
// agent answers Started, or Failed if it cannot connect; bytes for the
// connection come in Stdin frames (acknowledged, RelayWindow ahead) and
// CloseStdin half-closes it; bytes from it go in Stdout frames under a
// RelayWindow of credit, then an empty Stdout frame at its end; Exited
// (code 0) follows once both directions are done. Kill closes it at
// once and is answered by Killed.
type DialRequest struct {
	Port int
}

// EgressTaken is in the text of the Failed answer to an Accept from a
// session older than the one that serves egress (see Greeting.Lease): the
// library stops asking.
const EgressTaken = "egress is served by a newer session"

// KillResult says what a Kill did.
type KillResult struct {
	Processes int // how many processes it killed
	Rounds    int // how many scans of /proc it took
}

// Greeting is the agent's first frame: it is ready.
type Greeting struct {
	Version string
	PID     int
	UID     uint32 // the sandbox user (its -user flag), resolved in the image
	GID     uint32
	Limits  Seen // the limits the agent finds in force
	// Lease is the instance's lease (agentargs.Args.Lease) if it is
	// leased, else 0 (it is tethered to the stream that made it).
	//
	// A leased agent serves every connection to its socket as a session
	// of its own, at once and each with the whole protocol; channel
	// numbers are the session's. A session's end (its stream closes)
	// kills the commands it started (but those started with Keep that
	// still run: they go on detached, see ExecRequest.Keep) and ends its
	// file operations and relayed connections; the others go on. Egress (Accept) is served by
	// one session: the newest to have sent an Accept. An Accept from a
	// session older than that one fails, its text holding EgressTaken;
	// once that session ends, connections to the relay port are reset
	// until a newer session sends an Accept.
	Lease time.Duration `json:",omitempty"`
	// NoActivity says the agent keeps no activity record for any command
	// (it has no seccomp user notification: gVisor).
	NoActivity bool `json:",omitempty"`
}

// LeaseRequest queries (Renew false) or renews the lease: a renewal moves
// the instance's end to now + the lease. Either is answered by LeaseState
// on the same channel (an agent that is not leased answers too), or by
// Failed for a payload that does not decode.
type LeaseRequest struct {
	Renew bool
}

// LeaseInfo is the lease as the agent holds it. Once Left has run out
// with no renewal, the agent kills every command of every session and
// ends the instance.
type LeaseInfo struct {
	Leased bool          // false: the instance is tethered; the rest is 0
	Lease  time.Duration // the lease's length
	Left   time.Duration // time until the instance ends without a renewal (>= 0)
}

// Seen is a limit as the agent finds it in force on itself (its cgroup,
// its resource limits): 0 for none, -1 where it cannot tell.
type Seen struct {
	CPUs      float64 // cgroup CPU quota ÷ period
	Memory    int64   // cgroup memory limit, bytes
	PIDs      int64   // cgroup pids limit
	FileSize  int64   // RLIMIT_FSIZE, bytes
	OpenFiles int64   // RLIMIT_NOFILE (hard)
}

// FileOp names a file operation.
type FileOp string

// File operations. Paths are absolute. Operations with input (Write,
// Untar) take it in Stdin frames, acknowledged like a command's stdin, and
// end it with CloseStdin; operations with output (Read, ReadDir, Tar,
// Capture) send
// it in Stdout frames under the same window as a command's output, then
// an empty Stdout frame. Every one ends with Done (or Failed for a bad
// request). A Kill frame aborts one.
const (
	// Read sends the contents of the regular file at Path (following
	// symbolic links), refusing other kinds of file and files of more than
	// Limit bytes.
	Read FileOp = "read"
	// Write replaces the file at Path (never writing through a symbolic
	// link) with the input, with permissions exactly Perm.
	Write FileOp = "write"
	// Stat and Lstat describe Path in Done's Info; Stat follows a final
	// symbolic link.
	Stat  FileOp = "stat"
	Lstat FileOp = "lstat"
	// ReadDir sends the entries of directory Path as DirRecords, refusing
	// listings of more than Limit bytes.
	ReadDir FileOp = "readdir"
	// MkdirAll creates directory Path and missing parents (Perm, before the
	// agent's umask).
	MkdirAll FileOp = "mkdirall"
	// RemoveAll removes Path and everything under it; a missing Path is
	// ENOENT.
	RemoveAll FileOp = "removeall"
	// Remove removes the file or empty directory Path (never what a
	// symbolic link points to).
	Remove FileOp = "remove"
	// Untar extracts the tar archive of the input into directory Path.
	Untar FileOp = "untar"
	// Tar sends a tar archive of Path (as base(Path) and below), of at most
	// Limit bytes of file contents.
	Tar FileOp = "tar"
	// Capture is a snapshot's: it stops every process of the sandbox but
	// the agent (SIGSTOP), sends a tar archive of the contents of
	// directory Path (named relative to it) of at most Limit bytes of file
	// contents, including files the user closed to themselves, and resumes
	// the processes it stopped (SIGCONT), also when it fails or is
	// aborted. No command starts meanwhile.
	Capture FileOp = "capture"
)

// FileRequest is a file operation. The agent runs it with the file system
// identity of Uid and Gid (the sandbox user), so the kernel checks every
// access as it would for a command of that user.
type FileRequest struct {
	Op    FileOp
	Path  []byte // bytes, not a string: names need not be UTF-8
	Uid   uint32
	Gid   uint32
	Perm  uint32 // Write, MkdirAll: permission bits
	Limit int64  // Read, ReadDir, Tar: most bytes sent (0: no limit)
}

// FileResult is how a file operation ended.
type FileResult struct {
	Err   *FileError `json:",omitempty"`
	Info  *FileInfo  `json:",omitempty"` // Stat, Lstat
	Bytes int64      // bytes of input taken or of output sent
	// Tar, Capture: entries left out of the archive, at most MaxSkipped
	// of them (a directory the agent could not open for want of file
	// descriptors, its name beyond every limit); Skips counts them all.
	Skipped [][]byte `json:",omitempty"`
	Skips   int64    `json:",omitempty"`
}

// MaxSkipped bounds FileResult.Skipped.
const MaxSkipped = 16

// CaptureHeaderBound is how many bytes of a Capture's archive, beyond the
// at most contents bytes of file contents, may go to everything else:
// the entries' headers (names, link targets, times: about 1.5 KiB an
// entry with long names) and padding. The agent refuses more, naming it;
// the library bounds what it stores by contents + CaptureHeaderBound +
// CaptureSlack. Entries cost the disk little (a hard link is a name in a
// directory), so the bound is a policy: 64 MiB plus 4 bytes per byte of
// the contents bound, finite for every finite contents (0: no bound).
func CaptureHeaderBound(contents int64) int64 {
	if contents <= 0 {
		return 0
	}
	const most = 1 << 60 // no overflow, whatever contents is
	if contents > (most-64<<20)/4 {
		return most
	}
	return 64<<20 + 4*contents
}

// CaptureSlack is room for the archive's end (two zero blocks and the
// tar writer's padding of them).
const CaptureSlack = 1 << 20

// FileError is a failed file operation.
type FileError struct {
	Errno uint32 // the system error, 0 if none
	Code  string // for errors that are not system errors: see below
	Path  []byte // the entry it concerns, for Untar and Tar
	Text  string
}

// FileError codes.
const (
	CodeTooLarge   = "too-large"   // more than Limit
	CodeNotRegular = "not-regular" // not a regular file where one is needed
	CodeBadName    = "bad-name"    // an archive entry that would land outside
	CodeAborted    = "aborted"     // a Kill frame or the end of the input
	CodeNotStill   = "not-still"   // Capture: the sandbox's processes could not be kept stopped
)

// FileInfo describes a file.
type FileInfo struct {
	Mode  uint32 // an io/fs FileMode
	Size  int64
	Mtime int64 // nanoseconds since the Unix epoch
}

// DirRecordSize is the fixed part of a DirRecord.
const DirRecordSize = 4 + 8 + 8 + 2

// AppendDirRecord appends one directory entry in the ReadDir encoding:
// mode (4 bytes), size (8), mtime (8), name length (2), name.
func AppendDirRecord(b []byte, name []byte, fi FileInfo) []byte {
	b = binary.BigEndian.AppendUint32(b, fi.Mode)
	b = binary.BigEndian.AppendUint64(b, uint64(fi.Size))
	b = binary.BigEndian.AppendUint64(b, uint64(fi.Mtime))
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// ParseDirRecord decodes the first record of b, returning the rest; ok is
// false if b does not start with a whole record.
func ParseDirRecord(b []byte) (name []byte, fi FileInfo, rest []byte, ok bool) {
	if len(b) < DirRecordSize {
		return nil, FileInfo{}, b, false
	}
	n := int(binary.BigEndian.Uint16(b[20:22]))
	if len(b) < DirRecordSize+n {
		return nil, FileInfo{}, b, false
	}
	fi = FileInfo{
		Mode:  binary.BigEndian.Uint32(b[0:4]),
		Size:  int64(binary.BigEndian.Uint64(b[4:12])),
		Mtime: int64(binary.BigEndian.Uint64(b[12:20])),
	}
	return b[DirRecordSize : DirRecordSize+n], fi, b[DirRecordSize+n:], true
}

// WatchRequest watches directory Path (absolute and clean), and with
// Recursive every directory below it, including those made later. The
// agent opens Path and every directory below it one name at a time,
// never following a symbolic link (a link anywhere in Path is ELOOP), as
// Uid and Gid: the kernel checks every access as for a command of the
// sandbox user, and /proc and /sys are refused (EACCES).
//
// The agent answers Started, or Failed with a JSON FileError (Errno set
// for a system error). Then the watch sends Events frames, each holding
// whole WatchRecords, under a WatchWindow of credit the library gives back
// with Ack; an empty Events frame is the watch's end (its directory
// removed, or a Kill). A Kill ends the watch and is answered by Killed.
// While the library gives no credit the agent reads no more events: the
// kernel's queue fills and its overflow becomes a WatchOverflow record.
type WatchRequest struct {
	Path      []byte // bytes, not a string: names need not be UTF-8
	Recursive bool
	Uid       uint32
	Gid       uint32
}

// Bounds of a watch.
const (
	// WatchWindow is how many bytes of records a watch sends ahead of
	// the library's acknowledgements.
	WatchWindow = 256 << 10
	// MaxWatchDirs is how many directories one watch covers; a
	// directory beyond it is not watched and said by a WatchOverflow
	// record naming it (as is one the kernel refuses a watch: its
	// fs.inotify.max_user_watches, 8192 on older kernels).
	MaxWatchDirs = 8192
	// MaxWatches is how many watches an instance runs at once (over
	// all its sessions).
	MaxWatches = 8
	// MaxWatchPath is the longest path a record holds: a deeper
	// directory is not watched (a WatchOverflow record names its parent).
	MaxWatchPath = 4096
)

// Ops of a WatchRecord.
const (
	WatchCreate   byte = 1 + iota // a file or directory created, or moved in from outside the watch
	WatchModify                   // a file's contents written
	WatchRemove                   // removed, or moved out of the watch
	WatchRename                   // renamed within the watch: From is the old path
	WatchOverflow                 // events were lost here (Path: the directory concerned, or the watch's)
)

// WatchRecordSize is the fixed part of a WatchRecord.
const WatchRecordSize = 1 + 2 + 2

// AppendWatchRecord appends one event in the Events encoding: op (1
// byte), path length (2 bytes), path, from length (2), from. Paths of
// more than MaxWatchPath bytes are refused (ok false).
func AppendWatchRecord(b []byte, op byte, path, from []byte) (_ []byte, ok bool) {
	if len(path) > MaxWatchPath || len(from) > MaxWatchPath {
		return b, false
	}
	b = append(b, op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(path)))
	b = append(b, path...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(from)))
	return append(b, from...), true
}

// ParseWatchRecord decodes the first record of b, returning the rest; ok
// is false if b does not start with a whole, valid record (an unknown op,
// a path longer than MaxWatchPath).
func ParseWatchRecord(b []byte) (op byte, path, from, rest []byte, ok bool) {
	if len(b) < 3 {
		return 0, nil, nil, b, false
	}
	op = b[0]
	n := int(binary.BigEndian.Uint16(b[1:3]))
	if op < WatchCreate || op > WatchOverflow || n > MaxWatchPath || len(b) < 3+n+2 {
		return 0, nil, nil, b, false
	}
	path = b[3 : 3+n]
	m := int(binary.BigEndian.Uint16(b[3+n : 5+n]))
	if m > MaxWatchPath || len(b) < 5+n+m {
		return 0, nil, nil, b, false
	}
	return op, path, b[5+n : 5+n+m], b[5+n+m:], true
}
