#!/usr/bin/env bash
# cluster.sh up|down|status|load IMAGE...|env|cut NODE|heal NODE
#
# Starts and stops a real two-node Kubernetes cluster on this machine, offline,
# for the Kubernetes backend's tests. Must run as root.
#
#   up          build/unpack what is missing, start etcd, the control plane and
#               two kubelets (each node in its own network namespace with its
#               own containerd), wait until both nodes are Ready. Idempotent:
#               a healthy cluster is left alone, remnants of a dead one are
#               cleaned first.
#   down        stop everything and remove every trace (processes, mounts,
#               network namespaces, interfaces, cgroups, state dir). Idempotent.
#   status      exit 0 if the cluster is up and healthy.
#   load IMG..  copy Docker images (docker save) into both nodes' containerd,
#               so pods can use them with imagePullPolicy: Never.
#   env         print the shell exports a test needs (KUBECONFIG).
#   cut NODE    cut a node (agentsandbox-node-1 or -2) off the network;
#   heal NODE   and give it back (for tests of a lost node).
#
# Environment:
#   AGENTSANDBOX_K8S_DIR      state (certs, configs, logs in logs/, pid files,
#                             containerd and kubelet roots); default
#                             /var/lib/agentsandbox-k8s
#   AGENTSANDBOX_K8S_CACHE    kept between runs: bin/ (Kubernetes binaries made
#                             by build.sh), debian/ (unpacked Debian packages),
#                             pause/ (the pause image); default
#                             /var/cache/agentsandbox-k8s
#   AGENTSANDBOX_K8S_TIMEOUT  seconds `up` waits for the cluster (180)
#
# Layout (all addresses are private and live on this machine only):
#   bridge asbk8s0 10.213.0.1/24 in the host namespace; kube-apiserver listens
#   on https://10.213.0.1:6443; etcd, controller-manager and scheduler listen on
#   127.0.0.1 only (etcd has no auth, pods must never reach it).
#   node agentsandbox-node-N: netns agentsandbox-node-N, eth0 10.213.0.1N/24
#   (host end asbk8s-nN on the bridge), pod CIDR 10.214.N.0/24 on a CNI bridge
#   cni0 inside that netns, containerd socket and kubelet root under
#   $DIR/nodes/agentsandbox-node-N. Services: 10.215.0.0/24 (no kube-proxy:
#   ClusterIPs are allocated but not routed). No DNS, no default route, IPv4
#   only: pods reach other pods, the nodes, and of the host only the apiserver.
#
# Outside $DIR, `up` changes (and `down` undoes): the bridge, veths, netns and
# routes above; iptables: one FORWARD rule and one INPUT chain for asbk8s0;
# cgroups /agentsandbox-k8s-node-N in every v1 hierarchy; the global sysctls
# the kubelet sets (KUBELET_SYSCTLS, restored); fixed paths the kubelet and
# containerd use whatever their configuration (see HOST_DIRS).
set -euo pipefail

DIR=${AGENTSANDBOX_K8S_DIR:-/var/lib/agentsandbox-k8s}
CACHE=${AGENTSANDBOX_K8S_CACHE:-/var/cache/agentsandbox-k8s}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

BIN=$CACHE/bin                # kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
ROOTFS=$CACHE/debian          # Debian packages unpacked with dpkg-deb -x
DEBS=(etcd-server containerd containernetworking-plugins runc)
CTR=$ROOTFS/usr/bin/ctr

PKI=$DIR/pki
LOGS=$DIR/logs
RUN=$DIR/run

BRIDGE=asbk8s0
HOST_IP=10.213.0.1
NET_PREFIX=24
APISERVER=https://$HOST_IP:6443
ETCD_CLIENT=http://127.0.0.1:12379 # not 2379: do not collide with another etcd
ETCD_PEER=http://127.0.0.1:12380
SERVICE_CIDR=10.215.0.0/24
SERVICE_IP=10.215.0.1
NODES=(agentsandbox-node-1 agentsandbox-node-2)
PAUSE_IMAGE=agentsandbox.local/pause:1
CNI_NETWORK=agentsandbox-k8s
IPT_CHAIN=AGENTSANDBOX-K8S-INPUT
CGROUP_PREFIX=agentsandbox-k8s # cgroupRoot of node N: /agentsandbox-k8s-node-N
# Global (not per-namespace) sysctls that the kubelet sets on start-up when
# protectKernelDefaults is false; saved by up and restored by down.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
UP_TIMEOUT=${AGENTSANDBOX_K8S_TIMEOUT:-180}

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Per-node values, by index 0/1.
node_ip() { echo "10.213.0.1$(($1 + 1))"; }
node_cidr() { echo "10.214.$(($1 + 1)).0/24"; }
node_veth() { echo "asbk8s-n$(($1 + 1))"; }
node_dir() { echo "$DIR/nodes/${NODES[$1]}"; }
node_sock() { echo "$(node_dir "$1")/containerd/containerd.sock"; }
node_cgroup() { echo "$CGROUP_PREFIX-node-$(($1 + 1))"; }
netns_path() { echo "/var/run/netns/$1"; }

# ---------------------------------------------------------------- helpers

api() { # api PATH [curl args...]: call the apiserver as admin
	local path=$1; shift
	curl -sS --fail --max-time 5 -A agentsandbox-cluster \
		--cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
		"$@" "$APISERVER$path"
}

