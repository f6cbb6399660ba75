// Package sandbox runs untrusted code — typically code written by a language
// model — in a hardened Docker container, from Go.
//
// A Sandbox is a container with no network, no capabilities, a non-root
// user, a read-only root filesystem, and limits on CPU, memory, processes,
// disk, file size, open files, command time, captured output and lifetime.
// Programs send it files, run commands with streamed output, read results
// back, and close it; nothing it made remains afterwards.
//
//	ctx := context.Background()
//	sb, err := sandbox.New(ctx,
//		sandbox.WithImage("python:3.12-slim"),
//		sandbox.WithLimits(sandbox.Limits{Memory: 256 << 20, ExecTimeout: 30 * time.Second}),
//	)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer sb.Close()
//
//	script := []byte("import csv\nw = csv.writer(open('out.csv', 'w'))\nw.writerow(['n', 'square'])\nfor n in range(5): w.writerow([n, n*n])\nprint('done')\n")
//	if err := sb.WriteFile(ctx, "main.py", script, 0o644); err != nil {
//		log.Fatal(err)
//	}
//	res, err := sb.Exec(ctx, "python3 main.py")
//	if err != nil {
//		log.Fatal(err) // the sandbox or engine failed; a failing script is not an error
//	}
//	fmt.Print(res.Stdout)                          // "done"
//	if res.ExitCode != 0 || res.TimedOut {
//		fmt.Println("the model's code failed:", res.Stderr) // feed this back to the model
//	}
//	csv, err := sb.ReadFile(ctx, "out.csv")
//
// # Running commands
//
// Exec runs a shell script and returns a Result for an agent's tool loop:
// stdout and stderr (each bounded by Limits.OutputBytes), the exit code, and
// whether the command timed out, was truncated or ran out of memory. For
// more control, Command returns a Cmd that mirrors os/exec: streamed Stdout
// and Stderr writers, Stdin, pipes, Start and Wait, Output.
//
// When a command's context ends or Limits.ExecTimeout passes, the library
// kills the command and every process it started inside the sandbox, and
// Wait returns at once; the sandbox stays usable.
//
// Commands do not go through docker exec: the container's main process is
// the library's agent (a small static Go program, mounted read-only from a
// volume; the image is not changed and needs no shell), which the library
// talks to over the container's attach stream. The agent runs as root with
// only the capabilities it needs, non-dumpable, so sandbox code cannot
// signal, trace or feed it; commands run as the sandbox user with no
// capabilities at all. Each command's processes carry a supplementary group
// of their own that they cannot drop, and a kill removes every process
// carrying it, wherever it went.
//
// # Files
//
// WriteFile, ReadFile, Stat, ReadDir, MkdirAll and Remove work on single
// paths; CopyIn and CopyOut move trees; FS returns an fs.FS view. The
// sandbox's agent carries them out as the sandbox user, so the kernel
// checks every access as for that user's commands, files created belong to
// that user, and links resolve inside the sandbox (an absolute link target
// means the sandbox's own root, never the host's). Reads take regular files only (a link to /dev/zero
// gives ErrNotRegular) and at most Limits.FileSize bytes
// (ErrFileTooLarge). CopyOut never writes outside the host directory it is
// given, whatever the sandbox's code planted (symbolic links to "/", "../"
// names): links that point out are left out and reported (or fatal, with
// StrictLinks), and the whole copy is bounded (CopyLimit, ErrTooLarge).
//
// Names: the Sandbox's methods take names as a shell in the working
// directory does (relative to it, or absolute), while FS, being an fs.FS,
// takes only slash-separated names without a leading "/" and roots them at
// "/": FS(ctx) "workspace/f" is ReadFile "/workspace/f", and
// fs.Sub(sb.FS(ctx), "workspace") gives the working directory's view.
// Names are bytes: they need not be UTF-8. Errors are *fs.PathError values:
// a missing file satisfies errors.Is(err, fs.ErrNotExist), a refused access
// errors.Is(err, fs.ErrPermission), and the system error itself is there
// for errors.Is too (syscall.ENOSPC, syscall.EISDIR...).
//
// # What the host takes from a sandbox
//
// Every byte the library takes from a sandbox is bounded by default: a
// read by Limits.FileSize, captured output by Limits.OutputBytes per
// stream, a CopyOut by CopyLimit, a snapshot by Limits.Disk (sparse files
// count in full), and the egress proxy's requests by its header, timeout
// and connection bounds (see NetworkPolicy). Host memory stays flat
// whatever the sandbox sends: data is streamed, never gathered whole beyond
// those bounds.
//
// # Interpreters
//
// Sandbox.Interpreter starts a persistent Python (or shell) process for
// code run step by step like notebook cells: state stays between
// Interpreter.Run calls, and each Execution carries the output, rich
// results (a trailing expression's value, matplotlib figures as PNG) and
// the code's error with its traceback. Timeouts interrupt the run and keep
// the state when the code lets them.
//
// # Lifetime and cleanup
//
// Close removes the container, its disk and everything else the sandbox
// made. A sandbox also ends by itself when the process that made it exits
// (its agent's input closes) and after Limits.Lifetime. Every engine
// object carries labels naming its owner process; Prune removes those whose
// owner has died.
//
// # What is not covered
//
// Isolation is that of Docker containers (namespaces, cgroups, the
// library's seccomp profile),
// sharing the host's kernel; use WithRuntime("runsc") for gVisor where the
// engine has it. A disk on disk (an ext4 loop image) needs the library to
// run as root on the engine's host; elsewhere the disk limit is a sized
// tmpfs counted towards memory (see Limits). Allow-lists, credentials and
// Expose need nothing of the engine's host (their connections travel over
// the agent's stream); only NetworkPolicy{Open: true} needs root there
// (iptables; ErrNetworkUnsupported otherwise). See NetworkPolicy for what
// an allow-list does and does not stop.
//
// # Backends
//
// A sandbox runs on a backend, an implementation of driver.Driver (in the
// manner of database/sql/driver): the semantics above live in this
// package and in the library's agent, each sandbox's main process; the
// backend makes the instance, hands over the agent's stream, reports its
// state and removes it. Package docker is the Docker backend, and Podman's
// through its Docker-compatible API; module
// github.com/agentsandbox/sandbox/kubernetes is the Kubernetes backend (one
// pod per sandbox, through client-go). Without WithDriver, sandboxes use
// DefaultDriver, the Docker engine of DOCKER_HOST (or the local socket),
// whose connection they share; give many sandboxes of another engine one
// driver:
//
//	d := docker.New(docker.Config{Host: "unix:///run/podman/podman.sock"})
//	defer d.Close()
//	sb, err := sandbox.New(ctx, sandbox.WithDriver(d))
//
// Capabilities a backend may lack (a snapshot's engine image) fail with
// ErrUnsupported.
// Package sandboxtest's Conformance states the semantics as tests any
// backend, image or engine must pass.
//
// # Network, snapshots, agents
//
// WithNetwork opts into an allow-list behind an in-process egress proxy,
// with credentials injected outside the sandbox, reached through the
// sandbox's agent while the sandbox itself has no network; Expose serves a
// port of the sandbox on the host's loopback, whatever the policy. Snapshot
// saves the working directory (its processes stopped meanwhile by the
// agent, on any backend) and settings in the library's process;
// Snapshot.New and Snapshot.Fork start sandboxes from it, or with WithPool
// fill a Pool's started sandboxes. The
// tools sub-package turns a sandbox into function-calling tools for a
// language model.
package sandbox
