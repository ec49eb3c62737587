#!/usr/bin/env bash
# Build the scratchbank image (Dockerfile) without a registry: the base image is a
# debootstrapped Debian bookworm minbase with Python, imported with `docker import`, and
# the project's wheels are built on the host (pip's cache), then installed offline.
#
#   scripts/image.sh [TAG]        # default scratchbank:dev; prints the seconds each step took
#
# Caches (CI keeps /var/cache/scratchbank between steps of one run): the base rootfs tar
# (about 2 minutes to make, once) and the wheelhouse.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-scratchbank:dev}
BASE=${SB_IMAGE_BASE:-scratchbank-python:bookworm}
SB_CACHE=${SB_CACHE:-/var/cache/scratchbank}
PY=${SCRATCHBANK_VENV:-.venv}/bin/python
mkdir -p "$SB_CACHE"
t0=$(date +%s)

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    if [ ! -s "$SB_CACHE/python-rootfs.tar" ] && [ -s "$SB_CACHE/gnu-rootfs.tar" ] \
        && tar -tf "$SB_CACHE/gnu-rootfs.tar" ./usr/bin/python3 >/dev/null 2>&1; then
        # the GNU test image's rootfs (scripts/services.sh) has Python: one debootstrap for both
        ln -f "$SB_CACHE/gnu-rootfs.tar" "$SB_CACHE/python-rootfs.tar"
    fi
    if [ ! -s "$SB_CACHE/python-rootfs.tar" ]; then
        command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
        dir=$(mktemp -d)
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$dir" \
            >"$SB_CACHE/python-debootstrap.log" 2>&1
        rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        tar -C "$dir" -c . >"$SB_CACHE/python-rootfs.tar.part"
        mv "$SB_CACHE/python-rootfs.tar.part" "$SB_CACHE/python-rootfs.tar"
        rm -rf "$dir"
    fi
    docker import "$SB_CACHE/python-rootfs.tar" "$BASE" >/dev/null
fi
t1=$(date +%s)

rm -rf build/wheelhouse && mkdir -p build/wheelhouse
"$PY" -m pip wheel -q --wheel-dir build/wheelhouse ".[all]" "psycopg[binary]" 2>&1 | grep -v "^WARNING: Location" || true
t2=$(date +%s)

DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$BASE" -t "$TAG" . >/dev/null
t3=$(date +%s)
echo "image $TAG: base $((t1 - t0)) s, wheels $((t2 - t1)) s, docker build $((t3 - t2)) s" >&2
