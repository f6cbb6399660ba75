//go:build agentsandbox_nodocker

package sandbox

import (
	"fmt"
	"time"

	"github.com/agentsandbox/sandbox/driver"
)

// defaultDriver is DefaultDriver's value: none, as the
// agentsandbox_nodocker build tag leaves the Docker backend out.
func defaultDriver() driver.Driver { return nil }

// hostDriver is never reached: WithHost refuses every host (see
// withoutDocker).
func hostDriver(host string, _ time.Duration) (driver.Driver, error) { return nil, withoutDocker(host) }

// withoutDocker says why WithHost(host) cannot be served: the
// agentsandbox_nodocker build tag leaves the Docker backend out.
func withoutDocker(host string) error {
	return fmt.Errorf("%w: WithHost(%q) names a Docker engine, and this program was built with the agentsandbox_nodocker tag, "+
		"which leaves the Docker backend out: give the backend with WithDriver, or build without the tag", ErrNoDriver, host)
}
