package sandbox

// Test hooks: point the egress proxy's name resolution at local servers and
// trust a test CA for intercepted upstreams.
var (
	WithTestResolver      = withResolver
	WithTestUpstreamRoots = withUpstreamRoots
	// WithTestTimeout replaces DefaultTimeout for one sandbox.
	WithTestTimeout = withTimeout
)
