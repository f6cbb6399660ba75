#!/usr/bin/env bash
# Builds a Python sandbox image: a minimal Debian bookworm root file system
# made with debootstrap (no container registry is needed, only the Debian
# mirror, or $DEBIAN_MIRROR), holding the given Debian packages, imported
# into the local Docker engine as TAG, with the label LABEL=VALUE if given.
#
# Usage: build.sh TAG PACKAGES [LABEL=VALUE]
#        (as root; needs debootstrap and a reachable engine)
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
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
	echo "debootstrap is not installed: apt-get install debootstrap" >&2
	exit 1
fi

ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/agentsandbox-python-rootfs.XXXXXX")

# cleanup removes the root file system, first unmounting anything debootstrap
# may have left mounted inside it (proc, sys) if it was interrupted, so that
# rm never descends into a host pseudo file system.
cleanup() {
	local m
	if [[ -d "$ROOTFS" ]]; then
		# Deepest mount points first.
		while read -r m; do
			umount -l "$m" 2>/dev/null || true
		done < <(awk -v root="$ROOTFS/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r)
		rm -rf --one-file-system "$ROOTFS"
	fi
}
trap cleanup EXIT
# Turn SIGTERM/SIGINT (a cancelled build) into an ordinary exit so that the
# EXIT trap runs.
trap 'exit 143' TERM
trap 'exit 130' INT

step() { echo "==> images: $* ($(date +%T))"; }
step "debootstrap: downloading and unpacking Debian $SUITE with $PACKAGES from $MIRROR (each package is named as it comes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

step "adding the sandbox user (uid 1000, home /workspace)"
# The same unprivileged user as the busybox image: sandbox, uid and gid 1000,
# home /workspace (so HOME is set when code runs as 1000:1000).
chroot "$ROOTFS" groupadd -g 1000 sandbox
chroot "$ROOTFS" useradd -u 1000 -g 1000 -d /workspace -M -s /bin/sh sandbox
install -d -m 0755 -o 1000 -g 1000 "$ROOTFS/workspace"

step "removing package caches, documentation and logs"
# Shrink: package caches and lists, documentation, logs, and device nodes
# (the engine mounts its own /dev in every container).
rm -rf \
	"$ROOTFS"/var/cache/apt/* \
	"$ROOTFS"/var/lib/apt/lists/* \
	"$ROOTFS"/var/cache/debconf/*-old \
	"$ROOTFS"/var/log/* \
	"$ROOTFS"/usr/share/doc/* \
	"$ROOTFS"/usr/share/man/* \
	"$ROOTFS"/usr/share/info/* \
	"$ROOTFS"/usr/share/locale/* \
	"$ROOTFS"/dev/*

step "importing $(du -sh --apparent-size "$ROOTFS" | cut -f1) into the engine as $TAG"
changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
	--change 'ENV LANG=C.UTF-8' --change 'ENV MPLBACKEND=Agg')
if [[ -n "$LABEL" ]]; then changes+=(--change "LABEL $LABEL"); fi
tar -C "$ROOTFS" --numeric-owner -c . | docker import "${changes[@]}" - "$TAG"
