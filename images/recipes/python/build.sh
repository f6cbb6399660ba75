#!/usr/bin/env bash
# Builds a Python sandbox image: a minimal Debian bookworm root file system
# made with mmdebstrap (no container registry is needed, only a Debian
# archive), holding the given Debian packages, imported into the local
# Docker engine as TAG, with the label LABEL=VALUE if given.
#
# Where packages come from, first that applies:
#   $DEBIAN_MIRROR  given to mmdebstrap as its MIRROR: a URI (bookworm main
#                   only), a one-line "deb URI SUITE COMPONENTS" entry, or
#                   the path of an apt sources file (either format)
#   the host's apt sources, on a Debian host: the archive and the security
#                   archive apt has for the host's release (apt-get
#                   indextargets), used for bookworm, bookworm-updates and
#                   bookworm-security, so a host behind a mirror of its own
#                   builds through that mirror
#   mmdebstrap's default (deb.debian.org with updates and security)
#
# Usage: build.sh TAG PACKAGES [LABEL=VALUE]
#        (needs mmdebstrap and a reachable engine; as root, or as a user
#        with subordinate ids in /etc/subuid and /etc/subgid and newuidmap
#        from the uidmap package: mmdebstrap then builds in a user
#        namespace, with no privilege on the host)
#
# The images package runs this script (its recipes python and python-slim
# differ in PACKAGES) and names TAG after a hash of this file and the
# packages, so any edit here makes the next Ensure rebuild the image.
set -euo pipefail

if [[ $# -lt 2 || -z "$1" || -z "$2" ]]; then
	echo "usage: $0 TAG PACKAGES [LABEL=VALUE]" >&2
	exit 2
fi
TAG=$1
PACKAGES=$2
LABEL=${3:-}
SUITE=bookworm

if ! command -v mmdebstrap >/dev/null 2>&1; then
	echo "mmdebstrap is not installed: apt-get install mmdebstrap uidmap" >&2
	exit 1
fi
MODE=root
if [[ $(id -u) != 0 ]]; then
	MODE=unshare
	user=$(id -un)
	for f in /etc/subuid /etc/subgid; do
		if ! grep -qE "^($user|$(id -u)):" "$f" 2>/dev/null; then
			echo "building as $user (not root) needs subordinate ids for $user in $f:" \
				"as root, usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $user" >&2
			exit 1
		fi
	done
	if ! command -v newuidmap >/dev/null 2>&1; then
		echo "building as $user (not root) needs newuidmap: apt-get install uidmap" >&2
		exit 1
	fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentsandbox-python.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Turn SIGTERM/SIGINT (a cancelled build) into an ordinary exit so that the
# EXIT trap runs.
trap 'exit 143' TERM
trap 'exit 130' INT

step() { echo "==> images: $* ($(date +%T))"; }

# host_sources writes apt sources for $SUITE to the file $1, made of the
# Debian archives the host's apt is configured with for its own release,
# and fails when the host is not Debian or has none.
host_sources() {
	local id='' codename=''
	read -r id codename < <(. /etc/os-release 2>/dev/null && echo "${ID:-}" "${VERSION_CODENAME:-}")
	[[ $id == debian && -n $codename ]] && command -v apt-get >/dev/null 2>&1 || return 1
	# Every source of the host's, in apt's order, whether or not apt-get
	# update has run; the first of each kind is taken.
	local type uri release component archive='' security=''
	while read -r type uri release component; do
		[[ $type == deb && $component == main ]] || continue
		case $release in
		"$codename" | stable) archive=${archive:-$uri} ;;
		"$codename-security" | stable-security | "$codename/updates") security=${security:-$uri} ;;
		esac
	done < <(apt-get indextargets --no-release-info --format '$(TARGET_OF) $(REPO_URI) $(RELEASE) $(COMPONENT)' 'Identifier: Packages' 2>/dev/null)
	[[ -n $archive ]] || return 1
	{
		echo "deb $archive $SUITE main"
		echo "deb $archive $SUITE-updates main"
		if [[ -n $security ]]; then echo "deb $security $SUITE-security main"; fi
	} >"$1"
}

MIRRORS=()
if [[ -n ${DEBIAN_MIRROR:-} ]]; then
	MIRRORS=("$DEBIAN_MIRROR")
	FROM="DEBIAN_MIRROR ($DEBIAN_MIRROR)"
elif host_sources "$WORK/sources.list"; then
	MIRRORS=("$WORK/sources.list")
	FROM="the host's apt sources ($(awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $3}' "$WORK/sources.list"))"
else
	FROM="mmdebstrap's default archives (this host's apt sources name no Debian archive; set DEBIAN_MIRROR for another)"
fi
step "mmdebstrap ($MODE mode): downloading and unpacking Debian $SUITE with $PACKAGES from $FROM (each package is named as it comes)"
# As debootstrap does: no recommended packages, and /usr merged by a hook
# (usr-is-merged) rather than the usrmerge package, which pulls in perl.
# In the hooks, "$1" is the new root file system. The same unprivileged
# user as the busybox image: sandbox, uid and gid 1000, home /workspace (so
# HOME is set when code runs as 1000:1000). Then shrink: package caches
# and lists, documentation, logs. (/dev holds what mmdebstrap puts there;
# the engine mounts its own /dev over it in every container.)
set +e
mmdebstrap --mode="$MODE" --variant=minbase --include="$PACKAGES" --verbose \
	--aptopt='APT::Install-Recommends "false"' --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
	--customize-hook='chroot "$1" groupadd -g 1000 sandbox' \
	--customize-hook='chroot "$1" useradd -u 1000 -g 1000 -d /workspace -M -s /bin/sh sandbox' \
	--customize-hook='install -d -m 0755 -o 1000 -g 1000 "$1/workspace"' \
	--customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/cache/debconf/*-old "$1"/var/log/* "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/usr/share/locale/*' \
	"$SUITE" "$WORK/rootfs.tar" ${MIRRORS[@]+"${MIRRORS[@]}"} 2>&1 |
	tee "$WORK/mmdebstrap.log" | grep --line-buffered -E '^(I:|E:|W:|Get:|Err:)'
status=${PIPESTATUS[0]}
set -e
if [[ $status != 0 || ! -s "$WORK/rootfs.tar" ]]; then
	echo "mmdebstrap failed (exit $status); the end of its output:" >&2
	tail -n 40 "$WORK/mmdebstrap.log" >&2
	exit 1
fi

step "importing $(du -h --apparent-size "$WORK/rootfs.tar" | cut -f1) into the engine as $TAG"
changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
	--change 'ENV LANG=C.UTF-8' --change 'ENV MPLBACKEND=Agg')
if [[ -n "$LABEL" ]]; then changes+=(--change "LABEL $LABEL"); fi
docker import "${changes[@]}" - "$TAG" <"$WORK/rootfs.tar"
