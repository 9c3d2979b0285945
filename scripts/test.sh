#!/usr/bin/env bash
# Every test: formatting, lints, unit and integration tests (each jail test
# runs as root and again as uid 65534), the MCP conformance suite against
# cordon in front of its reference server, then the conformance probes on
# the bundled example manifest, aimed at stand-ins in a private network
# namespace.
#
# A test that cannot run here fails. Only with CORDON_TEST_ALLOW_SKIP=1 in
# the environment (never set here, nor in CI) do such tests skip instead;
# the skips are then listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
skip_log=${CORDON_TEST_SKIP_LOG:-target/test-skips.log}
case $skip_log in /*) ;; *) skip_log=$PWD/$skip_log ;; esac
export CORDON_TEST_SKIP_LOG=$skip_log
rm -f "$skip_log"
list_skips() {
  if [ -s "$skip_log" ]; then
    echo "== skipped tests"
    cat "$skip_log"
  fi
}
trap list_skips EXIT
# A build for one run: incremental compilation's caches (about 5 GB for this
# workspace) would never be read again.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# The build, the test images and the guests' disks take about 20 GB: a disk
# that fills up half way fails with errors that do not say so.
target_fs=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_fs"
free_kb=$(df -Pk "$target_fs" | awk 'NR == 2 { print $4 }')
if [ "${free_kb:-0}" -lt $((20 * 1024 * 1024)) ]; then
  echo "== warning: $((free_kb / 1024 / 1024)) GB free where $target_fs is; a whole run needs about 20 GB" >&2
fi
# Each phase says how long it took.
phase() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  echo "== $name: done in $((SECONDS - t0)) s"
}
phase "setup (scripts/setup.sh)" scripts/setup.sh
phase "cargo fmt --check" cargo fmt --all -- --check
phase "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings
phase "cargo build" cargo build --workspace --all-targets
# Every test binary of the workspace and the doc tests, two binaries at a
# time (scripts/run-tests.py; `cargo test --workspace` runs the same tests
# one binary after another).
phase "cargo test, two binaries at a time" scripts/run-tests.py
phase "fuzz targets, a short run of each (fuzz/run.sh, docs/fuzzing.md)" fuzz/run.sh 5
# The cordon the test binaries were built with (Cargo's target directory,
# `CARGO_TARGET_DIR` when set).
export CORDON_BIN=${CARGO_TARGET_DIR:-target}/debug/cordon
phase "MCP conformance suite, cordon in front of its reference server" \
  tests/e2e/conformance.sh --reference target/conformance
phase "cordon probe -m examples/cordon.yaml" \
  scripts/probe-standins.sh "$CORDON_BIN" probe -m examples/cordon.yaml --junit target/probe-junit.xml
