//go:build !unix

package tarsafe

import "time"

// lchtimes does nothing where symlinks' times cannot be set.
func lchtimes(string, time.Time) error { return nil }
