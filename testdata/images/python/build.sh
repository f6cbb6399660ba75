#!/usr/bin/env bash
# Builds the "python" test image: a minimal Debian bookworm root file system
# made with debootstrap (no container registry is needed, only the Debian
# mirror), holding python3 with numpy, pandas and matplotlib, imported into
# the local Docker engine as the tag given as $1.
#
# Usage: build.sh TAG      (as root; needs debootstrap and a reachable engine)
#
# internal/testimage runs this script and names TAG after a hash of this
# directory, so any edit here makes the next test run rebuild the image.
set -euo pipefail

if [[ $# -ne 1 || -z "$1" ]]; then
	echo "usage: $0 TAG" >&2
	exit 2
fi
TAG=$1
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
PACKAGES=python3,python3-numpy,python3-pandas,python3-matplotlib,procps,ca-certificates

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

debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

# The same unprivileged user as the busybox image: sandbox, uid and gid 1000,
# home /workspace (so HOME is set when code runs as 1000:1000).
chroot "$ROOTFS" groupadd -g 1000 sandbox
chroot "$ROOTFS" useradd -u 1000 -g 1000 -d /workspace -M -s /bin/sh sandbox
install -d -m 0755 -o 1000 -g 1000 "$ROOTFS/workspace"

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

tar -C "$ROOTFS" --numeric-owner -c . | docker import \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV LANG=C.UTF-8' \
	--change 'ENV MPLBACKEND=Agg' \
	--change 'LABEL dev.agentsandbox.testimage=python' \
	- "$TAG"
