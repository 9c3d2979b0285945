#!/usr/bin/env python3
"""Whole agent conversations with a browser MCP server through `cordon serve --http`.

    browser_conversation.py --cordon PATH --manifest PATH --work DIR [--upstream 127.0.0.80]

The manifest is examples/playwright-mcp.yaml (or a copy of it): the tool
`browser`, @playwright/mcp with Debian's Chromium, P3 under gVisor,
`lifetime: session`, `egress: proxy`, `news.example` pinned to the loopback
address this script serves its pages on (port 80: run as root). Nothing
leaves this machine: cordon's own lookups go to a closed port
(CORDON_UPSTREAM_DNS=127.0.0.1:9), so only the pinned name resolves.

The official Python MCP SDK client drives:

1. a conversation: navigate, snapshot, click a link, type into a form and
   submit it, a cookie set and seen again (the positive control for 2), a
   page whose images try the metadata address, private addresses, a port
   and a loopback name the proxy does not open, and the metadata address
   navigated to directly; every refusal in the audit log with its reason,
   the allowed page's loads there too; the session's sandbox running, then
   gone after the client's DELETE;
2. a second conversation on the same gateway: the cookie of the first is
   absent; its sandbox gone after its DELETE;
3. a client in its own process killed with SIGKILL mid-conversation: its
   sandbox gone once cordon notices, and the session's end audited as its
   client gone.

Prints one PASS/FAIL line per check; exits 1 if any failed, 2 if the `mcp`
package is missing.
"""
import argparse
import asyncio
import html
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

try:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
except ImportError as e:  # pragma: no cover
    print(f"SKIP: the Python `mcp` package is not installed ({e}); pip install mcp")
    sys.exit(2)

FAILED = []
# Chromium under gVisor on a loaded two-core host: generous, never asserted.
CALL_TIMEOUT = 600.0
GONE_TIMEOUT = 180.0


def check(name, cond, detail=""):
    if cond:
        print(f"PASS {name}", flush=True)
    else:
        print(f"FAIL {name}: {detail}", flush=True)
        FAILED.append(name)
    return cond


# --- the loopback "public web" -------------------------------------------

SEEN = []
SEEN_LOCK = threading.Lock()

INDEX = """<!doctype html><html><head><title>Start</title></head><body>
<h1>Welcome to the stand-in</h1>
<p><a href="/second.html">Go to second</a></p>
<form action="/search" method="get">
<label for="q">Query</label> <input id="q" name="q">
<button type="submit">Search</button>
</form>
</body></html>"""

SECOND = """<!doctype html><html><head><title>Second</title></head>
<body><h1>Second page reached</h1></body></html>"""

# Subresources that only the proxy door decides: the metadata address,
# private addresses, a port proxy mode does not open, a loopback name. The
# pixel on news.example itself is the positive control.
ATTACK = """<!doctype html><html><head><title>Attack</title></head><body>
<h1>Attack page loaded</h1>
<img src="http://169.254.169.254/latest/meta-data/iam/security-credentials/">
<img src="http://10.1.2.3/internal.png">
<img src="http://192.168.77.1/router.png">
<img src="http://news.example:8080/other-port.png">
<img src="http://localhost/loopback.png">
<img src="/pixel.png">
</body></html>"""

PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, status, body, ctype="text/html; charset=utf-8", headers=()):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        with SEEN_LOCK:
            SEEN.append(f"{self.headers.get('Host', '')} {self.path}")
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/":
            self.send(200, INDEX)
        elif url.path == "/second.html":
            self.send(200, SECOND)
        elif url.path == "/search":
            q = urllib.parse.parse_qs(url.query).get("q", [""])[0]
            self.send(200, f"<!doctype html><title>Results</title><h1>You searched for: {html.escape(q)}</h1>")
        elif url.path == "/cookie":
            got = self.headers.get("Cookie", "")
            self.send(200, f"<!doctype html><title>Cookie</title><p>cookies before: [{html.escape(got)}]</p>",
                      headers=[("Set-Cookie", "seen=1; Path=/; Max-Age=3600")])
        elif url.path == "/attack.html":
            self.send(200, ATTACK)
        elif url.path == "/pixel.png":
            self.send(200, PIXEL, "image/png")
        else:
            self.send(404, "<!doctype html><title>404</title>not here")


def seen(pred):
    with SEEN_LOCK:
        return [s for s in SEEN if pred(s)]


# --- processes and sandboxes ----------------------------------------------

