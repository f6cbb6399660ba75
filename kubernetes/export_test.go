package kubernetes

import "k8s.io/client-go/tools/remotecommand"

// Executor is the backend's stream executor (client-go's SPDY executor),
// for the benchmarks' bare floors.
func (d *Driver) Executor(url string) (remotecommand.Executor, error) { return d.executor(url) }
