#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests (each jail test
# runs as root and again as uid 65534), then the conformance probes on the
# bundled example manifest, aimed at stand-ins in a private network namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --all-targets
cargo test --workspace
echo "== cordon probe -m examples/cordon.yaml"
scripts/probe-standins.sh target/debug/cordon probe -m examples/cordon.yaml --junit target/probe-junit.xml
