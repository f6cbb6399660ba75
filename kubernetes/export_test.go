package kubernetes

import "k8s.io/client-go/tools/remotecommand"

// Executor is the backend's stream executor, for the benchmarks' bare
// floors: client-go's SPDY executor whose connections reset their open
// streams when closed (so the leak check finds no spdystream goroutine).
func (d *Driver) Executor(url string) (remotecommand.Executor, error) { return d.executor(url) }
