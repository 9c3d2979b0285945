#!/usr/bin/env python3
"""runtime: wasm, same run (docs/wasm.md, docs/benchmarks.md):

1. a P1 call of the example parser compiled to wasm32-wasi (examples/wasm.yaml,
   its compiled code cached) against the same C source compiled natively,
   run in the native P1 jail with the same limits, through `cordon run` both:
   for trivial work (`[]`) and for a parse of 1 MiB of JSON;
2. the first call of the module: its compilation into the cache (the cache
   emptied before each round).

Run as root after scripts/setup.sh (which builds target/wasm): `cargo build
--release -p cordon -p cordon-wasm && python3 scripts/bench-wasm.py
[--rounds N]` (`CORDON_BIN` for another cordon, `CORDON_WASM` for another
runner). Nothing leaves the machine.
"""

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORDON = os.environ.get("CORDON_BIN", os.path.join(ROOT, "target/release/cordon"))
MODULE = os.path.join(ROOT, "target/wasm/json-check.wasm")
NATIVE = os.path.join(ROOT, "target/wasm/json-check")

MANIFEST = """version: 1
tools:
  wasm:
    profile: P1
    runtime: wasm
    module: {{path: {module}, sha256: {sha}}}
    limits: {{wall_seconds: 20, memory: 256M, output_bytes: 64K}}
    network: none
  native:
    profile: P1
    command: ["{native}"]
    mounts: ["{native}"]
    limits: {{wall_seconds: 20, memory: 256M, output_bytes: 64K}}
    network: none
"""


def document(size):
    """About `size` bytes of JSON: an array of small objects."""
    item = '{"id": 12345, "name": "caf\\u00e9 \\"x\\"", "tags": [true, false, null], "v": -1.5e3}'
    n = size // (len(item) + 1)
    return ("[" + ",".join([item] * n) + "]").encode()


def call(env, manifest, tool, stdin):
    t0 = time.perf_counter()
    p = subprocess.run([CORDON, "run", "-m", manifest, tool], input=stdin,
                       capture_output=True, env=env)
    dt = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0 or not p.stdout.startswith(b"ok:"):
        sys.exit(f"{tool} failed ({p.returncode}): {p.stdout[-200:]!r} {p.stderr.decode()[-400:]}")
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    for f in (CORDON, MODULE, NATIVE):
        if not os.path.exists(f):
            sys.exit(f"{f} missing: build cordon and run scripts/setup.sh")
    sha = hashlib.sha256(open(MODULE, "rb").read()).hexdigest()
    tmp = tempfile.mkdtemp(prefix="cordon-bench-wasm-")
    os.chmod(tmp, 0o755)
    try:
        manifest = os.path.join(tmp, "bench.yaml")
        with open(manifest, "w") as f:
            f.write(MANIFEST.format(module=MODULE, sha=sha, native=NATIVE))
        state = os.path.join(tmp, "state")
        env = dict(os.environ, CORDON_STATE_DIR=state, CORDON_AUDIT="/dev/null")
        cache = os.path.join(state, "wasm-cache")
        out = {}
        # First calls: compile into an empty cache each round.
        first = []
        for _ in range(max(3, a.rounds // 4)):
            shutil.rmtree(cache, ignore_errors=True)
            first.append(call(env, manifest, "wasm", b"[]"))
        out["first call (compile + run), ms"] = statistics.median(first)
        for label, doc in (("trivial", b"[]"), ("1 MiB", document(1 << 20))):
            w, n = [], []
            call(env, manifest, "wasm", doc)  # cached from here on
            for _ in range(a.rounds):
                w.append(call(env, manifest, "wasm", doc))
                n.append(call(env, manifest, "native", doc))
            mw, mn = statistics.median(w), statistics.median(n)
            out[f"{label}: wasm (cached), ms"] = mw
            out[f"{label}: native P1, ms"] = mn
            out[f"{label}: ratio"] = mw / mn
        out["module bytes"] = os.path.getsize(MODULE)
        out["compiled bytes"] = sum(
            os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache) if f.endswith(".cwasm"))
        out["load average"] = os.getloadavg()[0]
        for k, v in out.items():
            print(f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: {v}")
        print(json.dumps(out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
