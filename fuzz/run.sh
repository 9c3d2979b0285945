#!/usr/bin/env bash
# Fuzz the output gate for N seconds (default 30) on the stable toolchain.
#   fuzz/run.sh [SECONDS]
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Sanitizers need nightly, so this runs
# with `--sanitizer none`; a crash still stops the run and leaves its input in
# fuzz/artifacts/gate/.
set -euo pipefail
secs="${1:-30}"
cd "$(dirname "$0")"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 2
fi
mkdir -p corpus/gate
cargo fuzz run gate --sanitizer none -- -max_total_time="$secs"
