// Package driver defines the interface a backend implements to run the
// sandbox package's sandboxes on an engine: Docker (package docker, the
// default), Podman through Docker's API, Kubernetes.
//
// It is for backend authors, in the manner of database/sql/driver: users
// of the sandbox package pick a backend (sandbox.WithDriver) and never
// call it themselves. The semantics — commands and their kill, files,
// interpreters, limits as seen from inside, network policies, what a
// snapshot holds — live in the sandbox package and in its agent, the
// library's program that is every instance's main process. A backend does
// what only the engine can: make an instance from a Spec with the agent as
// its main process and hand over the agent's stream, say what state the
// instance is in, remove it and everything made for it, and find what dead
// owners left behind (Prune).
//
// Optional capabilities are interfaces a Driver or Instance may also
// implement (Snapshotter, OOMReporter); the sandbox package discovers them
// at run time and returns an error wrapping ErrUnsupported when one is
// absent.
//
// A backend returns errors that wrap this package's sentinels where they
// apply (ErrUnavailable, ErrUnresponsive, ErrImageNotFound, ErrGone,
// ErrNetworkUnsupported, ErrTooLarge): the sandbox package's errors of the
// same meaning are these values, so callers test for them with errors.Is
// whatever the backend.
//
// A backend in another module needs only public packages: agentbin (the
// agent's program for an architecture), agentargs (the agent's command
// line, one typed value: Spec.Agent and what a backend adds to it),
// owner (the labels and the owner identity Prune relies on) and seccomp
// (the library's profile). testdata/stubbackend is such a backend, in a
// module of its own.
//
// The conformance suite in package sandboxtest states the semantics as
// tests a backend must pass.
package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"time"

	"github.com/agentsandbox/sandbox/driver/agentargs"
)

// Driver is a backend: a connection to one engine and what the backend
// caches about it. It must be safe for concurrent use; one Driver serves
// any number of instances.
type Driver interface {
	// Caps says what the backend's instances are like (see Caps). It may
	// ask the engine once and remember the answer.
	Caps(ctx context.Context) (Caps, error)

	// Create makes and starts an instance whose main process is the agent
	// (see Spec), and returns it with the agent's stream attached. On
	// failure nothing it made is left behind (or, if the engine did not
	// answer, it is remembered and removed later: see Prune).
	Create(ctx context.Context, spec *Spec) (Instance, error)

	// Prune removes what processes on this host that have died left
	// behind on the engine (instances, volumes, networks, snapshots), and
	// what this Driver could not remove earlier because the engine did
	// not answer. It never touches what a live process owns. It returns
	// how many objects it removed.
	Prune(ctx context.Context) (int, error)

	// Close releases the connection. Instances already made keep running
	// until removed; a Driver is not used after Close.
	Close() error
}

// Caps are what a backend's instances are like.
type Caps struct {
	// Disk is what a working directory with a size limit
	// (Resources.Disk > 0) is: DiskMemory (the zero value), whose files
	// count towards Resources.Memory, so the sandbox package fits it in
	// Memory beside /tmp and /dev/shm; or DiskExt4, a disk of its own.
	Disk DiskKind
	// DiskWhy says, in the backend's words, why the working directory is
	// DiskMemory here ("not root on this host", "a remote engine"), for
	// the sandbox package's messages about fitting it in memory; "" if
	// the backend has nothing to say.
	DiskWhy string
	// KeepAlive, if > 0, is how often the sandbox package pings each
	// instance's agent, so that an idle stream is not cut by the engine
	// (Kubernetes: the kubelet's streamingConnectionIdleTimeout).
	KeepAlive time.Duration
	// Engine is the kind of engine the backend drives, for programs and
	// tests that must know it beyond what the other fields say (a test
	// of Docker's own inspect fields, say); EngineOther, the zero value,
	// if the backend does not say.
	Engine EngineKind
	// NoResourceLimits says the engine puts none of the resource limits
	// it is given in force: neither cgroup limits (Resources.CPUs, Memory,
	// PIDs) nor rlimits (FileSize, OpenFiles), as rootless Podman on
	// cgroup v1. The sandbox package then refuses a sandbox that asks for
	// them (ErrLimitsUnsupported); one made with them removed (a negative
	// value) has none. The zero value, false, is an engine that puts them
	// in force, which the sandbox package checks from inside each
	// instance anyway.
	NoResourceLimits bool
}

// EngineKind is the kind of engine a backend drives (Caps.Engine).
type EngineKind int