def descendants(root):
    """Every process descended from `root`: (pid, command line)."""
    parent, cmd = {}, {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
            c = Path(f"/proc/{e}/cmdline").read_bytes()
        except OSError:
            continue
        parent[int(e)] = int(stat.rsplit(")", 1)[1].split()[1])
        cmd[int(e)] = c.replace(b"\0", b" ").decode(errors="replace").strip()
    out = []
    for pid in parent:
        p, hops = pid, 0
        while p in parent and hops < 64:
            p = parent[p]
            hops += 1
            if p == root:
                out.append((pid, cmd[pid]))
                break
    return sorted(out)


def sandbox_dirs(run_dir):
    """The live gVisor sandboxes' directories under cordon's runtime directory."""
    d = Path(run_dir) / "gvisor"
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_dir())


def runsc_of(run_dir):
    """Any process on this host whose command line names this run directory
    (runsc and its sandbox and gofer processes take `--root` under it)."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            c = Path(f"/proc/{e}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in c and "browser_conversation.py" not in c:
            out.append((int(e), c.strip()))
    return out


def sandbox_running(serve_pid, run_dir):
    procs = descendants(serve_pid)
    return (any("runsc" in c for _, c in procs) and any("chrom" in c or "node" in c for _, c in procs)
            or bool(sandbox_dirs(run_dir)) and any("runsc" in c for _, c in procs))


async def wait_for(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        await asyncio.sleep(0.5)
    return pred()


def nothing_left(serve_pid, run_dir):
    return not descendants(serve_pid) and not sandbox_dirs(run_dir) and not runsc_of(run_dir)


# --- the audit log ---------------------------------------------------------

def records(audit):
    try:
        lines = Path(audit).read_text().splitlines()
    except OSError:
        return []
    out = []
    for l in lines:
        try:
            out.append(json.loads(l))
        except ValueError:
            pass
    return out


def deleted(audit):
    """How many sessions the audit log says their client ended with DELETE."""
    return sum(1 for r in records(audit) if r.get("status") == "session_ended" and r.get("reason") ==
               "session was ended by its client (DELETE); every sandbox of it was stopped")


def egress_records(audit):
    """(status, name, port, decision, reason) of the server's egress records."""
    out = []
    for r in records(audit):
        if r.get("caller") != "mcp-server" or r.get("tool") != "browser":
            continue
        for e in r.get("egress") or []:
            out.append((r.get("status"), e.get("name"), e.get("port"), e.get("decision"), e.get("reason", "")))
    return out


# --- MCP helpers -------------------------------------------------------------

def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def is_error(result):
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def ref_of(snapshot, role, name):
    m = re.search(rf'{role} "{re.escape(name)}"[^\n]*\[ref=([a-z0-9]+)\]', snapshot)
    return m.group(1) if m else None


def client(url):
    timeout = httpx2.Timeout(60.0, read=CALL_TIMEOUT)
    return streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=timeout))


async def call(s, tool, args):
    return await s.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT)


# --- the conversations -------------------------------------------------------

