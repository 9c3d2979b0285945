#!/usr/bin/env bash
# Install what the pure cgroup v2 test bed (tests/vm/build.sh, run.sh)
# needs on a Debian host: debootstrap, e2fsprogs, qemu-system-x86 (from
# bookworm-backports where the host's qemu-utils comes from there). Idempotent.
set -euo pipefail
need=()
for pkg in debootstrap e2fsprogs qemu-system-x86 python3; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
[ "${#need[@]}" -eq 0 ] && exit 0
[ "$(id -u)" -eq 0 ] || { echo "setup-vm: missing ${need[*]}; run as root" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
  apt-get install -y -qq --no-install-recommends -t bookworm-backports "${need[@]}" >/dev/null
