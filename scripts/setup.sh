#!/usr/bin/env bash
# Install what cordon's example tools, tests and benchmarks need on a fresh
# Debian machine with only the Rust toolchain. Idempotent.
set -euo pipefail
need=()
for pkg in poppler-utils imagemagick bubblewrap curl iproute2 nftables util-linux procps python3 file; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages ${need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
