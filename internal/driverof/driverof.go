// Package driverof lets package sandboxtest ask package sandbox which
// backend a list of options selects (sandbox.WithDriver, WithHost, else
// sandbox.DefaultDriver), so that its leak checks ask the driver under
// test, without a public API for it. Package sandbox sets Func when it is
// initialized.
package driverof

import "github.com/agentsandbox/sandbox/driver"

// Func returns the driver that opts (a []sandbox.Option) select and, if it
// was made for this call (WithHost), a function that closes it; else
// closeFn is nil. An option that fails is the error.
var Func func(opts any) (d driver.Driver, closeFn func() error, err error)

// Of calls Func.
func Of(opts any) (driver.Driver, func() error, error) { return Func(opts) }
