package sandbox

// Test hooks: point the egress proxy's name resolution at local servers and
// trust a test CA for intercepted upstreams.
var (
	WithTestResolver      = withResolver
	WithTestUpstreamRoots = withUpstreamRoots
	// WithTestTimeout replaces DefaultTimeout for one sandbox.
	WithTestTimeout = withTimeout
	// WithTestExposeBounds replaces Expose's idle bound, its bound after
	// the host client's end and its connection cap for one sandbox.
	WithTestExposeBounds = withExposeBounds
)

// ExposeMaxConns is the cap on a sandbox's open Expose connections.
const ExposeMaxConns = exposeMaxConns

// AttachWithStdin is the hook a Terminal reattaches with: AttachCommand
// with the command's stdin.
var AttachWithStdin = (*Sandbox).attach
