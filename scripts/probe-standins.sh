#!/usr/bin/env bash
# Run a command inside a fresh network namespace in which the addresses the
# probes aim at (1.1.1.1, 169.254.169.254, 10.0.0.1) are bound on loopback,
# so that even a sandbox that leaks reaches a stand-in, never a real host.
# Usage: scripts/probe-standins.sh CMD [ARGS...]   (root)
set -euo pipefail
exec unshare --net -- sh -c '
  ip link set lo up
  for a in 1.1.1.1/32 169.254.169.254/32 10.0.0.1/32; do ip addr add "$a" dev lo; done
  exec "$@"' sh "$@"
