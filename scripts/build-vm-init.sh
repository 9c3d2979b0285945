#!/usr/bin/env bash
# Builds cordon-vm-init, the microVM guest's PID 1, as a static executable
# and prints its path.
#
# Static on the gnu target needs `-C target-feature=+crt-static`. Set in
# .cargo/config.toml under [target.x86_64-unknown-linux-gnu] it would apply
# to every crate of the workspace (and to build scripts, when host and
# target are the same), so it is passed here, with an explicit --target:
# then RUSTFLAGS reach only the target's crates, and their artifacts go to
# their own directory ($CARGO_TARGET_DIR/x86_64-unknown-linux-gnu), never
# invalidating the ordinary dynamic build.
#
# Debug info is stripped: the binary goes into every guest's initramfs,
# which the kernel unpacks at each cold boot.
#
# Usage: scripts/build-vm-init.sh [PROFILE]   (default: release)
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
target=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static -C strip=debuginfo" "${CARGO:-cargo}" build -q -p cordon-vm-init \
  --bin cordon-vm-init --target "$target" --profile "$profile" >&2
dir=${CARGO_TARGET_DIR:-$PWD/target}
[ "$profile" = dev ] && sub=debug || sub=$profile
bin=$dir/$target/$sub/cordon-vm-init
if ! file "$bin" | grep -q 'statically linked\|static-pie linked'; then
  echo "build-vm-init: $bin is not statically linked" >&2
  exit 1
fi
echo "$bin"
