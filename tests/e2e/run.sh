#!/bin/sh
# End-to-end checks of `cordon serve` with third-party MCP clients and servers.
#
#   tests/e2e/run.sh            # build cordon, install what is missing, run
#
# - Python: the official `mcp` SDK client (pip install mcp), over stdio and HTTP.
# - Servers, each run inside its sandbox: @modelcontextprotocol/server-everything
#   and server-filesystem (npm, installed into $CORDON_E2E_NPM, default
#   /var/cache/cordon-e2e/npm) and mcp-server-fetch (PyPI, pip --target
#   $CORDON_E2E_PY, default /var/cache/cordon-e2e/py) with no network. The
#   install directories are mounted read-only into the sandboxes.
# - MCP Inspector CLI (npx @modelcontextprotocol/inspector --cli), when npx can fetch it.
# A part whose prerequisites cannot be installed is skipped with the reason.
set -u
cd "$(dirname "$0")/../.."
NPM_DIR=${CORDON_E2E_NPM:-/var/cache/cordon-e2e/npm}
CORDON=${CORDON_BIN:-target/debug/cordon}
status=0

cargo build -q -p cordon || exit 1

if ! python3 -c 'import mcp' 2>/dev/null; then
    pip install -q mcp >/dev/null 2>&1 || echo "SKIP python: pip install mcp failed"
fi

npm_args=""
if command -v npm >/dev/null 2>&1; then
    if [ ! -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ] ||
       [ ! -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" ]; then
        mkdir -p "$NPM_DIR" && (cd "$NPM_DIR" && npm install --no-audit --no-fund \
            @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem >/dev/null 2>&1) ||
            echo "SKIP third-party servers: npm install failed"
    fi
    [ -f "$NPM_DIR/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ] &&
        chmod -R a+rX "$NPM_DIR" && npm_args="--npm-dir $NPM_DIR"
else
    echo "SKIP third-party servers: npm not found"
fi

# mcp-server-fetch (PyPI) for the system python3 that runs inside the sandbox.
PY_DIR=${CORDON_E2E_PY:-/var/cache/cordon-e2e/py}
if [ -n "$npm_args" ]; then
    if [ ! -d "$PY_DIR/mcp_server_fetch" ]; then
        /usr/bin/python3 -m pip install -q --target "$PY_DIR" mcp-server-fetch >/dev/null 2>&1 ||
            pip install -q --target "$PY_DIR" mcp-server-fetch >/dev/null 2>&1 ||
            echo "SKIP mcp-server-fetch: pip install failed"
    fi
    [ -d "$PY_DIR/mcp_server_fetch" ] && chmod -R a+rX "$PY_DIR" && npm_args="$npm_args --py-dir $PY_DIR"
fi

if python3 -c 'import mcp' 2>/dev/null; then
    for t in "" "--http"; do
        python3 tests/e2e/mcp_python_client.py --cordon "$CORDON" $t $npm_args || status=1
    done
else
    echo "SKIP python client: the mcp package is not importable"
fi

if command -v npx >/dev/null 2>&1; then
    out=$(timeout 180 npx -y @modelcontextprotocol/inspector --cli "$CORDON" serve -m examples/cordon.yaml \
        --method tools/call --tool-name word_count --tool-arg 'text=one two three' 2>&1)
    case "$out" in
        *untrusted-output*) echo "PASS inspector: tools/call word_count" ;;
        *) if echo "$out" | grep -q -i "npm ERR\|ENOTFOUND\|EAI_AGAIN"; then
               echo "SKIP inspector: npx could not fetch it"
           else
               echo "FAIL inspector: $out"; status=1
           fi ;;
    esac
else
    echo "SKIP inspector: npx not found"
fi
exit $status