const (
	// EngineOther is an engine the backend does not name: the zero value.
	EngineOther EngineKind = iota
	// EngineDocker is a Docker engine (dockerd), rootful or rootless.
	EngineDocker
	// EnginePodman is Podman run as root, through its Docker-compatible
	// API (podman system service).
	EnginePodman
	// EnginePodmanRootless is Podman run as a user other than root, in
	// that user's namespace, through its Docker-compatible API.
	EnginePodmanRootless
	// EngineKubernetes is a Kubernetes cluster: each instance a pod.
	EngineKubernetes
)

// String is the engine's name as the test suite's AGENTSANDBOX_BACKEND
// spells it: "other", "docker", "podman", "podman-rootless" or
// "kubernetes".
func (k EngineKind) String() string {
	switch k {
	case EngineOther:
		return "other"
	case EngineDocker:
		return "docker"
	case EnginePodman:
		return "podman"
	case EnginePodmanRootless:
		return "podman-rootless"
	case EngineKubernetes:
		return "kubernetes"
	}
	return fmt.Sprintf("EngineKind(%d)", int(k))
}

// Podman says whether the engine is Podman, rootful or rootless.
func (k EngineKind) Podman() bool { return k == EnginePodman || k == EnginePodmanRootless }

// DiskKind is what a working directory with a size limit is (Caps.Disk).
type DiskKind int

const (
	// DiskMemory is a tmpfs: memory, counted towards Resources.Memory.
	// It is the zero value: a backend that says nothing is taken to keep
	// the working directory in memory, the cautious reading.
	DiskMemory DiskKind = iota
	// DiskExt4 is an ext4 file system of its own, on disk (Docker: a
	// loop-mounted image), not counted towards Resources.Memory.
	DiskExt4
)

// InMemory says whether the working directory's files are memory,
// counted towards Resources.Memory.
func (k DiskKind) InMemory() bool { return k == DiskMemory }

// String is the file system's name, as the sandbox package's audit
// record gives it: "tmpfs" or "ext4".
func (k DiskKind) String() string {
	switch k {
	case DiskMemory:
		return "tmpfs"
	case DiskExt4:
		return "ext4"
	}
	return fmt.Sprintf("DiskKind(%d)", int(k))
}

// Spec is what an instance is made from.
type Spec struct {
	// Image is the image the instance runs, as the engine names it.
	Image string
	// Pull lets the backend fetch a missing image from its registry;
	// without it a missing image is an error wrapping ErrImageNotFound.
	Pull bool

	// Agent are the agent's arguments, which the backend renders with
	// Args.Argv (after the program's name), adding its own where it
	// needs them (package agentargs). The backend delivers the agent's
	// program, built for the engine's architecture (package agentbin; the
	// Docker backend fills a volume with it), and runs it as root, the
	// instance's main process, with capabilities AgentCaps and no others,
	// no new privileges, a read-only root file system, its standard input
	// and output the stream (Instance.Stream), its standard error to
	// Stderr. The agent ends the instance when its input closes.
	//
	// A leased instance (Agent.Lease > 0, sandbox.WithLease) is tied to
	// no process: the backend sets Agent.Listen (a unix socket in the
	// instance that only root reaches) and reaches the agent through a
	// relay the engine runs in the instance (the agent run with
	// Args.Connect), for Create as for Opener.Open; the agent's standard
	// input is no tether, and the instance ends when the agent exits (its
	// lease ran out, Lifetime, or Remove). Until Prune removes it, an ended
	// leased instance stays known to Opener (List, Open: ErrGone), and
	// Prune never removes a running one nor what was made for it, whoever
	// made it (see owner.LabelLease).
	Agent agentargs.Args
	// Stderr receives what the agent writes to its standard error.
	Stderr io.Writer

	// Workdir is the working directory, an absolute path: a writable
	// file system of its own, limited by Resources.Disk, empty at start.
	Workdir string
	// Env is the environment of the agent, which commands inherit.
	Env []string
	// Labels are the user's labels (sandbox.WithLabels); the backend adds
	// its own marks of the library and the owner.
	Labels map[string]string
	// Runtime names an engine runtime (such as "runsc" for gVisor), or "".
	Runtime string
	// Resources are the limits to put in force; a field <= 0 means none.
	Resources Resources
	// Network is NetworkNone (loopback only) or NetworkOpen.
	Network Network

	// Record is what the sandbox package keeps with the instance: its
	// settings, never a secret, at most RecordMax bytes. The backend
	// stores it with the instance (a label, an annotation) and gives it
	// back as is in InstanceInfo (Opener).
	Record []byte

	// Log receives the backend's records (an image pull's progress, say).
	Log *slog.Logger
	// Timeout bounds each wait the caller's context does not bound: an
	// engine request, an attach, a transfer that goes quiet.
	Timeout time.Duration
}

