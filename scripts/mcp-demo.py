#!/usr/bin/env python3
"""What an agent sees through cordon: start `cordon serve -m examples/cordon.yaml`
over stdio, list the tools, call word_count (a P1 command tool, a fresh jail
per call) and the third-party MCP server `scratch` (server-filesystem in its
P2 sandbox for this session), and print the results.

    scripts/mcp-demo.py [--cordon PATH] [--text TEXT]
    scripts/mcp-demo.py --manifest M --providers FILE --jql QUERY

With a manifest that serves `jira_search` (examples/jira.yaml, as
scripts/demo.sh writes it), calls `jira_search__search` with the JQL query
instead: a session of the image's MCP server, its token minted by the
provider file's provider and substituted at the egress door.

Speaks newline-delimited JSON-RPC on cordon's stdin/stdout (standard library
only, no MCP SDK needed). An MCP client configuration would say:

    {"command": "cordon", "args": ["serve", "-m", "examples/cordon.yaml"]}
"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def find_cordon(given):
    if given:
        return given
    for c in (REPO / "target/release/cordon", REPO / "target/debug/cordon"):
        if c.is_file():
            return str(c)
    found = shutil.which("cordon")
    if found:
        return found
    sys.exit("cordon not found: build it with `cargo build -p cordon` or pass --cordon PATH")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cordon")
    ap.add_argument("--text", default="The quick brown fox\njumps over the lazy dog.\n")
    ap.add_argument("--manifest", default=str(REPO / "examples/cordon.yaml"))
    ap.add_argument("--providers", help="the provider file (cordon serve --providers)")
    ap.add_argument("--jql", default="project = OPS ORDER BY created DESC")
    ap.add_argument("--verbose", action="store_true", help="show cordon's stderr")
    a = ap.parse_args()
    argv = [find_cordon(a.cordon), "serve", "-m", a.manifest]
    if a.providers:
        argv += ["--providers", a.providers]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=None if a.verbose else subprocess.DEVNULL, text=True)
    next_id = iter(range(1, 1000))

    def request(method, params=None):
        msg = {"jsonrpc": "2.0", "id": next(next_id), "method": method}
        if params is not None:
            msg["params"] = params
        proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        while True:
            line = proc.stdout.readline()
            if not line:
                sys.exit("cordon serve exited")
            reply = json.loads(line)
            if reply.get("id") == msg["id"]:
                return reply

    init = request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "mcp-demo", "version": "1"}})
    info = init["result"]["serverInfo"]
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
    proc.stdin.flush()
    print(f"connected to {info['name']} {info['version']}\n")

    tools = request("tools/list")["result"]["tools"]
    print("tools/list:")
    for t in tools:
        print(f"  {t['name']:<34} [{t.get('_meta', {}).get('cordon/profile', '?')}] {t.get('description', '')}")

    def call(name, arguments):
        print(f"\ntools/call {name} {json.dumps(arguments)}:")
        reply = request("tools/call", {"name": name, "arguments": arguments})
        if "error" in reply:
            print(f"  error {reply['error']['code']}: {reply['error']['message']}")
            return False
        r = reply["result"]
        for c in r["content"]:
            if c["type"] == "text":
                print("  " + c["text"].replace("\n", "\n  "))
        meta = r.get("_meta", {})
        print(f"  _meta: trust={meta.get('cordon/trust')} profile={meta.get('cordon/profile')} "
              f"bytes_out={meta.get('cordon/bytes_out')} truncated={meta.get('cordon/truncated')}"
              f" isError={r.get('isError')}")
        return not r.get("isError")

    names = {t["name"] for t in tools}
    if "jira_search__search" in names:
        # The image's server says which JIRA_TOKEN it held: the placeholder.
        ok = call("jira_search__search", {"jql": a.jql})
    else:
        ok = call("word_count", {"text": a.text})
        if "scratch__write_file" in names:
            ok &= call("scratch__write_file", {"path": "/tmp/note.txt", "content": "kept for this session only\n"})
            ok &= call("scratch__read_text_file", {"path": "/tmp/note.txt"})
            # The server refuses paths outside /tmp itself; were it taken over,
            # its sandbox has no host /etc to read (cordon probe shows that).
            call("scratch__read_text_file", {"path": "/etc/shadow"})
        else:
            print("\n(scratch: server-filesystem is not installed; run scripts/setup.sh)")
    proc.stdin.close()
    proc.wait(10)
    if not ok:
        sys.exit("a call failed")


if __name__ == "__main__":
    main()
