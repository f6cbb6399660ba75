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
	// although the caller's context had not ended: the sandbox (its
	// container is paused from outside the library or frozen, or its init
	// process does not reply), or the engine (then the error also matches
	// ErrEngineUnavailable). The error says what did not answer.
	ErrUnresponsive = driver.ErrUnresponsive

	// ErrImageNotFound means the image is not present on the engine and was
	// not pulled (see PullPolicy).
	ErrImageNotFound = driver.ErrImageNotFound

	// ErrSandboxGone means the sandbox's container is no longer running: it
	// was removed or killed behind the library's back, or its Lifetime ended.
	// The Sandbox cannot be used again; Close it.
	ErrSandboxGone = driver.ErrGone

	// ErrOutputTruncated is returned by Cmd.Output and Cmd.CombinedOutput
	// when the command wrote more than Limits.OutputBytes; the bytes that fit
	// are returned with it.
	ErrOutputTruncated = errors.New("sandbox: output truncated")

	// ErrUnsafePath is returned by CopyOut when the sandbox offers an archive
	// entry that would land outside the host directory (a "../" name, an
	// absolute name, or a link pointing out). Nothing outside is written.
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

	// ErrNotRegular is returned by ReadFile and FS reads for a name that is
	// not a regular file once symbolic links are followed (a device, FIFO
	// or socket): a link to /dev/zero cannot make a read go on for ever.
	ErrNotRegular = errors.New("sandbox: not a regular file")

	// ErrNetworkUnsupported means NetworkPolicy{Open: true} cannot be set
	// up by this process: it needs root on the engine's host for its
	// firewall rules, and iptables. (Allow-lists, credentials and Expose
	// need neither.)
	ErrNetworkUnsupported = driver.ErrNetworkUnsupported

	// ErrLimitsUnsupported means the engine did not put in force a limit
	// the sandbox asked for, as the sandbox's agent finds from inside (its
	// cgroup and resource limits): rootless Podman on cgroup v1, say,
	// applies no CPU, memory, file size or open files limit. It also
	// means the engine refused a limit: an OpenFiles (or FileSize) above
	// the engine's own hard limit, which its runtime cannot raise (Docker,
	// Podman: "error setting rlimit"); the error names the limit and its
	// value. New fails rather than run the sandbox without it; lower the
	// limit, or remove it (a negative value) to run there anyway.
	ErrLimitsUnsupported = driver.ErrLimitsUnsupported

	// ErrUnsupported means the backend lacks what the call needs (a
	// driver without snapshots, say); the error names what.
	ErrUnsupported = driver.ErrUnsupported

	// ErrNoNetwork is no longer returned: Expose works for every sandbox.
	//
	// Deprecated: kept so that code testing for it still compiles.
	ErrNoNetwork = errors.New("sandbox: no network")
)
