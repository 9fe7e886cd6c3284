#!/usr/bin/env bash
# Install the Debian packages tilewise needs, only those missing. Root or sudo required for a missing one.
set -euo pipefail
PKGS=(
  python3 python3-venv g++ make
  hwloc numactl libnuma-dev likwid
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 libtbbmalloc2
  openjdk-17-jre-headless
  qemu-system-x86 linux-image-amd64 busybox-static   # multi-node QEMU guests for tests/vm
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-system: all Debian packages present"
  exit 0
fi
echo "setup-system: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "Error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
