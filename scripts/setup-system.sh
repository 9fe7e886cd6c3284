#!/usr/bin/env bash
# Install the Debian packages tilewise needs, only those missing. Root (or sudo without a password)
# is needed for a missing one; without it, the missing ones are listed with the command to run.
set -euo pipefail
# Groups: `core` (default) is what the main job needs (plan, launch, probes, allocators);
# `vm` is for the multi-node QEMU guest tests (make test). Engines bring their own Debian packages
# with `tilewise engines install NAME` (Spark: a Java runtime; PostgreSQL: the server and its user).
CORE=(
  python3 python3-venv g++ make
  hwloc numactl libnuma-dev likwid
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 libtbbmalloc2
)
VM=(qemu-system-x86 linux-image-amd64 busybox-static)   # multi-node QEMU guests for tests/vm
PKGS=()
for group in "${@:-core}"; do
  case "$group" in
    core) PKGS+=("${CORE[@]}") ;;
    vm) PKGS+=("${VM[@]}") ;;
    *) echo "Error: setup-system.sh: unknown group $group (core, vm)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-system: all Debian packages present (${*:-core})"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  # without root: sudo only when it works without a password prompt; otherwise the list, once
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO="sudo"
  else
    {
      echo "Error: ${#missing[@]} Debian package(s) are missing and installing them needs root: ${missing[*]}"
      echo "  an administrator runs: apt-get install --no-install-recommends ${missing[*]}"
      echo "  meanwhile \`make venv native\` sets up your own venv; qemu-system-x86, linux-image-amd64 and"
      echo "  busybox-static are only for the QEMU guest tests (tests/vm)"
    } >&2
    exit 1
  fi
fi
echo "setup-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
