//go:build !agentsandbox_nodocker

package sandbox

import (
	"time"

	"github.com/agentsandbox/sandbox/docker"
	"github.com/agentsandbox/sandbox/driver"
)

// defaultDriver is DefaultDriver's value: the Docker engine DOCKER_HOST
// names, else the local socket. The agentsandbox_nodocker build tag
// leaves it, and the Docker backend, out of the program.
func defaultDriver() driver.Driver { return docker.New(docker.Config{}) }

// hostDriver is the driver of WithHost: a Docker engine of its own.
func hostDriver(host string, timeout time.Duration) (driver.Driver, error) {
	return docker.New(docker.Config{Host: host, Timeout: timeout}), nil
}

// withoutDocker says why WithHost(host) cannot be served: nil, as the
// Docker backend is in the program.
func withoutDocker(string) error { return nil }
