# Main process of a sandbox container, run by docker-init as PID 1's only child.
# $1 is the lifetime in seconds (0 = none). Requests arrive one per line on
# stdin (the library's attach stream); replies go to stdout. Everything here is
# a shell builtin except sleep, so it still works when the sandbox has used up
# its PIDs limit. When stdin reaches EOF (the owning process died or closed the
# sandbox) the script ends, and with it the container.
if [ "${1:-0}" -gt 0 ]; then
	(sleep "$1"; kill -9 $$) </dev/null >/dev/null 2>&1 &
fi
# has SET PID: is PID a word of SET?
has() { case " $1 " in *" $2 "*) return 0 ;; esac; return 1; }
# marked FILE MARK: does the environment in FILE hold MARK? NUL bytes between
# variables are dropped or split by read; MARK is unique enough either way.
marked() {
	[ -n "$2" ] && [ -r "$1" ] || return 1
	e=
	while read -r e || [ -n "$e" ]; do
		case $e in *"$2"*) return 0 ;; esac
		e=
	done <"$1"
	return 1
}
# tree T MARK: kills process T and everything in its session, its process
# group, its descendants, and every process whose environment carries MARK
# (which catches daemons that left the session and were re-parented). The
# members are stopped first so none can fork away, then killed; the scan
# repeats until nothing new matches. T leads its own session and process
# group (docker exec makes it so), and the whole group is stopped at once
# first: a scan alone can miss a fork bomb whose short-lived members exit
# before they are read while their children live on.
tree() {
	t=$1 m=$2 set=" $1 " n=0
	[ "$t" -gt 1 ] 2>/dev/null || return
	kill -STOP -"$t" 2>/dev/null
	kill -STOP "$t" 2>/dev/null
	while [ $n -lt 64 ]; do
		n=$((n + 1)) more=
		for d in /proc/[0-9]*; do
			p=${d#/proc/}
			[ "$p" = "$$" ] && continue
			{ read -r l <"$d/stat"; } 2>/dev/null || continue
			set -- ${l##*) }
			[ "$1" = Z ] && continue
			if has "$set" "$p" || [ "$3" = "$t" ] || [ "$4" = "$t" ] || has "$set" "$2" ||
				marked "$d/environ" "$m" 2>/dev/null; then
				kill -STOP "$p" 2>/dev/null && ! has "$set" "$p" && { set="$set$p "; more=1; }
			fi
		done
		[ -z "$more" ] && break
	done
	kill -KILL -"$t" 2>/dev/null
	for p in $set; do kill -KILL "$p" 2>/dev/null; done
}
# oom ID: prints "o ID N", N being how many processes the kernel's OOM killer
# has ended in this container's memory cgroup (cgroup v1 or v2), or -1 if it
# cannot tell.
oom() {
	for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
		[ -r "$f" ] || continue
		while read -r k v; do
			[ "$k" = oom_kill ] && { echo "o $1 $v"; return; }
		done <"$f"
	done
	echo "o $1 -1"
}
while read -r op arg mark; do
	case $op in
	k) tree "$arg" "$mark"; echo "k $arg" ;;
	o) oom "$arg" ;;
	p) echo "p $arg" ;;
	esac
done
