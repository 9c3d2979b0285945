#!/usr/bin/env python3
"""One MCP call through `cordon serve` over stdio, with nothing but the
standard library (the test bed has no MCP SDK): initialize, then call TOOL
with the JSON arguments ARGS, and print the result as JSON on one line.

usage: mcp_call.py CORDON MANIFEST TOOL [ARGS]
Exit 0 when the call returned a result that is not an error.
"""
import json
import subprocess
import sys


def main():
    cordon, manifest, tool = sys.argv[1:4]
    args = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    p = subprocess.Popen(
        [cordon, "serve", "-m", manifest],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def send(msg):
        p.stdin.write(json.dumps(msg) + "\n")
        p.stdin.flush()

    def reply(want_id):
        for line in p.stdout:
            msg = json.loads(line)
            if msg.get("id") == want_id:
                return msg
        raise SystemExit("cordon serve closed its output")

    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "cordon-vm", "version": "1"}}})
    init = reply(1)
    if "result" not in init:
        raise SystemExit(f"initialize: {init}")
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": tool, "arguments": args}})
    r = reply(2)
    p.stdin.close()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
    print(json.dumps(r))
    ok = "result" in r and not r["result"].get("isError")
    sys.exit(0 if ok else 1)


main()
