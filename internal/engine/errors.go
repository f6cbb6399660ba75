package engine

import (
	"context"
	"errors"
	"net"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"
)

// The engine's errors are interpreted here and nowhere else: the sandbox
// package asks these functions what an error means and turns the answer
// into its own sentinels. Where the engine gives a class (errdefs, from
// the HTTP status) the class decides; a few cases only the message tells
// apart, and those messages are matched here, each in one function with a
// test.

// IsNotFound reports whether err is the engine's "no such object".
func IsNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

// IsConflict reports whether err is the engine's "conflict" (for example a
// container that is not running, or whose removal is already in progress).
func IsConflict(err error) bool { return cerrdefs.IsConflict(err) }

// IsRemovalInProgress reports whether err is the engine refusing to remove
// an object (a container) because its removal is already under way.
func IsRemovalInProgress(err error) bool {
	return IsConflict(err) && strings.Contains(err.Error(), "in progress")
}

// IsGone reports whether a failure to remove an object means that someone
// else (another Prune, another process's Close, the engine's auto-remove)
// removed it or is removing it: not found, removal in progress, or, for
// an image, the engine's "unrecognized image ID" when it went while being
// looked up.
func IsGone(err error) bool {
	return IsNotFound(err) || IsRemovalInProgress(err) ||
		(err != nil && strings.Contains(err.Error(), "unrecognized image ID"))
}

// IsStopping reports whether err is Podman refusing to force-remove a
// container that is stopping on its own ("could not be stopped ...
// container state improper"): the removal succeeds once it has stopped
// (see RetryBusy).
func IsStopping(err error) bool {
	return err != nil && strings.Contains(err.Error(), "container state improper")
}

// IsInUse reports whether err is the engine refusing to remove an object
// something still uses: a volume a container (being removed) holds, a
// network with endpoints still attached. Such a removal succeeds once the
// user is gone (see RetryBusy).
func IsInUse(err error) bool {
	return IsConflict(err) || (err != nil && strings.Contains(err.Error(), "active endpoints"))
}

// IsSubnetOverlap reports whether err is the engine refusing a network
// whose subnet overlaps one it has already.
func IsSubnetOverlap(err error) bool {
	return err != nil && strings.Contains(err.Error(), "overlap")
}

// ErrNoAnswer is the error of a request (through a client from Connect) or
// an attach set-up (Attach) that the engine did not answer in time.
var ErrNoAnswer = errors.New("engine: no answer in time")

// IsTimeout reports whether err is a request the engine did not answer in
// time: no answer's headers within Connect's bound, an attach set-up that
// did not finish (Attach), a stream that went quiet (IdleBounded, Watch).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrNoAnswer) || errors.Is(err, ErrIdle) ||
		(errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, context.DeadlineExceeded))
}

// IsUnreachable reports whether err means the engine could not be reached
// at all (as opposed to an error the engine returned); false for nil.
func IsUnreachable(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	return client.IsErrConnectionFailed(err) || dial ||
		IsTimeout(err) ||
		strings.Contains(err.Error(), "Cannot connect to the Docker daemon")
}

// IsMissingEntrypoint reports whether err is the engine failing to start a
// container because its entrypoint, path, does not exist in it.
func IsMissingEntrypoint(err error, path string) bool {
	return err != nil && strings.Contains(err.Error(), `exec: "`+path+`"`) &&
		strings.Contains(err.Error(), "no such file or directory")
}

// MayBeState reports whether err is a refusal that the state of the
// container it was about may explain: not found, a conflict (not running,
// paused), or the engine's internal or unknown errors (a container that
// died while the request was carried out, before the engine noticed).
func MayBeState(err error) bool {
	return IsNotFound(err) || IsConflict(err) || cerrdefs.IsInternal(err) || cerrdefs.IsUnknown(err)
}