# (Output is matched in a variable, not with `| grep -q`: under pipefail an
# early-exiting grep can fail the pipeline through SIGPIPE.)
etcd_healthy() { [[ $(curl -sf --max-time 2 "$ETCD_CLIENT/health") == *'"health":"true"'* ]]; }

apiserver_ready() { [[ $(api /readyz 2>/dev/null) == ok ]]; }

node_ready() { # the apiserver says node $1 has condition Ready=True
	local node
	node=$(api "/api/v1/nodes/$1" 2>/dev/null) || return 1
	node=${node//[$' \n']/}
	[[ $node == *'"type":"Ready","status":"True"'* ]]
}

tail_logs() {
	local name
	for name in "$@"; do
		[[ -f $LOGS/$name.log ]] || continue
		log "---- last lines of $LOGS/$name.log"
		tail -n 25 "$LOGS/$name.log" >&2 || true
	done
}

# wait_for DESCRIPTION DEADLINE "LOG NAMES" COMMAND...: poll COMMAND every
# 0.5 s until it succeeds or $SECONDS passes DEADLINE; then fail with
# the tails of the named logs.
wait_for() {
	local desc=$1 deadline=$2 logs=$3; shift 3
	until "$@" 2>/dev/null; do
		if ((SECONDS > deadline)); then
			log "timed out waiting for $desc"
			# shellcheck disable=SC2086
			tail_logs $logs
			die "$desc did not come up; state and logs are in $DIR (run '$0 down' to clean up)"
		fi
		sleep 0.5
	done
}

# A zombie is not alive: daemons outlive the `up` that started them, and the
# machine's init may be slow to reap them.
pid_alive() {
	[[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null &&
		[[ $(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null) != Z ]]
}

# A live process of this cluster: every daemon's command line names $DIR. (A
# pid file that survived a reboot may name somebody else's process now.)
our_pid() {
	pid_alive "$1" && [[ $({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null) == *"$DIR/"* ]]
}

# start_daemon NAME NETNS COMMAND...: run COMMAND detached in its own session
# (setsid; no controlling terminal, so no SIGHUP), stdout/stderr to
# $LOGS/NAME.log, pid in $RUN/NAME.pid. With NETNS, it runs in that network
# namespace via nsenter --net: NOT `ip netns exec`, which also unshares the
# mount namespace and remounts /sys, hiding the cgroup hierarchy from the
# kubelet and containerd. setsid does not fork here (a background job of a
# script is not a process group leader) and nsenter --net execs, so $! is the
# daemon itself.
start_daemon() {
	local name=$1 ns=$2; shift 2
	local pre=()
	[[ -z $ns ]] || pre=(nsenter "--net=$(netns_path "$ns")" --)
	setsid nohup "${pre[@]}" "$@" >"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
	echo $! >"$RUN/$name.pid"
}

# stop_pid PID [SECONDS]: TERM, wait, then KILL.
stop_pid() {
	local pid=$1 secs=${2:-10} i
	our_pid "$pid" || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < secs * 10; i++)); do
		pid_alive "$pid" || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

stop_daemon() { # stop_daemon NAME [SECONDS]
	local f=$RUN/$1.pid
	[[ -f $f ]] || return 0
	stop_pid "$(cat "$f")" "${2:-10}"
	rm -f "$f"
}

daemon_names() {
	local i
	echo etcd kube-apiserver kube-controller-manager kube-scheduler
	for i in "${!NODES[@]}"; do echo "containerd-${NODES[$i]}" "kubelet-${NODES[$i]}"; done
}

all_daemons_alive() {
	local name
	for name in $(daemon_names); do
		[[ -f $RUN/$name.pid ]] && our_pid "$(cat "$RUN/$name.pid")" || return 1
	done
}

# ------------------------------------------------------------ dependencies

ensure_tools() {
	local missing=() pair
	# (go is needed too, but only by build.sh and ensure_pause when their
	# results are not cached yet.)
	for pair in openssl:openssl ip:iproute2 nsenter:util-linux curl:curl setsid:util-linux \
		flock:util-linux mountpoint:util-linux iptables:iptables; do
		command -v "${pair%%:*}" >/dev/null && continue
		missing+=("${pair#*:}")
	done
	((${#missing[@]} == 0)) && return
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# etcd, containerd (with ctr and its runc shim), runc and the CNI plugins come
# from Debian, unpacked into the cache with dpkg-deb -x: installing the
# packages would start system services (and a second system containerd would
# fight Docker's).
ensure_debs() {
	local stamp=$ROOTFS/.packages
	[[ -f $stamp && $(cat "$stamp") == "${DEBS[*]}" ]] && return
	log "downloading ${DEBS[*]} from Debian into $CACHE"
	rm -rf "$CACHE/debs" "$ROOTFS"
	mkdir -p "$CACHE/debs" "$ROOTFS"
	if ! (cd "$CACHE/debs" && apt-get download -q "${DEBS[@]}" >/dev/null 2>&1); then
		apt-get update -qq
		(cd "$CACHE/debs" && apt-get download -q "${DEBS[@]}" >/dev/null)
	fi
	local deb
	for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOTFS"; done
	rm -rf "$CACHE/debs"
	for deb in usr/bin/etcd usr/bin/containerd usr/bin/containerd-shim-runc-v2 usr/bin/ctr \
		usr/sbin/runc usr/lib/cni/bridge usr/lib/cni/host-local usr/lib/cni/loopback; do
		[[ -x $ROOTFS/$deb ]] || die "$ROOTFS/$deb missing after unpacking ${DEBS[*]}"
	done
	# runc is linked against libseccomp (present wherever Docker is).
	if ! "$ROOTFS/usr/sbin/runc" --version >/dev/null 2>&1; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp2 >/dev/null
		"$ROOTFS/usr/sbin/runc" --version >/dev/null || die "$ROOTFS/usr/sbin/runc does not run"
	fi
	echo "${DEBS[*]}" >"$stamp"
}

# The pause image: no registry can be reached, so the sandbox image is made
# here. A tiny static Go program (sleeps until SIGINT/SIGTERM, reaps children,
# as registry.k8s.io/pause does) packed as a docker-archive tar (manifest.json
# + config + one layer) that `ctr images import` accepts.
ensure_pause() {
	local out=$CACHE/pause
	[[ -f $out/pause.tar && $(cat "$out/.image" 2>/dev/null) == "$PAUSE_IMAGE" ]] && return
	log "building the pause image $PAUSE_IMAGE"
	rm -rf "$out"
	mkdir -p "$out/src" "$out/rootfs" "$out/archive"
	cat >"$out/src/pause.go" <<'EOF'
// pause: the pod sandbox's process. Sleeps until SIGINT or SIGTERM and, as
// PID 1 of the pod, reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 16)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
	(cd "$out/src" && CGO_ENABLED=0 GOFLAGS='' go build -trimpath -ldflags '-s -w' \
		-o "$out/rootfs/pause" pause.go)
	local arch
	arch=$(go env GOARCH)
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
		-C "$out/rootfs" -cf "$out/layer.tar" pause
	local layer config cfgsha
	layer=$(sha256sum "$out/layer.tar" | cut -d' ' -f1)
	config='{"architecture":"'$arch'","os":"linux","created":"1970-01-01T00:00:00Z",'
	config+='"config":{"Entrypoint":["/pause"],"WorkingDir":"/"},'
	config+='"rootfs":{"type":"layers","diff_ids":["sha256:'$layer'"]},'
	config+='"history":[{"created":"1970-01-01T00:00:00Z","created_by":"cluster.sh pause"}]}'
	cfgsha=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
	mkdir -p "$out/archive/$layer"
	mv "$out/layer.tar" "$out/archive/$layer/layer.tar"
	printf '%s' "$config" >"$out/archive/$cfgsha.json"
	printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
		"$cfgsha" "$PAUSE_IMAGE" "$layer" >"$out/archive/manifest.json"
	tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$out/archive" \
		-cf "$out/pause.tar.tmp" manifest.json "$cfgsha.json" "$layer/layer.tar"
	mv "$out/pause.tar.tmp" "$out/pause.tar"
	rm -rf "$out/archive" "$out/src" "$out/rootfs"
	echo "$PAUSE_IMAGE" >"$out/.image"
}

# ------------------------------------------------------------------- certs

# issue NAME SUBJECT EXTENSIONS: an ECDSA P-256 key and a certificate signed by
# the cluster CA (P-256: key generation is instant, unlike RSA).
issue() {
	local name=$1 subj=$2 ext=$3
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$name.key" 2>/dev/null
	printf '%b\n' "$ext" >"$PKI/$name.ext"
	openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
		-set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
		-extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

client_ext='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth'
server_ext='basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth'

make_certs() {
	mkdir -p "$PKI"
	chmod 700 "$PKI"
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null
	printf '[req]\ndistinguished_name=dn\n[dn]\n[ca]\n%s\n%s\n%s\n' \
		'basicConstraints=critical,CA:TRUE' 'keyUsage=critical,keyCertSign,cRLSign,digitalSignature' \
		'subjectKeyIdentifier=hash' >"$PKI/ca.cnf"
	openssl req -x509 -new -config "$PKI/ca.cnf" -extensions ca -key "$PKI/ca.key" \
		-subj "/CN=agentsandbox-k8s-ca" -days 3650 -sha256 -out "$PKI/ca.crt" 2>/dev/null
	rm -f "$PKI/ca.cnf"

	issue apiserver "/CN=kube-apiserver" "$server_ext\nsubjectAltName=IP:$HOST_IP,IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	# The apiserver's client cert towards the kubelets (exec/attach/logs/port-forward).
	issue apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client" "$client_ext"
	issue admin "/O=system:masters/CN=admin" "$client_ext"
	issue controller-manager "/CN=system:kube-controller-manager" "$client_ext"
	issue scheduler "/CN=system:kube-scheduler" "$client_ext"
	local i n
	for i in "${!NODES[@]}"; do
		n=${NODES[$i]}
		issue "kubelet-$n" "/O=system:nodes/CN=system:node:$n" "$client_ext"
		# Serving cert signed by the CA, so the apiserver verifies the kubelets
		# (--kubelet-certificate-authority) instead of trusting any cert.
		issue "kubelet-$n-serving" "/CN=$n" "$server_ext\nsubjectAltName=IP:$(node_ip "$i"),DNS:$n"
	done
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/sa.key" 2>/dev/null
	openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# kubeconfig FILE USER CERTNAME: a kubeconfig with everything embedded, so it
# can be copied anywhere on this machine.
kubeconfig() {
	local file=$1 user=$2 cert=$3
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: agentsandbox
  cluster:
    server: $APISERVER
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$cert.crt")
    client-key-data: $(base64 -w0 "$PKI/$cert.key")
contexts:
- name: agentsandbox
  context:
    cluster: agentsandbox
    user: $user
current-context: agentsandbox
EOF
	chmod 600 "$file"
}

# ----------------------------------------------------------------- network

net_up() {
	ip link add "$BRIDGE" type bridge
	# IPv4 only: no IPv6 link-local path between nodes, pods and the host.
	sysctl -qw "net.ipv6.conf.$BRIDGE.disable_ipv6=1"
	ip addr add "$HOST_IP/$NET_PREFIX" dev "$BRIDGE"
	ip link set "$BRIDGE" up
	local i j ns
	for i in "${!NODES[@]}"; do
		ns=${NODES[$i]}
		ip netns add "$ns"
		# /proc/sys/net is per network namespace: these touch only the node.
		nsenter --net="$(netns_path "$ns")" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 \
			net.ipv6.conf.default.disable_ipv6=1 net.ipv4.ip_forward=1
		ip link add "$(node_veth "$i")" type veth peer name eth0 netns "$ns"
		sysctl -qw "net.ipv6.conf.$(node_veth "$i").disable_ipv6=1"
		ip link set "$(node_veth "$i")" master "$BRIDGE" up
		ip -n "$ns" link set lo up
		ip -n "$ns" addr add "$(node_ip "$i")/$NET_PREFIX" dev eth0
		ip -n "$ns" link set eth0 up
		# A flat pod network: other nodes' pod CIDRs via their node IP, and
		# the host reaches every pod through its node. No default route, so
		# pods cannot leave this machine's namespaces.
		ip route add "$(node_cidr "$i")" via "$(node_ip "$i")" dev "$BRIDGE"
		for j in "${!NODES[@]}"; do
			((i == j)) || ip -n "$ns" route add "$(node_cidr "$j")" via "$(node_ip "$j")" dev eth0
		done
	done
	# Docker loads br_netfilter and sets the FORWARD policy to DROP, so frames
	# bridged between two nodes' veths (pod-to-pod across nodes) would be
	# dropped by the host's iptables. Accept forwarding within our bridge only.
	# And the host is this whole machine: pods (untrusted code) and the nodes
	# may reach only the apiserver on it, not whatever else listens on all
	# addresses. Replies to the host's own connections (apiserver -> kubelet,
	# host -> pod) pass as ESTABLISHED. (Rules left by a crashed run go first.)
	iptables_down
	iptables -w -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -m comment --comment agentsandbox-k8s -j ACCEPT
	iptables -w -N "$IPT_CHAIN"
	iptables -w -A "$IPT_CHAIN" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
	iptables -w -A "$IPT_CHAIN" -p tcp -d "$HOST_IP" --dport 6443 -j ACCEPT
	iptables -w -A "$IPT_CHAIN" -j DROP
	iptables -w -I INPUT 1 -i "$BRIDGE" -j "$IPT_CHAIN"
}

net_down() {
	local ns
	for ns in "${NODES[@]}"; do
		if [[ -e $(netns_path "$ns") ]]; then ip netns del "$ns" 2>/dev/null || true; fi
	done
	local i
	for i in "${!NODES[@]}"; do
		ip link del "$(node_veth "$i")" 2>/dev/null || true
	done
	ip link del "$BRIDGE" 2>/dev/null || true
	iptables_down
}

iptables_down() {
	command -v iptables >/dev/null || return 0
	while iptables -w -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -m comment --comment agentsandbox-k8s -j ACCEPT 2>/dev/null; do :; done
	while iptables -w -D INPUT -i "$BRIDGE" -j "$IPT_CHAIN" 2>/dev/null; do :; done
	if iptables -w -F "$IPT_CHAIN" 2>/dev/null; then iptables -w -X "$IPT_CHAIN"; fi
}

# ----------------------------------------------------------------- cgroups

cgroup_mounts() { # mount points of the cgroup hierarchies: v1 only, or all with "all"
	awk -v all="${1:-}" '$3 == "cgroup" || (all == "all" && $3 == "cgroup2") {print $2}' /proc/mounts
}

# The kubelet's cgroupRoot must already exist in every cgroup v1 hierarchy.
cgroups_up() {
	local i mnt cg
	for i in "${!NODES[@]}"; do
		cg=$(node_cgroup "$i")
		for mnt in $(cgroup_mounts); do
			mkdir -p "$mnt/$cg"
			# A new v1 cpuset has no CPUs or memory nodes: copy the parent's.
			if [[ -f $mnt/cpuset.cpus ]]; then
				cat "$mnt/cpuset.cpus" >"$mnt/$cg/cpuset.cpus"
				cat "$mnt/cpuset.mems" >"$mnt/$cg/cpuset.mems"
			fi
		done
	done
}

cgroup_pids() { # pids of every process in node $1's cgroups
	local mnt cg
	cg=$(node_cgroup "$1")
	for mnt in $(cgroup_mounts all); do
		[[ -d $mnt/$cg ]] || continue
		find "$mnt/$cg" -name cgroup.procs -exec cat {} + 2>/dev/null || true
	done | sort -un
}

cgroups_down() {
	local i mnt cg try
	for i in "${!NODES[@]}"; do
		cg=$(node_cgroup "$i")
		# A cgroup is removable only when empty; killed processes may take a
		# moment to leave it.
		for ((try = 0; try < 50; try++)); do
			local left=0
			for mnt in $(cgroup_mounts all); do
				[[ -d $mnt/$cg ]] || continue
				find "$mnt/$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
				if [[ -d $mnt/$cg ]]; then left=1; fi
			done
			((left)) || break
			sleep 0.1
		done
	done
}

# --------------------------------------------------------------- processes

# Every process of the cluster: its binaries live in the cache and its
# command lines name files under $DIR. (Docker's containerd and shims run from
# /usr/bin and use /run/containerd, so they never match.)
cluster_pids() {
	local exe p
	# (find fails when a process exits while it looks: not an error here.)
	{ find /proc/[0-9]* -maxdepth 1 -name exe \( -lname "$BIN/*" -o -lname "$ROOTFS/*" \) 2>/dev/null || true; } |
		while read -r exe; do
			p=${exe%/exe}
			[[ $({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) == *"$DIR/"* ]] || continue
			echo "${p#/proc/}"
		done
}

# Listening unix sockets of process $1 (shims' sockets in /run/containerd/s,
# which a killed shim leaves behind).
unix_sockets_of() {
	local inodes
	inodes=$({ find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null || true; } | tr -dc '0-9\n' | sort -u)
	[[ -n $inodes ]] || return 0
	awk 'NR == FNR {want[$1] = 1; next} ($7 in want) && $8 ~ /^\// {print $8}' \
		<(echo "$inodes") "/proc/$1/net/unix" # (its network namespace's table)
}

kill_node_workloads() { # stop all containers of node $1 and their shims
	local i=$1 sock pids try p
	sock=$(node_sock "$i")
	# Through containerd first while it runs: a deleted task makes its shim
	# exit cleanly and remove its socket.
	if [[ -S $sock ]] && timeout 5 "$CTR" -a "$sock" version >/dev/null 2>&1; then
		local id
		for id in $(timeout 10 "$CTR" -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
			timeout 10 "$CTR" -a "$sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
		done
	fi
	# Then whatever is left in the node's cgroups (pods' processes).
	for ((try = 0; try < 50; try++)); do
		pids=$(cgroup_pids "$i")
		[[ -n $pids ]] || break
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		sleep 0.1
	done
}

# The shims' sockets (in /run/containerd/s, named by a hash): a shim that is
# killed, or whose containerd stops before it has cleaned up, leaves its socket
# behind, so `down` notes them first and removes what is left at the end.
SHIM_SOCKETS=()
note_shim_sockets() {
	local p
	for p in $(cluster_pids); do
		if [[ $(readlink "/proc/$p/exe" 2>/dev/null) == */containerd-shim-runc-v2 ]]; then
			mapfile -t -O "${#SHIM_SOCKETS[@]}" SHIM_SOCKETS < <(unix_sockets_of "$p")
		fi
	done
}

remove_shim_sockets() {
	local s
	for s in "${SHIM_SOCKETS[@]}"; do
		if [[ $s == /run/containerd/s/* || $s == "$DIR/"* ]]; then rm -f "$s"; fi
	done
}

kill_leftovers() { # any cluster process not stopped by its pid file
	local pids try
	pids=$(cluster_pids)
	[[ -n $pids ]] || return 0
	log "stopping leftover processes: ${pids//$'\n'/ }"
	# shellcheck disable=SC2086
	kill -TERM $pids 2>/dev/null || true
	for ((try = 0; try < 50; try++)); do
		pids=$(cluster_pids)
		[[ -n $pids ]] || break
		sleep 0.1
	done
	# shellcheck disable=SC2086
	[[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
	sleep 0.2
}

# ------------------------------------------------------------------ mounts

dir_mounts() { # mount points under $DIR, deepest first
	awk -v d="$DIR" '{
		m = $2; gsub(/\\040/, " ", m); gsub(/\\011/, "\t", m); gsub(/\\134/, "\\", m)
		if (m == d || index(m, d "/") == 1) print length(m) "\t" m
	}' /proc/self/mounts | sort -rn | cut -f2-
}

unmount_all() {
	local try m
	for ((try = 0; try < 5; try++)); do
		[[ -n $(dir_mounts) ]] || return 0
		while IFS= read -r m; do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done < <(dir_mounts)
	done
	[[ -z $(dir_mounts) ]] || log "warning: still mounted under $DIR: $(dir_mounts | tr '\n' ' ')"
}

# ---------------------------------------------------------------- daemons

start_etcd() {
	mkdir -p "$DIR/etcd"
	chmod 700 "$DIR/etcd"
	# Loopback only: etcd has no authentication here. No fsync: a test
	# cluster's data is thrown away by `down` anyway, and fsyncs cost seconds.
	start_daemon etcd "" "$ROOTFS/usr/bin/etcd" \
		--name agentsandbox --data-dir "$DIR/etcd" \
		--listen-client-urls "$ETCD_CLIENT" --advertise-client-urls "$ETCD_CLIENT" \
		--listen-peer-urls "$ETCD_PEER" --initial-advertise-peer-urls "$ETCD_PEER" \
		--initial-cluster "agentsandbox=$ETCD_PEER" --initial-cluster-state new \
		--unsafe-no-fsync --logger zap --log-level warn
}

start_apiserver() {
	start_daemon kube-apiserver "" "$BIN/kube-apiserver" \
		--advertise-address="$HOST_IP" --bind-address="$HOST_IP" --secure-port=6443 \
		--etcd-servers="$ETCD_CLIENT" \
		--client-ca-file="$PKI/ca.crt" \
		--tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
		--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$PKI/ca.crt" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc \
		--service-account-key-file="$PKI/sa.pub" \
		--service-account-signing-key-file="$PKI/sa.key" \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--authorization-mode=Node,RBAC \
		--enable-admission-plugins=NodeRestriction \
		--allow-privileged=true \
		--profiling=false
}

start_controllers() {
	kubeconfig "$DIR/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
	kubeconfig "$DIR/scheduler.kubeconfig" system:kube-scheduler scheduler
	# Pod CIDRs are fixed per node in the CNI config, so no node IPAM here.
	# One instance each: no leader election (it only delays start-up). No
	# --authentication/authorization-kubeconfig: their own HTTPS endpoints are
	# not used (health checks go to the apiserver) and with them both log an
	# error every few seconds because no front-proxy CA is configured.
	start_daemon kube-controller-manager "" "$BIN/kube-controller-manager" \
		--kubeconfig="$DIR/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false \
		--service-account-private-key-file="$PKI/sa.key" \
		--root-ca-file="$PKI/ca.crt" \
		--cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
		--use-service-account-credentials=true \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--profiling=false
	start_daemon kube-scheduler "" "$BIN/kube-scheduler" \
		--kubeconfig="$DIR/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

# overlayfs is the snapshotter of choice; fall back to native where $DIR's
# file system cannot hold an overlay's upper dir.
pick_snapshotter() {
	local t=$DIR/tmp/ovl
	mkdir -p "$t/lower" "$t/upper" "$t/work" "$t/merged"
	if mount -t overlay overlay -o "lowerdir=$t/lower,upperdir=$t/upper,workdir=$t/work" "$t/merged" 2>/dev/null; then
		umount "$t/merged"
		echo overlayfs
	else
		echo native
	fi
	rm -rf "$t"
}

write_node_configs() { # write_node_configs INDEX SNAPSHOTTER
	local i=$1 snap=$2 n nd ip
	n=${NODES[$i]}
	nd=$(node_dir "$i")
	ip=$(node_ip "$i")
	mkdir -p "$nd/containerd" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/kubelet" "$nd/pod-logs" "$nd/volume-plugins"

	# containerd of the node's own (root, state, socket, runc root all under
	# $DIR): Docker's containerd has CRI disabled and must not be touched.
	cat >"$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$nd/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # No registry: the locally built pause image, imported at start-up.
  sandbox_image = "$PAUSE_IMAGE"
  # runc cannot set oom_score_adj -998 for the sandbox on this host.
  restrict_oom_score_adj = true
  # Pods' network namespaces under \$DIR, not in /var/run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snap"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$ROOTFS/usr/sbin/runc"
        Root = "$nd/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$ROOTFS/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
    max_conf_num = 1
EOF

	# The pod network: a bridge cni0 in the node's namespace, addresses from
	# the node's fixed pod CIDR (host-local state under $DIR). containerd adds
	# the loopback interface itself. No masquerade: nothing leaves the machine.
	cat >"$nd/cni/net.d/10-agentsandbox.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$(node_cidr "$i")"}]],
        "dataDir": "$nd/cni/ipam"
      }
    }
  ]
}
EOF

	kubeconfig "$nd/kubelet.kubeconfig" "system:node:$n" "kubelet-$n"
	cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-$n-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-$n-serving.key
# The apiserver authenticates with its kubelet-client cert (signed by the CA).
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
# This host has cgroup v1 (hybrid); kubelet 1.34 runs there only when told to.
failCgroupV1: false
cgroupDriver: cgroupfs
# Pre-created in every v1 hierarchy; each node gets its own.
cgroupRoot: /$(node_cgroup "$i")
cgroupsPerQOS: true
# Docker owns the host's iptables; no kube-proxy here.
makeIPTablesUtilChains: false
failSwapOn: false
# No cluster DNS; do not hand the host's resolvers to pods.
resolvConf: ""
maxPods: 110
serializeImagePulls: false
# Images come only from 'cluster.sh load': never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Lenient evictions: this is a shared development machine, not a fleet.
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
# Keep everything of the node under \$DIR (defaults are /var/log/pods and
# /usr/libexec/kubernetes/kubelet-plugins).
podLogsDir: $nd/pod-logs
volumePluginDir: $nd/volume-plugins
EOF
}

start_containerd() { # start_containerd INDEX
	local i=$1 nd
	nd=$(node_dir "$i")
	# PATH: containerd finds its shim (containerd-shim-runc-v2) through PATH.
	start_daemon "containerd-${NODES[$i]}" "${NODES[$i]}" \
		env "PATH=$ROOTFS/usr/bin:$ROOTFS/usr/sbin:$PATH" \
		"$ROOTFS/usr/bin/containerd" --config "$nd/containerd/config.toml"
}

containerd_up() { "$CTR" -a "$(node_sock "$1")" version >/dev/null 2>&1; }

import_pause() { # import_pause INDEX SNAPSHOTTER
	"$CTR" -a "$(node_sock "$1")" -n k8s.io images import --snapshotter "$2" \
		"$CACHE/pause/pause.tar" >"$LOGS/import-pause-${NODES[$1]}.log" 2>&1 ||
		{ tail_logs "import-pause-${NODES[$1]}" "containerd-${NODES[$1]}"; die "importing the pause image into ${NODES[$1]} failed"; }
}

start_kubelet() { # start_kubelet INDEX
	local i=$1 nd
	nd=$(node_dir "$i")
	start_daemon "kubelet-${NODES[$i]}" "${NODES[$i]}" "$BIN/kubelet" \
		--config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
		--root-dir="$nd/kubelet" --cert-dir="$nd/kubelet/pki" \
		--hostname-override="${NODES[$i]}" --node-ip="$(node_ip "$i")"
}

save_sysctls() {
	local k
	[[ -f $RUN/sysctl.orig ]] && return
	for k in "${KUBELET_SYSCTLS[@]}"; do
		echo "$k=$(sysctl -n "$k")"
	done >"$RUN/sysctl.orig"
}

# Fixed host paths that the cluster writes to whatever its configuration:
#   /run/netns                   ip netns add (a bind mount of itself)
#   /var/log/containers          kubelet: symlinks to the containers' logs
#   /var/lib/kubelet/device-plugins  kubelet: its device-plugin socket
#   /var/lib/cni/results         containerd's CNI library: a cache per pod
#   /run/containerd/s            containerd: the shims' sockets
# `up` records which of them did not exist, so `down` removes only those (once
# emptied of the cluster's files).
HOST_DIRS=(/run/netns /var/log/containers /var/lib/kubelet /var/lib/cni /run/containerd)
record_host_dirs() {
	local d
	[[ -f $RUN/host-dirs ]] && return
	for d in "${HOST_DIRS[@]}"; do
		[[ -e $d ]] || echo "$d"
	done >"$RUN/host-dirs"
}

made_host_dir() { [[ -f $RUN/host-dirs ]] && grep -qxF "$1" "$RUN/host-dirs"; }

clean_host_dirs() {
	local l f id ids=()
	# Symlinks into $DIR.
	if [[ -d /var/log/containers ]]; then
		for l in /var/log/containers/*; do
			if [[ -L $l && $(readlink "$l") == "$DIR/"* ]]; then rm -f "$l"; fi
		done
	fi
	# CNI cache entries of the pods killed without a CNI DEL: those of our
	# network, and the loopback entries of the same sandboxes.
	for f in /var/lib/cni/results/"$CNI_NETWORK"-*; do
		[[ -e $f ]] || continue
		id=${f#/var/lib/cni/results/"$CNI_NETWORK"-}
		ids+=("${id%-*}")
		rm -f "$f"
	done
	for f in "$DIR"/nodes/*/containerd/root/io.containerd.grpc.v1.cri/sandboxes/*; do
		if [[ -e $f ]]; then ids+=("${f##*/}"); fi
	done
	for id in "${ids[@]}"; do rm -f /var/lib/cni/results/cni-loopback-"$id"-lo; done
	if made_host_dir /var/lib/kubelet; then
		rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
		rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
	fi
	if made_host_dir /var/lib/cni; then rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true; fi
	if made_host_dir /var/log/containers; then rmdir /var/log/containers 2>/dev/null || true; fi
	if made_host_dir /run/containerd; then rmdir /run/containerd/s /run/containerd 2>/dev/null || true; fi
	if made_host_dir /run/netns && [[ -d /run/netns && -z $(ls -A /run/netns) ]]; then
		while mountpoint -q /run/netns; do umount /run/netns || break; done
		rmdir /run/netns 2>/dev/null || true
	fi
}

restore_sysctls() {
	local kv
	[[ -f $RUN/sysctl.orig ]] || return 0
	while IFS= read -r kv; do
		sysctl -qw "$kv" >/dev/null 2>&1 || log "warning: could not restore $kv"
	done <"$RUN/sysctl.orig"
}


# ---------------------------------------------------------------- commands

healthy() {
	[[ -f $PKI/admin.crt ]] && all_daemons_alive || return 1
	apiserver_ready || return 1
	local n
	for n in "${NODES[@]}"; do node_ready "$n" || return 1; done
}

remnants() { # anything of a cluster on this machine?
	local n
	[[ -e $RUN || -e $PKI || -e $DIR/nodes || -e $DIR/etcd ]] && return 0
	ip link show "$BRIDGE" >/dev/null 2>&1 && return 0
	for n in "${NODES[@]}"; do [[ -e $(netns_path "$n") ]] && return 0; done
	[[ -n $(cluster_pids) ]]
}

summary() {
	local i
	echo "cluster up in $((SECONDS - T0)) s: $APISERVER (Kubernetes $("$BIN/kube-apiserver" --version | awk '{print $2}'))"
	for i in "${!NODES[@]}"; do
		echo "  node ${NODES[$i]}: $(node_ip "$i"), pods $(node_cidr "$i"), containerd $(node_sock "$i")"
	done
	echo "  images: $PAUSE_IMAGE (sandbox); add more with: $0 load IMAGE..."
	echo "  logs: $LOGS"
	echo "export KUBECONFIG=$DIR/admin.kubeconfig"
}

cmd_up() {
	[[ $(id -u) == 0 ]] || die "must run as root"
	T0=$SECONDS
	if [[ -f $PKI/admin.crt ]] && healthy; then
		echo "cluster already up and healthy"
		echo "export KUBECONFIG=$DIR/admin.kubeconfig"
		return 0
	fi
	if remnants; then
		log "cleaning up the remnants of an earlier cluster"
		cmd_down
	fi

	ensure_tools
	mkdir -p "$CACHE"
	log "building the Kubernetes binaries if needed (build.sh)"
	bash "$HERE/build.sh" "$BIN"
	ensure_debs
	ensure_pause

	T0=$SECONDS
	mkdir -p "$DIR" "$LOGS" "$RUN" "$DIR/tmp"
	record_host_dirs
	make_certs
	kubeconfig "$DIR/admin.kubeconfig" admin admin
	net_up
	cgroups_up
	save_sysctls

	local deadline=$((SECONDS + UP_TIMEOUT)) i snap
	snap=$(pick_snapshotter)
	start_etcd
	for i in "${!NODES[@]}"; do
		write_node_configs "$i" "$snap"
		start_containerd "$i"
	done
	wait_for "etcd" "$deadline" "etcd" etcd_healthy
	start_apiserver
	for i in "${!NODES[@]}"; do
		wait_for "containerd of ${NODES[$i]}" "$deadline" "containerd-${NODES[$i]}" containerd_up "$i"
		import_pause "$i" "$snap"
		start_kubelet "$i"
	done
	wait_for "kube-apiserver" "$deadline" "etcd kube-apiserver" apiserver_ready
	start_controllers
	local n
	for n in "${NODES[@]}"; do
		wait_for "node $n Ready" "$deadline" "kubelet-$n containerd-$n" node_ready "$n"
	done
	# Pods need their namespace's default service account and the root CA
	# config map (made by the controller-manager) before they can start.
	wait_for "the default service account" "$deadline" "kube-controller-manager" \
		api /api/v1/namespaces/default/serviceaccounts/default -o /dev/null
	wait_for "the kube-root-ca.crt config map" "$deadline" "kube-controller-manager" \
		api /api/v1/namespaces/default/configmaps/kube-root-ca.crt -o /dev/null
	if ! all_daemons_alive; then
		# shellcheck disable=SC2046
		tail_logs $(daemon_names)
		die "a daemon died during start-up"
	fi
	summary
}

cmd_down() {
	[[ $(id -u) == 0 ]] || die "must run as root"
	local i n
	note_shim_sockets
	# Kubelets first, so nothing restarts the containers killed below.
	for n in "${NODES[@]}"; do stop_daemon "kubelet-$n"; done
	stop_daemon kube-scheduler
	stop_daemon kube-controller-manager
	stop_daemon kube-apiserver
	for i in "${!NODES[@]}"; do
		kill_node_workloads "$i"
		stop_daemon "containerd-${NODES[$i]}"
	done
	stop_daemon etcd
	kill_leftovers
	for i in "${!NODES[@]}"; do kill_node_workloads "$i"; done
	remove_shim_sockets
	unmount_all
	net_down
	cgroups_down
	restore_sysctls
	clean_host_dirs
	# Delete the state, but never the cache if it lives inside it.
	if [[ -e $DIR ]]; then
		if [[ $CACHE == "$DIR/"* ]]; then
			local keep=${CACHE#"$DIR/"}
			find "$DIR" -mindepth 1 -maxdepth 1 ! -name "${keep%%/*}" -exec rm -rf {} +
		else
			rm -rf "$DIR"
		fi
	fi
	echo "cluster down"
}

cmd_status() {
	if healthy; then
		echo "cluster up: $APISERVER, KUBECONFIG=$DIR/admin.kubeconfig"
	else
		echo "cluster not up"
		return 1
	fi
}

cmd_load() {
	(($# > 0)) || die "usage: $0 load IMAGE..."
	command -v docker >/dev/null || die "load needs docker"
	local i img tar=$DIR/tmp/load.tar
	for i in "${!NODES[@]}"; do
		containerd_up "$i" || die "the containerd of ${NODES[$i]} is not running (cluster.sh up first)"
	done
	mkdir -p "$DIR/tmp"
	for img in "$@"; do
		docker save "$img" -o "$tar" || { rm -f "$tar"; die "docker save $img failed"; }
		for i in "${!NODES[@]}"; do
			"$CTR" -a "$(node_sock "$i")" -n k8s.io images import "$tar" >/dev/null ||
				die "importing $img into ${NODES[$i]} failed"
		done
		rm -f "$tar"
		echo "loaded $img into ${NODES[*]}"
	done
}

node_index() { # index of node name $1
	local i
	for i in "${!NODES[@]}"; do
		if [[ ${NODES[$i]} == "$1" ]]; then echo "$i"; return 0; fi
	done
	die "no node named '$1' (nodes: ${NODES[*]})"
}

# cut NODE / heal NODE: take the node's link to the bridge down / up again,
# as a node lost to the network (its kubelet cannot reach the apiserver, nor
# the apiserver it; its containers keep running).
cmd_link() {
	local state=$1 node=${2:-}
	[[ -n $node ]] || usage
	local i
	i=$(node_index "$node")
	ip link show "$(node_veth "$i")" >/dev/null 2>&1 || die "the cluster is not up"
	ip link set "$(node_veth "$i")" "$state"
	if [[ $state == down ]]; then
		echo "cut $node off the network ($(node_veth "$i") down)"
	else
		echo "healed $node ($(node_veth "$i") up)"
	fi
}

cmd_env() {
	echo "export KUBECONFIG=$DIR/admin.kubeconfig"
}

usage() {
	echo "usage: $0 up|down|status|load IMAGE...|env|cut NODE|heal NODE" >&2
	exit 2
}

# One cluster command at a time (tests may call `up` while a developer runs
# `down`). The lock is fd 9 on a file in the cache; start_daemon closes fd 9 so
# the daemons do not hold it.
lock() {
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.lock"
	flock 9
}

main() {
	(($# > 0)) || usage
	local cmd=$1; shift
	case $cmd in
	up) lock; cmd_up ;;
	down) lock; cmd_down ;;
	status) cmd_status ;;
	load) lock; cmd_load "$@" ;;
	cut) lock; cmd_link down "$@" ;;
	heal) lock; cmd_link up "$@" ;;
	env) cmd_env ;;
	*) usage ;;
	esac
}

main "$@"
