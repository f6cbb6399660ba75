// Package sandbox runs untrusted code — typically code written by a language
// model — in sandboxes, from Go: isolated, limited places to write files
// into, run commands in and read results from, on Docker, Podman or a
// Kubernetes cluster, with the same API and the same promises.
//
// A Sandbox has no network, no capabilities, a non-root user, a read-only
// root filesystem, and limits on CPU, memory, processes, disk, file size,
// open files, command time, captured output and lifetime. Programs send it
// files, run commands with streamed output, read results back, and close
// it; nothing it made remains afterwards.
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
// # What every backend promises
//
// Whatever the backend, a sandbox's commands run as a user of the
// sandbox's own, not root, with no capabilities and no_new_privs, under a
// seccomp profile (which one is the backend's); the root filesystem is
// read-only and the only writable places are the working directory, /tmp,
// /dev/shm and POSIX message queues; nothing of the host is inside (no
// host mounts, no engine socket, no host environment); there is no
// network but loopback unless WithNetwork opts in; each limit in Limits
// is in force, as the sandbox's agent checks from inside (New fails with
// ErrLimitsUnsupported rather than run without one asked for; a limit it
// cannot see from inside is trusted); a command's kill takes every process
// it started; every byte the library takes from a sandbox is bounded; and
// the sandbox ends when it is closed, when its owner process dies, and at
// Limits.Lifetime. Package sandboxtest's Conformance states these promises
// as tests any backend, image or engine must pass; CI runs it against
// Docker, Podman and Kubernetes.
//
// How each promise is kept is the backend's, and its package doc says so:
// [github.com/agentsandbox/sandbox/docker] for Docker and Podman (the
// container's cgroups and resource limits, a loop-mounted ext4 disk or a
// tmpfs, the engine's "none" network, a bridge and host firewall rules for
// an open network) and github.com/agentsandbox/sandbox/kubernetes (the
// container's limits, the PIDs limit as RLIMIT_NPROC, memory-backed
// emptyDirs, interfaces set down by an init container). What a backend
// cannot give, it refuses rather than pretend: NetworkPolicy{Open: true}
// where it cannot be set up is ErrNetworkUnsupported, a capability it
// lacks (a snapshot's engine image) ErrUnsupported.
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
// Commands do not go through the engine's exec: the sandbox's main process
// is the library's agent (a small static Go program that the backend
// delivers read-only; the image is not changed and needs no shell), which
// the library talks to over one stream. The agent runs as root with only
// the capabilities it needs, non-dumpable, so sandbox code cannot signal,
// trace or feed it; commands run as the sandbox user with no capabilities
// at all. Each command's processes carry a supplementary group of their own
// that they cannot drop, and a kill removes every process carrying it,
// wherever it went.
//
// # The activity record
//
// With WithActivity(true), every command's Result (and Cmd.Activity,
// after Wait) carries an Activity: every program the command and its descendants executed —
// process and parent, program and arguments (bounded), user, start and
// end, exit status or signal, CPU time and peak memory —, every file
// they created, modified, removed or renamed, and every connection they
// attempted, in order, at most 10,000 events per command
// (WithActivityLimit changes it) with the rest counted in Dropped. Each event also goes to the audit log
// (WithLogger) as a "sandbox.activity" record as it happens (kind "exec",
// "exit", "file" or "connect"; a refused file change or connection at
// level Warn), before the
// command's "sandbox.exec": a handler that cancels the command's context
// on an event it dislikes stops the command there. It is off by default for now:
// WithActivity(true) turns it on. Its cost is over its goal (see
// docs/performance.md), and once, on rootful Podman under a loaded
// machine, a command's start hung behind it with 400 relayed connections
// held open; not reproduced alone, not explained yet. The agent starts
// its monitor only in a sandbox made with the record: its two threads
// count against Limits.PIDs, which must then be at least 24.
//
// It is seen from inside by the sandbox's agent, the same way on every
// backend: the agent forks commands on a thread carrying a seccomp filter
// that stops execve, execveat, connect, exit_group and the calls that
// change a file by name — open and openat asking for a write (a read
// passes untouched), creat, openat2, mkdir, mknod, link, symlink,
// unlink, rmdir, rename, truncate, each in every variant and in the
// 32-bit conventions too — until the agent has read what was asked
// (SECCOMP_RET_USER_NOTIF). The kernel passes a filter to every
// descendant and lets no process remove it (one it adds of its own comes
// on top), so a process that exits at once, a static binary, posix_spawn,
// execveat and an exec from a second thread are all seen; the engine's
// own seccomp profile still decides whether each call is allowed. What it
// does not give: the
// arguments of a process that made itself non-dumpable (the record has
// the PID and program only, or the arguments as the command was started);
// the status of a process killed by a signal when its parent reaps it
// before the agent looks (ExitCode -1, Signal empty); whether a peer
// answered a connection (Allowed says what the sandbox's policy lets
// through); events after the command's own process
// ended. An interpreter run's Execution.Activity holds the events that
// came between the run's start and its end (the interpreter's own process
// is not in it). gVisor has no seccomp user notification: there Activity
// is nil.
//
// A connection through the egress proxy is recorded as what the program
// asked the proxy for — the host and port of a CONNECT tunnel or an HTTP
// request, several on one kept-alive connection — with the proxy's
// decision (Allowed; Reason, why it refused: a host not in the
// allow-list, a name resolving to a forbidden address, an upstream that
// could not be reached) and its bytes (BytesIn, BytesOut) as far as they
// had gone when the command's record was made. The agent traces each connection to the proxy to
// the process that made it (the monitor reads which socket the process
// connects; the accepted connection's client socket is found by its
// port) and the library joins the proxy's decisions to that connect. A
// decision also goes to the audit log at once as a "sandbox.activity"
// record of kind "connect" naming the command (a refusal at level Warn),
// beside the proxy's "sandbox.network" record at the request's end. A
// connection to the proxy that asked nothing, or whose process the agent
// could not tell (one that made itself non-dumpable), stays the connect
// the monitor saw: the proxy's address, Allowed true.
//
// A file change is recorded as it begins, from what the file system holds
// then: "create" for a new name, "modify" for an existing file opened for
// writing (whether or not a byte is then written) or truncated, "remove",
// "rename" (From: the old name); Size and Mode are the file's before the
// change (a created file: 0, and the mode asked less the umask). Names are
// absolute, resolved against the process's working directory or
// directory descriptor. A call bound to fail (an open without O_CREAT of a
// missing file, a mkdir of an existing name) is not recorded; one the
// kernel refuses for its place (the read-only root, outside the writable
// places) or its permissions is recorded with Refused, as the agent
// learns by asking the kernel as the process's user. Not recorded: reads,
// special files, /proc, /sys and /dev (but /dev/shm); writes through a
// descriptor the command did not open by name (one it inherited, a
// memory mapping of it); names as a process sees them in a mount
// namespace of its own (the record resolves them in the sandbox's). A
// change through the library's own file methods (WriteFile...) is not a
// command's: the audit log has it (sandbox.file.write...). Watch sees changes
// of a directory as they land, unattributed.
//
// Both names and arguments are what the process asked when the agent read
// them: a process with a second thread can change the bytes between that
// read and the kernel's own (the limit of every monitor that reads a
// stopped call's memory), so the record is evidence of what was asked,
// not proof of what the kernel did. Names and arguments that are not
// valid UTF-8 are recorded with U+FFFD for each invalid byte.
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
// Close removes the sandbox (its container or pod), its disk and
// everything else it made. A sandbox also ends by itself when the process
// that made it exits (its agent's input closes) and after
// Limits.Lifetime. Every object a backend makes carries labels (or
// annotations) naming its owner process; Prune removes those whose owner
// has died.
//
// # What is not covered
//
// Isolation is that of Linux containers (namespaces, cgroups, a seccomp
// profile), sharing the kernel of the host or node; use
// WithRuntime("runsc") for gVisor where the engine has it (on Kubernetes,
// WithRuntime names a RuntimeClass). Where the working directory is memory
// (a tmpfs: Docker or Podman without root on the engine's host or with a
// remote engine, Kubernetes) its files count towards Limits.Memory (see
// Limits). Allow-lists, credentials and Expose need
// nothing of the engine's host (their connections travel over the agent's
// stream); NetworkPolicy{Open: true} is the backend's own network and is
// not available everywhere. See NetworkPolicy for what an allow-list does
// and does not stop.
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
// Docker stays the zero-configuration default, so DefaultDriver links the
// Docker backend (and the Docker SDK and OpenTelemetry packages it brings)
// into every program. A program that uses another backend can leave it
// out with the build tag agentsandbox_nodocker (go build -tags
// agentsandbox_nodocker): DefaultDriver is then nil, and New without
// WithDriver, and WithHost, fail with ErrNoDriver.
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
