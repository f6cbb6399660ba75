package docker

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentsandbox/sandbox/driver"
)

// A runtime's refusal of a resource limit at start names the limit (runc's
// and crun's words); other failures are left alone.
func TestUnitRlimitErr(t *testing.T) {
	r := driver.Resources{OpenFiles: 65536, FileSize: 1 << 40}
	for msg, want := range map[string]string{
		"OCI runtime create failed: runc create failed: unable to start container process: error during container init: error setting rlimits for ready process: error setting rlimit type 7: operation not permitted: unknown": "Limits.OpenFiles = 65536 ",
		"error setting rlimit type 1: operation not permitted":          "Limits.FileSize = 1099511627776 ",
		"error setting rlimit type 6: operation not permitted":          "RLIMIT_NPROC",
		"crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI": "Limits.OpenFiles = 65536 ",
		"OCI runtime create failed: exec: \"/x\": no such file":         "",
	} {
		err := rlimitErr(errors.New(msg), r)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v, want nil", msg, err)
			}
			continue
		}
		if !errors.Is(err, driver.ErrLimitsUnsupported) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want ErrLimitsUnsupported naming %q", msg, err, want)
		}
	}
}
