//go:build race

package term

// How much the costly tests write under the race detector, which makes the
// emulator about twenty times slower: a quarter to a sixth of a plain
// run's, so that the suite's -race run on every backend does not spend
// minutes here. The bounds they check do not depend on the sizes; a run
// without -race writes the full ones (sizes_norace_test.go).
const (
	floodSize = 16 << 20
	vtRounds  = 50
	piecewise = 256 << 10
)
