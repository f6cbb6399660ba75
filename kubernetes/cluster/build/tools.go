//go:build tools

// Package build pins the Kubernetes release whose server binaries the
// development and CI cluster runs (see ../cluster.sh). It is never imported.
package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
