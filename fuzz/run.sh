#!/usr/bin/env bash
# Fuzz every target for SECONDS each (default 30), or one target:
#   fuzz/run.sh [SECONDS]
#   fuzz/run.sh TARGET [SECONDS]
# Needs cargo-fuzz (`cargo install cargo-fuzz`; scripts/setup.sh installs it). Runs on the
# stable toolchain: sanitizers need nightly, so `--sanitizer none` (libFuzzer's coverage
# instrumentation is stable rustc flags). Builds the dev profile (debug assertions and
# overflow checks on, and much quicker to build); FUZZ_RELEASE=1 builds optimized targets
# for long runs. Each target starts from its committed seeds (fuzz/corpus/TARGET) and what
# earlier runs found (fuzz/target/corpus/TARGET, where new inputs go). A crash, a failed
# assertion or a hang (over 60 s for one input) stops the run with a non-zero status and
# leaves the input in fuzz/artifacts/TARGET/; replay it with
#   cargo fuzz run --dev --sanitizer none TARGET fuzz/artifacts/TARGET/crash-...
# See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")"
targets=(gate unpack dns proxy scan auth elf manifest)
if [ "$#" -ge 1 ] && ! [[ $1 =~ ^[0-9]+$ ]]; then
    targets=("$1")
    shift
fi
secs="${1:-30}"
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 2
fi
profile=(--dev)
if [ "${FUZZ_RELEASE:-}" = 1 ]; then
    profile=()
fi
cargo fuzz build "${profile[@]}" --sanitizer none
for t in "${targets[@]}"; do
    echo "== fuzz $t for ${secs}s"
    mkdir -p "target/corpus/$t" "corpus/$t"
    cargo fuzz run "${profile[@]}" --sanitizer none "$t" "target/corpus/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1
done