// AgentCaps are the capabilities the agent holds, and only the agent:
// commands run as the sandbox user with none and an empty bounding set.
// KILL to kill commands' processes, SETUID and SETGID to run commands and
// file operations as the sandbox user, SETPCAP to empty the bounding set,
// CHOWN to give the working directory to the sandbox user at start.
var AgentCaps = []string{"KILL", "SETUID", "SETGID", "SETPCAP", "CHOWN"}

// Resources are an instance's limits; a field <= 0 means no limit.
type Resources struct {
	CPUs      float64
	Memory    int64 // bytes, no swap
	PIDs      int64
	Disk      int64 // the working directory's size
	TmpSize   int64 // each of /tmp and /dev/shm, memory (nr_inodes: TmpfsInodes)
	FileSize  int64 // RLIMIT_FSIZE
	OpenFiles int64 // RLIMIT_NOFILE
	// Lifetime is passed to the agent too, which ends the instance; a
	// backend with a deadline of its own sets it as well.
	Lifetime time.Duration
}

// TmpfsBytesPerInode is how many bytes of a tmpfs's size each of its
// inodes (files, directories, links) takes from the bound: a backend
// mounts each tmpfs it makes for a sandbox (/tmp, /dev/shm, a working
// directory in memory) with nr_inodes = TmpfsInodes(size). An inode costs
// memory its size does not count (about 1 KiB, TmpfsInodeBytes: its inode
// and directory entry, charged to the sandbox's memory cgroup), so
// without the bound empty files no process owns could take all of
// Resources.Memory (554,037 of them filled 512 MiB in a "0 % used" /tmp).
// One inode per 8 KiB still lets a tmpfs hold as many files as an average
// file of 8 KiB fills; its worst case in memory is its size and an eighth.
const (
	TmpfsBytesPerInode = 8 << 10
	TmpfsInodeBytes    = 1 << 10
)

// TmpfsInodes is the nr_inodes of a tmpfs of size bytes (see
// TmpfsBytesPerInode): at least 64, so that even a tiny one holds a few
// files.
func TmpfsInodes(size int64) int64 { return max(size/TmpfsBytesPerInode, 64) }

// TmpfsMemory is the most memory a tmpfs of size bytes can take: its
// size and its inodes (see TmpfsBytesPerInode).
func TmpfsMemory(size int64) int64 { return size + TmpfsInodes(size)*TmpfsInodeBytes }

// Network is an instance's network.
type Network int

const (
	// NetworkNone is loopback only: no route out.
	NetworkNone Network = iota
	// NetworkOpen is full egress, with the host's own services, other
	// instances and the engine's networks kept out.
	NetworkOpen
)

// Instance is a running instance. Its methods are safe for concurrent use.
type Instance interface {
	// ID is the engine's name for the instance.
	ID() string
	// Stream is the agent's standard input and output.
	Stream() Stream
	// State asks the engine what state the instance is in.
	State(ctx context.Context) State
	// Remove stops the instance and removes it and everything made for it.
	// It is called once, also for an instance that has stopped.
	Remove(ctx context.Context) error
}

// Stream is the agent's standard input (Write, CloseWrite) and standard
// output (Read). Read ends (io.EOF or an error) when the agent's output
// ends: the instance stopped, or the stream was closed.
type Stream interface {
	io.Reader
	io.Writer
	SetWriteDeadline(t time.Time) error
	CloseWrite() error
	Close() error
}

// State is what state an instance is in.
type State int

const (
	StateRunning State = iota
	StatePaused        // frozen from outside the library (docker pause, podman pause)
	StateGone          // stopped, removed, or being removed
	StateUnknown       // the engine did not say
)

// OOMReporter is an Instance that can say whether the kernel's OOM killer
// ended it (its agent, which the OOM killer takes last).
type OOMReporter interface {
	OOMKilled(ctx context.Context) bool
}

// Lister is a Driver that can list what the library made on its engine,
// for tests that check nothing is left (sandboxtest.Owned).
type Lister interface {
	// Owned lists the objects that process pid on this host made through
	// the library; pid 0 means this process. For another pid, the
	// objects of every process that has had that pid since the host
	// booted are listed.
	Owned(ctx context.Context, pid int) ([]Object, error)
}

// Object is an engine object the library made.
type Object struct {
	Type  string // "container", "volume", "network", "image", "pod"
	ID    string // the engine's ID (a volume's or pod's name)
	Name  string // a container's, network's or pod's name; empty for others
	Role  string // what the library made it for: "sandbox", "disk", "snapshot", ...
	State string // a container's or pod's state ("running", "exited", ...); empty for others
}

// RecordMax bounds Spec.Record: a label or an annotation holds it.
const RecordMax = 16 << 10