async def first_conversation(url, serve_pid, run_dir, audit):
    tag = "conversation 1"
    async with client(url) as streams:
        async with ClientSession(streams[0], streams[1], read_timeout_seconds=CALL_TIMEOUT) as s:
            await s.initialize()
            names = {t.name for t in (await s.list_tools()).tools}
            check(f"{tag}: the server's own tool names are listed",
                  {"browser_navigate", "browser_snapshot", "browser_click", "browser_type"} <= names,
                  sorted(names))

            r = await call(s, "browser_navigate", {"url": "http://news.example/"})
            t = text_of(r)
            check(f"{tag}: browser_navigate loads the page through the proxy",
                  not is_error(r) and "Page Title: Start" in t and "untrusted-output" in t, t)
            check(f"{tag}: the upstream served it", seen(lambda l: l == "news.example /"), SEEN)
            check(f"{tag}: the session's sandbox runs (gVisor, the server, Chromium)",
                  sandbox_running(serve_pid, run_dir) and len(sandbox_dirs(run_dir)) == 1,
                  (descendants(serve_pid), sandbox_dirs(run_dir)))
            sandbox = sandbox_dirs(run_dir)

            r = await call(s, "browser_snapshot", {})
            snap = text_of(r)
            link = ref_of(snap, "link", "Go to second")
            box = ref_of(snap, "textbox", "Query")
            check(f"{tag}: browser_snapshot has the link and the text box", link and box, snap)

            r = await call(s, "browser_click", {"target": link or "e0", "element": "Go to second link"})
            t = text_of(r)
            check(f"{tag}: browser_click follows the link",
                  not is_error(r) and "news.example/second.html" in t, t)
            check(f"{tag}: the click's request reached the upstream",
                  seen(lambda l: l == "news.example /second.html"), SEEN)
            r = await call(s, "browser_snapshot", {})
            check(f"{tag}: the second page is shown", "Second page reached" in text_of(r), text_of(r))

            r = await call(s, "browser_navigate_back", {})
            r = await call(s, "browser_snapshot", {})
            box = ref_of(text_of(r), "textbox", "Query")
            r = await call(s, "browser_type", {"target": box or "e0", "element": "Query text box",
                                               "text": "cordon in gvisor", "submit": True})
            check(f"{tag}: browser_type fills the form and submits it", not is_error(r), text_of(r))
            got = await wait_for(lambda: seen(lambda l: l == "news.example /search?q=cordon+in+gvisor"), 60)
            check(f"{tag}: the typed text reached the upstream", got, SEEN)
            r = await call(s, "browser_snapshot", {})
            check(f"{tag}: the results page shows the typed text",
                  "You searched for: cordon in gvisor" in text_of(r), text_of(r))

            r = await call(s, "browser_navigate", {"url": "http://news.example/cookie"})
            r = await call(s, "browser_snapshot", {})
            check(f"{tag}: no cookie at first", "cookies before: []" in text_of(r), text_of(r))
            r = await call(s, "browser_navigate", {"url": "http://news.example/cookie"})
            r = await call(s, "browser_snapshot", {})
            check(f"{tag}: the cookie set earlier in this conversation is sent (positive control)",
                  "cookies before: [seen=1]" in text_of(r), text_of(r))

            r = await call(s, "browser_navigate", {"url": "http://news.example/attack.html"})
            t = text_of(r)
            check(f"{tag}: the page that reaches out loads (positive control)",
                  not is_error(r) and "Page Title: Attack" in t, t)
            check(f"{tag}: its allowed image loads (positive control)",
                  await wait_for(lambda: seen(lambda l: l == "news.example /pixel.png"), 60), SEEN)
            r = await call(s, "browser_navigate",
                           {"url": "http://169.254.169.254/latest/meta-data/iam/security-credentials/"})
            r2 = await call(s, "browser_snapshot", {})
            t = text_of(r) + text_of(r2)
            check(f"{tag}: navigating to the metadata address shows the proxy's refusal",
                  "egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of browser"
                  in t, t)

            want = [
                ("169.254.169.254", 80, "IP literal 169.254.169.254 is not in the allowlist of browser"),
                ("10.1.2.3", 80, "IP literal 10.1.2.3 is not in the allowlist of browser"),
                ("192.168.77.1", 80, "IP literal 192.168.77.1 is not in the allowlist of browser"),
                ("news.example", 8080, "port 8080 is not open for browser (proxy mode allows ports 80 and 443)"),
                ("localhost", 80, "localhost is a loopback name"),
            ]

            def refused(name, port, why):
                return any(st == "denied" and n == name and p == port and d == "deny" and why in reason
                           for st, n, p, d, reason in egress_records(audit))

            await wait_for(lambda: all(refused(*w) for w in want), 60)
            for name, port, why in want:
                check(f"{tag}: {name}:{port} refused at the proxy and audited ({why})",
                      refused(name, port, why), egress_records(audit))
            check(f"{tag}: nothing refused reached the upstream",
                  not seen(lambda l: not l.startswith("news.example ")), SEEN)
            check(f"{tag}: the allowed loads are audited too",
                  any(st == "ok" and n == "news.example" and d == "allow"
                      for st, n, p, d, _ in egress_records(audit)), egress_records(audit))
            check(f"{tag}: one sandbox served the whole conversation", sandbox_dirs(run_dir) == sandbox,
                  (sandbox, sandbox_dirs(run_dir)))
        # Leaving the client sends DELETE (terminate_on_close).
    gone = await wait_for(lambda: nothing_left(serve_pid, run_dir), GONE_TIMEOUT)
    check(f"{tag}: after DELETE the session's sandbox is gone", gone,
          (descendants(serve_pid), sandbox_dirs(run_dir), runsc_of(run_dir)))
    check(f"{tag}: the session's end is audited as its client's DELETE", deleted(audit) == 1,
          [r for r in records(audit) if r.get("status") == "session_ended"])


