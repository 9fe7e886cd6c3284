#!/usr/bin/env bash
# Install the Debian packages tilewise needs, only those missing. Root (or sudo without a password)
# is needed for a missing one; without it, the missing ones are listed with the command to run.
set -euo pipefail
PKGS=(
  python3 python3-venv g++ make
  hwloc numactl libnuma-dev likwid
  libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0 libtbbmalloc2
  openjdk-17-jre-headless
  qemu-system-x86 linux-image-amd64 busybox-static   # multi-node QEMU guests for tests/vm
  postgresql   # the PostgreSQL engine: the distribution's current major (15 on Debian 12)
)
# PostgreSQL refuses to run as root: as root, tilewise starts its servers as this system user
PG_USER=tilewise
ensure_pg_user() {
  [ "$(id -u)" -eq 0 ] || return 0   # as anyone else, the servers run as the calling user
  id -u "$PG_USER" >/dev/null 2>&1 && return 0
  echo "setup-system: creating the system user $PG_USER (tilewise runs its PostgreSQL servers as it)"
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_USER"
}
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-system: all Debian packages present"
  ensure_pg_user
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
      echo "  busybox-static are only for the QEMU guest tests (tests/vm), openjdk-17 only for Spark,"
      echo "  postgresql only for the PostgreSQL engine"
    } >&2
    exit 1
  fi
fi
echo "setup-system: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [[ " ${missing[*]} " == *" postgresql "* ]] && [ ! -d /etc/postgresql ]; then
  # tilewise starts its own servers: on a first install, no "main" cluster (Debian would create and
  # start one on port 5432); `pg_createcluster 15 main --start` makes one later if you want it
  $SUDO apt-get install -y -qq --no-install-recommends postgresql-common >/dev/null
  $SUDO pg_conftool /etc/postgresql-common/createcluster.conf set create_main_cluster off
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
ensure_pg_user
