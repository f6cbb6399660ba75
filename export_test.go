package sandbox

import "github.com/agentsandbox/sandbox/internal/firewall"

// Test hooks: point the egress proxy's name resolution at local servers and
// trust a test CA for intercepted upstreams.
var (
	WithTestResolver      = withResolver
	WithTestUpstreamRoots = withUpstreamRoots
	// WithTestTimeout replaces DefaultTimeout for one sandbox.
	WithTestTimeout = withTimeout
)

// WithTestAgentVolume names the volume that holds the agent, so that a
// test can remove it without touching other tests' sandboxes.
func WithTestAgentVolume(name string) Option {
	return func(c *config) error { c.agentVolume = name; return nil }
}

// SetFirewallSupported replaces the check of whether firewall rules can be
// installed, and returns a function that puts the real one back. Only for
// tests that do not run in parallel.
func SetFirewallSupported(f func() error) (restore func()) {
	old := firewall.Supported
	firewall.Supported = f
	return func() { firewall.Supported = old }
}

// SetDiskSupported replaces the check of whether loop-mounted disks can be
// made, and returns a function that puts the real one back. Only for tests
// that do not run in parallel.
func SetDiskSupported(f func() error) (restore func()) {
	old := diskSupported
	diskSupported = f
	return func() { diskSupported = old }
}