async def second_conversation(url, serve_pid, run_dir, audit):
    tag = "conversation 2"
    async with client(url) as streams:
        async with ClientSession(streams[0], streams[1], read_timeout_seconds=CALL_TIMEOUT) as s:
            await s.initialize()
            r = await call(s, "browser_navigate", {"url": "http://news.example/cookie"})
            r = await call(s, "browser_snapshot", {})
            check(f"{tag}: the first conversation's cookie is absent",
                  "cookies before: []" in text_of(r), text_of(r))
            check(f"{tag}: a fresh sandbox of its own runs", len(sandbox_dirs(run_dir)) == 1,
                  (descendants(serve_pid), sandbox_dirs(run_dir)))
    gone = await wait_for(lambda: nothing_left(serve_pid, run_dir), GONE_TIMEOUT)
    check(f"{tag}: after DELETE its sandbox is gone", gone,
          (descendants(serve_pid), sandbox_dirs(run_dir), runsc_of(run_dir)))
    check(f"{tag}: its end is audited as its client's DELETE", deleted(audit) == 2,
          [r for r in records(audit) if r.get("status") == "session_ended"])


async def killed_client(url):
    """The third conversation's client, run as its own process: navigates,
    says so, then waits to be killed."""
    async with client(url) as streams:
        async with ClientSession(streams[0], streams[1], read_timeout_seconds=CALL_TIMEOUT) as s:
            await s.initialize()
            r = await call(s, "browser_navigate", {"url": "http://news.example/"})
            print("navigated" if "Page Title: Start" in text_of(r) else f"failed: {text_of(r)}", flush=True)
            await asyncio.sleep(3600)


async def third_conversation(url, serve_pid, run_dir, audit):
    tag = "conversation 3 (client killed)"
    before = len([r for r in records(audit) if r.get("status") == "session_ended"])
    py = subprocess.Popen([sys.executable, __file__, "--client", url], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(py.stdout.readline), CALL_TIMEOUT)
        check(f"{tag}: the client navigated", line.strip() == "navigated", line)
        check(f"{tag}: its sandbox runs (positive control)",
              sandbox_running(serve_pid, run_dir), (descendants(serve_pid), sandbox_dirs(run_dir)))
        py.send_signal(signal.SIGKILL)
        py.wait(30)
    finally:
        if py.poll() is None:
            py.kill()
            py.wait(30)
    gone = await wait_for(lambda: nothing_left(serve_pid, run_dir), GONE_TIMEOUT)
    check(f"{tag}: its sandbox is gone once cordon notices", gone,
          (descendants(serve_pid), sandbox_dirs(run_dir), runsc_of(run_dir)))
    def ends():
        return [r for r in records(audit) if r.get("status") == "session_ended"][before:]

    ended = await wait_for(lambda: any("its client is gone" in (r.get("reason") or "") for r in ends()), 60)
    check(f"{tag}: the session's end is audited as its client gone", ended, ends())


async def main(args):
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    audit = work / "audit.jsonl"
    run_dir = work / "run"
    run_dir.mkdir(exist_ok=True)
    os.chmod(run_dir, 0o700)
    web = ThreadingHTTPServer((args.upstream, 80), Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    env = dict(os.environ, CORDON_AUDIT=str(audit), CORDON_STATE_DIR=str(work / "state"),
               CORDON_RUN_DIR=str(run_dir), CORDON_UPSTREAM_DNS="127.0.0.1:9")
    env.pop("CORDON_MANIFEST", None)
    err = open(work / "serve.stderr", "w+")
    proc = subprocess.Popen([args.cordon, "serve", "--http", "127.0.0.1:0", "-m", args.manifest],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        # The start proves the sandbox first (a gVisor sandbox, slow on a loaded host).
        end = time.monotonic() + 600
        while time.monotonic() < end and proc.poll() is None:
            m = re.search(r"serving MCP on (\S+)", (work / "serve.stderr").read_text())
            if m:
                url = m.group(1)
                break
            await asyncio.sleep(0.5)
        if not check("cordon serve --http serves the browser", url is not None,
                     (work / "serve.stderr").read_text()):
            return
        check("no sandbox runs before a conversation", nothing_left(proc.pid, run_dir),
              (descendants(proc.pid), sandbox_dirs(run_dir)))
        await first_conversation(url, proc.pid, run_dir, audit)
        await second_conversation(url, proc.pid, run_dir, audit)
        await third_conversation(url, proc.pid, run_dir, audit)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        web.shutdown()
        if FAILED:
            err.seek(0)
            print("--- cordon serve's stderr\n" + err.read()[-8000:])


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon")
    ap.add_argument("--manifest")
    ap.add_argument("--work")
    ap.add_argument("--upstream", default="127.0.0.80")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        asyncio.run(killed_client(a.client))
        sys.exit(0)
    asyncio.run(main(a))
    print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'OK'}: {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)
