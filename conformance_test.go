package sandbox_test

import (
	"testing"

	"github.com/agentsandbox/sandbox"
	"github.com/agentsandbox/sandbox/sandboxtest"
)

// The conformance suite with the Python image (its python3 paths; the
// sandboxtest package runs it with busybox).
func TestConformancePython(t *testing.T) {
	t.Parallel()
	sandboxtest.Conformance(t, sandbox.WithImage(pythonImage))
}
