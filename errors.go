package sandbox

import (
	"errors"

	"github.com/agentsandbox/sandbox/driver"
)

// Sentinel errors. Test for them with errors.Is; the errors returned carry
// more detail (the image name, the engine address, the path) in their text.
// Those that a backend reports are package driver's values, so they match
// whatever the backend.
var (
	// ErrClosed is returned by every method of a Sandbox after Close.
	ErrClosed = errors.New("sandbox: closed")

	// ErrEngineUnavailable means the engine (Docker, Podman, the cluster)
	// could not be reached, or did not answer a request within
	// DefaultTimeout.
	ErrEngineUnavailable = driver.ErrUnavailable

	// ErrUnresponsive means something did not answer within DefaultTimeout
	// although the caller's context had not ended: the sandbox (paused
	// from outside the library, as docker pause and podman pause do, or
	// frozen, or its agent does not reply), or the engine (then the error
	// also matches ErrEngineUnavailable). The error says what did not
	// answer.
	ErrUnresponsive = driver.ErrUnresponsive

	// ErrImageNotFound means the image is not present on the engine and was
	// not pulled (see PullPolicy).
	ErrImageNotFound = driver.ErrImageNotFound

	// ErrSandboxGone means the sandbox's instance (its container, its
	// pod) is no longer running: it was removed or killed behind the
	// library's back, ran out of memory, or its Lifetime ended; the error
	// says which where the backend can tell. The Sandbox cannot be used
	// again; Close it.
	ErrSandboxGone = driver.ErrGone

	// ErrNotFound: Open was given an ID no sandbox of the library's has
	// on the engine. It matches fs.ErrNotExist.
	ErrNotFound = driver.ErrNotFound

	// ErrNotLeased: the sandbox is tied to the process that made it (made
	// without WithLease): another process cannot Open it, and Detach does
	// not apply; Close ends it.
	ErrNotLeased = driver.ErrNotLeased

	// ErrOutputTruncated is returned by Cmd.Output and Cmd.CombinedOutput
	// when the command wrote more than Limits.OutputBytes; the bytes that fit
	// are returned with it.
	ErrOutputTruncated = errors.New("sandbox: output truncated")

	// ErrUnsafePath is returned by CopyOut when the sandbox offers an archive
	// entry that would land outside the host directory (a "../" name, an
	// absolute name, or a link pointing out). Nothing outside is written.
	// ReadSnapshot returns it (with ErrSnapshotCorrupt) for an archive
	// holding an entry that would land outside the working directory.
	ErrUnsafePath = errors.New("sandbox: unsafe path")

	// ErrFileTooLarge is returned by ReadFile, FS reads and ReadDir when the
	// file or listing is larger than Limits.FileSize: the library never takes
	// more than that from the sandbox in one read.
	ErrFileTooLarge = errors.New("sandbox: file too large")

	// ErrTooLarge is returned when a whole transfer exceeds its bound:
	// CopyOut past CopyLimit, and Snapshot when the working directory's
	// files add up to more than Limits.Disk (sparse files count at their
	// full size, since a snapshot stores them in full).
	ErrTooLarge = driver.ErrTooLarge

	// ErrNotStopped is returned by Snapshot when the sandbox's processes
	// could not be kept stopped while its files were read (they resume
	// each other faster than the agent stops them, or a timer resumes
	// one), after a few attempts: the error names a process. Every process
	// the snapshot stopped has been resumed, and the sandbox is usable. On
	// every backend.
	ErrNotStopped = errors.New("sandbox: the sandbox's processes could not be kept stopped")

	// ErrSnapshotCorrupt is returned by ReadSnapshot for an archive that
	// is not a snapshot's, or not one it may trust: another format, a
	// damaged or truncated archive, content whose digest is not the one
	// its manifest names, entries that would land outside the working
	// directory (also ErrUnsafePath). The error says what is wrong.
	ErrSnapshotCorrupt = errors.New("sandbox: snapshot archive damaged or not a snapshot")

	// ErrNotRegular is returned by ReadFile and FS reads for a name that is
	// not a regular file once symbolic links are followed (a device, FIFO
	// or socket): a link to /dev/zero cannot make a read go on for ever.
	ErrNotRegular = errors.New("sandbox: not a regular file")

	// ErrNetworkUnsupported means the backend cannot give
	// NetworkPolicy{Open: true} here; the error gives the backend's
	// reason, and its package doc what Open needs (package docker: root
	// on the engine's host and iptables). Allow-lists, credentials and
	// Expose need nothing of the backend.
	ErrNetworkUnsupported = driver.ErrNetworkUnsupported

	// ErrLimitsUnsupported means the backend did not put in force a limit
	// the sandbox asked for, as the sandbox's agent finds from inside (its
	// cgroup and resource limits): rootless Podman on cgroup v1, say,
	// applies no CPU, memory, file size or open files limit. It also
	// means the backend refused a limit: an OpenFiles (or FileSize) above
	// what it can grant (on Docker and Podman, the engine's own hard
	// limit, which its runtime cannot raise); the error names the limit
	// and its value. New fails rather than run the sandbox without it; lower the
	// limit, or remove it (a negative value) to run there anyway.
	ErrLimitsUnsupported = driver.ErrLimitsUnsupported

	// ErrSnapshotRemoved is returned by a Snapshot's New, Fork and Image
	// after its Remove: its content is gone. It also matches ErrClosed
	// (errors.Is), as a removed Snapshot is the counterpart of a closed
	// Sandbox. Sandboxes already restored from it are not affected.
	ErrSnapshotRemoved error = snapshotRemoved{}

	// ErrNoDriver means a sandbox was given no backend and there is no
	// DefaultDriver: the program was built with the agentsandbox_nodocker
	// tag, which leaves the Docker backend out (see DefaultDriver), and
	// neither WithDriver nor a DefaultDriver of its own named one. New,
	// Prune and a Snapshot's Image and Remove return it; WithHost, a
	// Docker option, does too under that tag.
	ErrNoDriver = errors.New("sandbox: no backend")

	// ErrUnsupported means the backend lacks what the call needs (a
	// driver without snapshots, say); the error names what.
	ErrUnsupported = driver.ErrUnsupported

	// ErrNoNetwork is no longer returned: Expose works for every sandbox.
	//
	// Deprecated: kept so that code testing for it still compiles.
	ErrNoNetwork = errors.New("sandbox: no network")
)

// snapshotRemoved is ErrSnapshotRemoved: its own value, which also
// matches ErrClosed.
type snapshotRemoved struct{}

func (snapshotRemoved) Error() string        { return "sandbox: the snapshot was removed" }
func (snapshotRemoved) Is(target error) bool { return target == ErrClosed }

// shortID is an instance's or snapshot's ID as error messages give it:
// its first 12 characters.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
