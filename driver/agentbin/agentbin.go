// Package agentbin holds the sandbox agent (internal/agent), built for
// linux/amd64 and linux/arm64, for a backend to put into its instances as
// their main process (see driver.Spec.Agent), whatever module the backend
// is in.
//
// The binaries are generated and committed: `go generate
// ./driver/agentbin` rebuilds them, byte for byte the same with the
// pinned toolchain (GOTOOLCHAIN below; CI checks that a rebuild changes
// nothing).
package agentbin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
)

//go:generate env CGO_ENABLED=0 GOTOOLCHAIN=go1.26.8 GOFLAGS= GOOS=linux GOARCH=amd64 GOAMD64=v1 go build -trimpath -buildvcs=false "-ldflags=-s -w -buildid=" -o agent-linux-amd64 ../../internal/agent
//go:generate env CGO_ENABLED=0 GOTOOLCHAIN=go1.26.8 GOFLAGS= GOOS=linux GOARCH=arm64 GOARM64=v8.0 go build -trimpath -buildvcs=false "-ldflags=-s -w -buildid=" -o agent-linux-arm64 ../../internal/agent

//go:embed agent-linux-amd64 agent-linux-arm64
var files embed.FS

// Binary returns the agent built for arch ("amd64" or "arm64", as the
// engine reports its architecture in Go's spelling) and a short hash of
// it, which names the volume that holds it on an engine.
func Binary(arch string) (bin []byte, hash string, err error) {
	switch arch {
	case "x86_64":
		arch = "amd64"
	case "aarch64":
		arch = "arm64"
	}
	bin, err = files.ReadFile("agent-linux-" + arch)
	if err != nil {
		return nil, "", fmt.Errorf("agentbin: no agent for linux/%s (there are amd64 and arm64)", arch)
	}
	sum := sha256.Sum256(bin)
	return bin, hex.EncodeToString(sum[:8]), nil
}