// Opener is a Driver that finds the library's instances on its engine and
// attaches to a leased one from any process that reaches the engine
// (sandbox.List, sandbox.Open).
type Opener interface {
	// List returns the library's sandbox instances on the engine — every
	// process's, tethered and leased, running and ended — that carry
	// every label of match (the user's labels, Spec.Labels).
	List(ctx context.Context, match map[string]string) ([]InstanceInfo, error)
	// Open attaches to the running leased instance id (its ID or name):
	// a new session with its agent, through a relay the engine runs in
	// the instance (see Spec.Agent). The Instance's Remove ends the
	// instance for everyone; Detach (Detacher) lets go of it. An unknown
	// id is an error wrapping ErrNotFound, an ended one ErrGone, a
	// tethered one ErrNotLeased; the instance is unharmed by any of them.
	Open(ctx context.Context, id string, opts OpenOptions) (Instance, InstanceInfo, error)
}

// OpenOptions are what Opener.Open needs besides the instance's ID.
type OpenOptions struct {
	Stderr  io.Writer     // the relay's complaints (as Spec.Stderr)
	Log     *slog.Logger  // the backend's records
	Timeout time.Duration // as Spec.Timeout
}

// InstanceInfo describes an instance the library made (Opener).
type InstanceInfo struct {
	ID      string            // as Instance.ID
	Image   string            // Spec.Image
	Labels  map[string]string // Spec.Labels: the user's, without the library's own
	Created time.Time
	Lease   time.Duration // Spec.Agent.Lease; 0: tethered to the process that made it
	Running bool          // false: it has ended (and stays until Prune removes it)
	Record  []byte        // Spec.Record
}

// Detacher is an Instance that this process can let go of without
// ending it (a leased one): Detach closes its stream and releases what
// this process holds for it; the instance runs on. The Instance is not
// used afterwards.
type Detacher interface {
	Detach() error
}

// Snapshotter is a Driver that can keep a snapshot as an object of the
// engine's own (Docker: an image) that outlives the process and that the
// engine's tools can tag and push. Sandboxes are not restored from it: the
// sandbox package keeps every snapshot's content itself.
type Snapshotter interface {
	// CommitSnapshot saves req.Content on the engine as a snapshot made
	// from req.Base and returns its ID there.
	CommitSnapshot(ctx context.Context, req CommitRequest) (string, error)
	// RemoveSnapshot deletes a snapshot; one that is gone already is not
	// an error.
	RemoveSnapshot(ctx context.Context, id string) error
}

// CommitRequest is what CommitSnapshot saves.
type CommitRequest struct {
	Base    string        // the image the snapshot's sandbox was made from
	Content io.Reader     // a tar archive of the working directory's contents, named relative to it
	Source  string        // the ID of the instance it was taken from, for the record
	Timeout time.Duration // as Spec.Timeout
}

// Errors a backend wraps. The sandbox package's sentinels of the same
// meaning are these values.
var (
	// ErrUnavailable: the engine could not be reached, or did not answer
	// in time (then also ErrUnresponsive).
	ErrUnavailable = errors.New("sandbox: cannot reach the engine")
	// ErrUnresponsive: something did not answer in time.
	ErrUnresponsive = errors.New("sandbox: no answer in time")
	// ErrImageNotFound: the image is not on the engine and was not pulled.
	ErrImageNotFound = errors.New("sandbox: image not found")
	// ErrNotFound: the engine has no instance of that ID that the
	// library made (it matches fs.ErrNotExist).
	ErrNotFound = fmt.Errorf("sandbox: no such sandbox: %w", fs.ErrNotExist)
	// ErrNotLeased: the instance is tied to the process that made it
	// (not made with a lease), so no other process may open it.
	ErrNotLeased = errors.New("sandbox: the sandbox is tied to the process that made it (made without WithLease), so it cannot be opened")
	// ErrGone: the instance is no longer running.
	ErrGone = errors.New("sandbox: the sandbox's instance is gone")
	// ErrNetworkUnsupported: the network asked for cannot be set up here.
	ErrNetworkUnsupported = errors.New("sandbox: network policy not supported here")
	// ErrTooLarge: a transfer exceeded its bound.
	ErrTooLarge = errors.New("sandbox: too large")
	// ErrUnsupported: the backend lacks an optional capability.
	ErrUnsupported = errors.New("sandbox: not supported by this backend")
	// ErrLimitsUnsupported: the engine did not put in force, or refused,
	// a limit of Resources (an OpenFiles above its own hard limit, say);
	// the error names the limit.
	ErrLimitsUnsupported = errors.New("sandbox: limits not in force on this engine")
)
