#!/usr/bin/env python3
"""mcp-server-fetch with its own SSRF guard on, through cordon's doors.

    ssrf_guard.py --cordon target/debug/cordon --py-dir /var/cache/cordon-e2e/py

Run as root inside a fresh network namespace with 93.184.216.34 bound on its
loopback (crates/cli/tests/mcp_e2e.rs does it): that address stands in for a
public upstream, so nothing can leave this machine. `cordon serve` (the
broker) runs in that namespace; the server runs in its sandbox, resolves the
allowed name through the DNS door and refuses any address that is not public
before fetching. The DNS door answers the address the broker resolved (here
the `resolve:` pin), so the guard accepts it and the fetch reaches the
stand-in; a name pinned to a private address (allowed by `allow_cidrs`) is
still answered as that address, which the guard refuses; an unlisted name is
refused by the door. Prints one PASS/FAIL line per check; exits 1 if any
failed.
"""
import argparse
import asyncio
import http.server
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

PUBLIC = "93.184.216.34"
FAILED = []
SEEN = []


def check(name, cond, detail=""):
    if cond:
        print(f"PASS {name}")
    else:
        print(f"FAIL {name}: {detail}")
        FAILED.append(name)


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        SEEN.append((self.path, self.headers.get("Host", "")))
        body = b"<html><head><title>t</title></head><body><p>marker-ssrf-guard-ok</p></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon", required=True)
    ap.add_argument("--py-dir", required=True)
    a = ap.parse_args()
    srv = http.server.ThreadingHTTPServer((PUBLIC, 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        audit = Path(tmp) / "audit.jsonl"
        m = Path(tmp) / "guard.yaml"
        m.write_text(f"""version: 1
tools:
  guarded:
    profile: P2
    description: mcp-server-fetch with its own check of private addresses on.
    egress: ["api.test:{port}", "internal.test:{port}"]
    resolve: {{api.test: {PUBLIC}, internal.test: 10.0.0.1}}
    allow_cidrs: [10.0.0.1/32]
    limits: {{wall_seconds: 20, memory: 512M, tasks: 64}}
    mounts: ["{a.py_dir}:/srv/py"]
    env: {{PYTHONPATH: /srv/py}}
    mcp:
      command: ["/usr/bin/python3", "-m", "mcp_server_fetch", "--ignore-robots-txt"]
""")
        env = dict(os.environ, CORDON_AUDIT=str(audit))
        params = StdioServerParameters(command=a.cordon, args=["serve", "-m", str(m)], env=env)
        async with stdio_client(params) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                names = {t.name for t in (await s.list_tools()).tools}
                check("guarded.fetch listed", "guarded__fetch" in names, sorted(names))
                url = f"http://api.test:{port}/page"
                r = await s.call_tool("guarded__fetch", {"url": url, "raw": True})
                check("the guard accepts the DNS door's answer and the fetch arrives",
                      "marker-ssrf-guard-ok" in text_of(r), text_of(r))
                url = f"http://internal.test:{port}/page"
                r = await s.call_tool("guarded__fetch", {"url": url, "raw": True})
                check("the guard refuses a private answer (it is on)",
                      f"Refused to fetch {url}: internal.test resolves to 10.0.0.1, which is not a public address"
                      in text_of(r) and "marker-ssrf-guard-ok" not in text_of(r), text_of(r))
                url = f"http://evil.test:{port}/page"
                r = await s.call_tool("guarded__fetch", {"url": url, "raw": True})
                check("an unlisted host is refused by the door",
                      "status code 403" in text_of(r) and "marker-ssrf-guard-ok" not in text_of(r),
                      text_of(r))
        check("only the allowed fetch reached the upstream",
              SEEN == [("/page", f"api.test:{port}")], SEEN)
        events = [json.loads(l) for l in audit.read_text().splitlines() if l.strip()]
        flat = json.dumps(events)
        check("the DNS door answered the real address",
              f"A api.test -> {PUBLIC}; matches api.test:{port}" in flat, flat[-2000:])
        check("and the private pin as it is",
              f"A internal.test -> 10.0.0.1; matches internal.test:{port}" in flat, flat[-2000:])
    print(f"{'FAILED' if FAILED else 'OK'}: {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    asyncio.run(main())
