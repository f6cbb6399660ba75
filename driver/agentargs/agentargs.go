// Package agentargs is the agent's command line as one typed value: what
// the sandbox package and a backend ask of the library's agent (see
// driver.Spec.Agent). Args.Argv renders it and Parse, which the agent
// uses, reads exactly that back; nothing else writes or reads the agent's
// flags.
//
// The package is small on purpose: the agent imports it, and what it
// imports goes into every sandbox.
package agentargs

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Args are the agent's arguments. The zero value runs the agent as its
// instance's main process on its standard input and output, with the
// sandbox user root and no limits of its own.
type Args struct {
	// Lifetime, if > 0, ends the instance after this long (the agent
	// exits).
	Lifetime time.Duration
	// User is the sandbox user ("uid:gid", "name" or "uid", resolved in
	// the image's /etc/passwd and /etc/group), to whom the agent gives the
	// working directory (its current one); empty is root ("0:0").
	User string
	// Drawn says User is a random uid:gid of the sandbox's own, which the
	// agent may move into the IDs a user namespace maps (rootless engines).
	Drawn bool
	// RelayPort, if > 0, is a port of 127.0.0.1 on which the agent listens
	// for connections it relays to the library (the egress proxy).
	RelayPort int

	// FileSize, OpenFiles and Procs, if > 0, are the RLIMIT_FSIZE and
	// RLIMIT_NOFILE of the agent and its commands and the RLIMIT_NPROC of
	// its commands, for a backend whose engine does not set them.
	FileSize  int64
	OpenFiles int64
	Procs     int64
	// KeepEnv, if not empty, are the only environment variables the agent
	// and its commands keep (removing those the engine adds, such as
	// Kubernetes' service variables).
	KeepEnv []string

	// Listen, if set, is a unix socket at which the agent serves the
	// library (through an agent run with Connect, exec'd by the engine).
	// Without Lease, it serves the first connection only, and its standard
	// input only holds the instance alive (the tether).
	Listen string
	// Lease, if > 0 (it needs Listen), makes the instance leased: the
	// agent serves every connection to Listen as a session of its own,
	// ignores its standard input, and ends the instance once no session
	// renewed the lease for this long (see wire.Lease).
	Lease time.Duration
	// Writable, with Listen, are the writable mounts besides the working
	// directory that the agent leaves writable; it locks every other one.
	Writable []string
	// Connect, if set, makes the agent relay its standard input and output
	// to the agent serving at this socket (Listen), and exit.
	Connect string
	// Install, if set, makes the agent copy its own program to this path,
	// and exit.
	Install string
	// Isolate, with Install, makes it take every network interface but
	// loopback down first.
	Isolate bool
	// Activity makes the agent start the activity record's monitor (its
	// two threads count against the PIDs limit); without it, no command
	// has a record (its exit says wire.Exit.NoActivity).
	Activity bool
}

// Argv renders a as the agent's arguments (after the program's name):
// only the fields that are set, in a fixed order. It fails on what the
// agent could not read back: a list element that is empty or has a comma,
// a negative number.
func (a Args) Argv() ([]string, error) {
	var argv []string
	str := func(name, v string) {
		if v != "" {
			argv = append(argv, "-"+name+"="+v)
		}
	}
	num := func(name string, n int64) error {
		if n < 0 {
			return fmt.Errorf("agentargs: %s is negative (%d)", name, n)
		}
		if n > 0 {
			argv = append(argv, "-"+name+"="+strconv.FormatInt(n, 10))
		}
		return nil
	}
	list := func(name string, l []string) error {
		for _, e := range l {
			if e == "" || strings.Contains(e, ",") {
				return fmt.Errorf("agentargs: %s: %q cannot be passed to the agent (empty, or a comma in it)", name, e)
			}
		}
		str(name, strings.Join(l, ","))
		return nil
	}
	if a.Lifetime < 0 {
		return nil, fmt.Errorf("agentargs: lifetime is negative (%v)", a.Lifetime)
	}
	if a.Lifetime > 0 {
		str("lifetime", a.Lifetime.String())
	}
	if a.Lease < 0 {
		return nil, fmt.Errorf("agentargs: lease is negative (%v)", a.Lease)
	}
	if a.Lease > 0 && a.Listen == "" {
		return nil, errors.New("agentargs: a lease needs a socket to listen on (Listen)")
	}
	if a.Lease > 0 {
		str("lease", a.Lease.String())
	}
	str("user", a.User)
	if a.Drawn {
		argv = append(argv, "-drawn")
	}
	err := errors.Join(num("relay", int64(a.RelayPort)),
		num("fsize", a.FileSize), num("nofile", a.OpenFiles), num("nproc", a.Procs),
		list("keepenv", a.KeepEnv))
	str("listen", a.Listen)
	err = errors.Join(err, list("writable", a.Writable))
	str("connect", a.Connect)
	str("install", a.Install)
	if a.Isolate {
		argv = append(argv, "-isolate")
	}
	if a.Activity {
		argv = append(argv, "-activity")
	}
	if err != nil {
		return nil, err
	}
	return argv, nil
}

// Parse reads the agent's arguments (after the program's name), as Argv
// writes them. An unknown flag, a value that does not parse or a
// positional argument is an error.
func Parse(argv []string) (Args, error) {
	var a Args
	var keepEnv, writable string
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&a.Lifetime, "lifetime", 0, "")
	fs.DurationVar(&a.Lease, "lease", 0, "")
	fs.StringVar(&a.User, "user", "", "")
	fs.BoolVar(&a.Drawn, "drawn", false, "")
	fs.IntVar(&a.RelayPort, "relay", 0, "")
	fs.Int64Var(&a.FileSize, "fsize", 0, "")
	fs.Int64Var(&a.OpenFiles, "nofile", 0, "")
	fs.Int64Var(&a.Procs, "nproc", 0, "")
	fs.StringVar(&keepEnv, "keepenv", "", "")
	fs.StringVar(&a.Listen, "listen", "", "")
	fs.StringVar(&writable, "writable", "", "")
	fs.StringVar(&a.Connect, "connect", "", "")
	fs.StringVar(&a.Install, "install", "", "")
	fs.BoolVar(&a.Isolate, "isolate", false, "")
	fs.BoolVar(&a.Activity, "activity", false, "")
	if err := fs.Parse(argv); err != nil {
		return Args{}, fmt.Errorf("agentargs: %w", err)
	}
	if fs.NArg() > 0 {
		return Args{}, fmt.Errorf("agentargs: unexpected argument %q", fs.Arg(0))
	}
	if a.Lifetime < 0 || a.Lease < 0 || a.RelayPort < 0 || a.FileSize < 0 || a.OpenFiles < 0 || a.Procs < 0 {
		return Args{}, errors.New("agentargs: a negative lifetime, lease, port or limit")
	}
	if a.Lease > 0 && a.Listen == "" {
		return Args{}, errors.New("agentargs: -lease needs -listen")
	}
	if keepEnv != "" {
		a.KeepEnv = strings.Split(keepEnv, ",")
	}
	if writable != "" {
		a.Writable = strings.Split(writable, ",")
	}
	return a, nil
}
