module example.com/stubbackend

go 1.26.0

require github.com/agentsandbox/sandbox v0.0.0

require (
	github.com/moby/profiles/seccomp v0.3.0 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	golang.org/x/sys v0.50.0 // indirect
)

replace github.com/agentsandbox/sandbox => ../..
