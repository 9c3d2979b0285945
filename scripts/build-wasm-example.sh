#!/usr/bin/env bash
# Build the example parser examples/wasm/json-check.c for wasm32-wasi
# (target/wasm/json-check.wasm, the module of examples/wasm.yaml) and
# natively (target/wasm/json-check, the benchmark's native P1 comparison),
# and cordon's probe module crates/probes/wasm/probe.c
# (target/wasm/cordon-probe.wasm, run by `cordon probe` against wasm tools).
# Needs clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32
# (scripts/setup.sh installs them). Prints the module's sha256.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/wasm
mkdir -p "$out"
src=$root/examples/wasm/json-check.c
clang-14 --target=wasm32-wasi --sysroot=/usr -O2 -o "$out/json-check.wasm" "$src"
cc -O2 -o "$out/json-check" "$src"
clang-14 --target=wasm32-wasi --sysroot=/usr -O2 -o "$out/cordon-probe.wasm" \
    "$root/crates/probes/wasm/probe.c"
chmod a+rX "$root/target" "$out" "$out/json-check.wasm" "$out/json-check" "$out/cordon-probe.wasm"
sha256sum "$out/json-check.wasm"
