package docker

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/agentsandbox/sandbox/driver"
)

// rlimitRefused matches the runtime's failure to set a resource limit at
// start (runc, crun: "error setting rlimit type 7: operation not
// permitted"): a hard limit above the engine's own, which its runtime,
// started by the engine, cannot raise.
var rlimitRefused = regexp.MustCompile(`(?i)(?:error setting rlimit type |setrlimit ` + "`?" + `RLIMIT_)(\w+)`)

// rlimitErr returns the error a container start that failed with err
// means when the runtime refused one of the resource limits the library
// set (see createContainer): an error wrapping driver.ErrLimitsUnsupported
// that names the limit (Limits.OpenFiles = N) and says what to do; nil
// for any other failure.
func rlimitErr(err error, r driver.Resources) error {
	m := rlimitRefused.FindStringSubmatch(err.Error())
	if m == nil {
		return nil
	}
	var name string
	var value int64
	switch m[1] {
	case "7", "NOFILE": // RLIMIT_NOFILE
		name, value = "Limits.OpenFiles", r.OpenFiles
	case "1", "FSIZE":
		name, value = "Limits.FileSize", r.FileSize
	case "6", "NPROC":
		name, value = "RLIMIT_NPROC (the library's, for Podman)", podmanNPROC
	case "12", "MSGQUEUE":
		name, value = "RLIMIT_MSGQUEUE (the library's bound on POSIX message queues)", msgQueueBytes
	default:
		name, value = "resource limit "+m[1], 0
	}
	v := ""
	if value > 0 {
		v = " = " + strconv.FormatInt(value, 10)
	}
	return fmt.Errorf("%w: %s%s is above what the engine allows (its own hard limit, which the runtime cannot raise); lower it, "+
		"or remove it (a negative value) to keep the engine's: %v", driver.ErrLimitsUnsupported, name, v, err)
}
