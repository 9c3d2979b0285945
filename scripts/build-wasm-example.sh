#!/usr/bin/env bash
# Build the example parser examples/wasm/json-check.c for wasm32-wasi
# (target/wasm/json-check.wasm, the module of examples/wasm.yaml) and
# natively (target/wasm/json-check, the benchmark's native P1 comparison),
# and cordon's probe module crates/probes/wasm/probe.c
# (target/wasm/cordon-probe.wasm, run by `cordon probe` against wasm tools).
# Then the same parser as two WebAssembly components (examples/wasm.yaml):
# target/wasm/json-check.component.wasm, the module as a WASI 0.2 command,
# target/wasm/json-tools.wasm, examples/wasm/json-tools.c exporting the
# typed functions of examples/wasm/json-tools.wit, and the probe module as a
# command component (target/wasm/cordon-probe.component.wasm, which probes
# component tools); cordon-wasm-componentize
# (crates/wasm-componentize, built here) makes both.
# Needs clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32
# (scripts/setup.sh installs them). Prints the modules' sha256.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/wasm
mkdir -p "$out"
src=$root/examples/wasm/json-check.c
clang-14 --target=wasm32-wasi --sysroot=/usr -O2 -o "$out/json-check.wasm" "$src"
cc -O2 -o "$out/json-check" "$src"
clang-14 --target=wasm32-wasi --sysroot=/usr -O2 -o "$out/cordon-probe.wasm" \
    "$root/crates/probes/wasm/probe.c"
clang-14 --target=wasm32-wasi --sysroot=/usr -O2 -mexec-model=reactor \
    -o "$out/json-tools.core.wasm" "$root/examples/wasm/json-tools.c"
(cd "$root" && cargo build -q -p cordon-wasm-componentize)
# Cargo's target directory (`CARGO_TARGET_DIR`, relative to the checkout
# when it is relative); the modules themselves stay in the checkout's
# target/wasm, where examples/wasm.yaml names them.
cargo_target=${CARGO_TARGET_DIR:-target}
case $cargo_target in /*) ;; *) cargo_target=$root/$cargo_target ;; esac
componentize=$cargo_target/debug/cordon-wasm-componentize
"$componentize" command "$out/json-check.wasm" "$out/json-check.component.wasm"
"$componentize" command "$out/cordon-probe.wasm" "$out/cordon-probe.component.wasm"
"$componentize" exports "$out/json-tools.core.wasm" "$root/examples/wasm/json-tools.wit" \
    json-tools "$out/json-tools.wasm"
chmod a+rX "$root/target" "$out" "$out/json-check.wasm" "$out/json-check" "$out/cordon-probe.wasm" \
    "$out/json-check.component.wasm" "$out/json-tools.wasm" "$out/cordon-probe.component.wasm"
sha256sum "$out/json-check.wasm" "$out/json-check.component.wasm" "$out/json-tools.wasm"
