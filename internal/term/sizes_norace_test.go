//go:build !race

package term

// How much the costly tests write (see sizes_race_test.go).
const (
	floodSize = 100 << 20 // the flood tests
	vtRounds  = 200       // TestSameAsVT's rounds
	piecewise = 1 << 20   // TestHostile's bytes written a few at a time
)
