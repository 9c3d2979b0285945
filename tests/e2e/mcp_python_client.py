#!/usr/bin/env python3
"""End-to-end check of `cordon serve` with the official Python MCP SDK client.

    mcp_python_client.py --cordon target/debug/cordon [--http] [--third-party MANIFEST]

Starts `cordon serve -m examples/cordon.yaml` (over stdio, or with --http on
127.0.0.1 with a port cordon picks), lists the tools, calls word_count and
pdf_to_text, and checks a schema refusal and an unknown tool. With
--third-party, also drives a manifest that runs the reference servers
`@modelcontextprotocol/server-everything` (as tool `everything`) and
`@modelcontextprotocol/server-filesystem` (as tool `files`, /data mounted
read-only) inside their sandboxes.

Prints one PASS/FAIL line per check; exits 1 if any check failed, 2 if
the `mcp` package is missing.
"""
import argparse
import asyncio
import base64
import os
import re
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

try:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as e:  # pragma: no cover
    print(f"SKIP: the Python `mcp` package is not installed ({e}); pip install mcp")
    sys.exit(2)

REPO = Path(__file__).resolve().parents[2]
FAILED = []


def check(name, cond, detail=""):
    if cond:
        print(f"PASS {name}")
    else:
        print(f"FAIL {name}: {detail}")
        FAILED.append(name)


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def wrapped_body(text):
    m = re.match(r'<untrusted-output [^>]*nonce="([0-9a-f]{32})"[^>]*>\n(.*)\n</untrusted-output nonce="\1">$',
                 text, re.S)
    return m.group(2) if m else None


def meta_of(result):
    return getattr(result, "meta", None) or getattr(result, "_meta", None) or {}


async def expect_error(session, tool, args):
    try:
        await session.call_tool(tool, args)
    except MCPError as e:
        return e
    return None


@asynccontextmanager
async def connect(cordon, manifest, http, audit):
    env = dict(os.environ, CORDON_AUDIT=audit, CORDON_STATE_DIR=str(Path(audit).parent))
    if not http:
        params = StdioServerParameters(command=cordon, args=["serve", "-m", str(manifest)], env=env)
        async with stdio_client(params) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s
        return
    proc = subprocess.Popen([cordon, "serve", "--http", "127.0.0.1:0", "-m", str(manifest)],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            m = re.search(r"serving MCP on (\S+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            raise RuntimeError("cordon serve --http did not start")
        async with streamable_http_client(url) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s
    finally:
        proc.terminate()
        proc.wait(10)


async def example_checks(cordon, http, audit):
    tag = "http" if http else "stdio"
    async with connect(cordon, REPO / "examples/cordon.yaml", http, audit) as s:
        tools = await s.list_tools()
        names = sorted(t.name for t in tools.tools)
        commands = [n for n in names if "__" not in n]
        check(f"{tag}: tools/list", commands == ["pdf_to_text", "thumbnail", "word_count"], names)
        scratch = sorted(n for n in names if n.startswith("scratch__"))
        check(f"{tag}: only the allowed tools of the example's mcp: server",
              scratch in ([], ["scratch__list_allowed_directories", "scratch__list_directory",
                               "scratch__read_text_file", "scratch__write_file"]), scratch)
        if scratch:
            r = await s.call_tool("scratch__write_file", {"path": "/tmp/a.txt", "content": "hello"})
            check(f"{tag}: scratch__write_file", "Successfully wrote" in text_of(r), text_of(r))
            r = await s.call_tool("scratch__read_text_file", {"path": "/tmp/a.txt"})
            check(f"{tag}: scratch__read_text_file, gated", wrapped_body(text_of(r)) == "hello", text_of(r))

        r = await s.call_tool("word_count", {"text": "one two three\n"})
        body = wrapped_body(text_of(r))
        check(f"{tag}: word_count result is wrapped as untrusted", body is not None, text_of(r))
        check(f"{tag}: word_count counts", body is not None and body.split() == ["1", "3", "14"], body)
        meta = meta_of(r)
        check(f"{tag}: _meta says untrusted", meta.get("cordon/trust") == "untrusted", meta)

        pdf = base64.b64encode((REPO / "examples/data/report.pdf").read_bytes()).decode()
        r = await s.call_tool("pdf_to_text", {"pdf": pdf})
        check(f"{tag}: pdf_to_text", "Quarterly report: revenue up 12 percent." in text_of(r), text_of(r))

        e = await expect_error(s, "word_count", {"text": 42})
        check(f"{tag}: schema refusal is -32602 naming /text",
              e is not None and e.code == -32602 and "/text" in e.message, e and e.message)
        e = await expect_error(s, "no_such_tool", {})
        check(f"{tag}: unknown tool is -32602",
              e is not None and e.code == -32602 and "unknown tool" in e.message, e and e.message)


async def third_party_checks(cordon, manifest, http, audit):
    tag = ("http" if http else "stdio") + " third-party"
    async with connect(cordon, manifest, http, audit) as s:
        tools = await s.list_tools()
        names = {t.name for t in tools.tools}
        check(f"{tag}: everything__echo listed", "everything__echo" in names, sorted(names)[:10])
        check(f"{tag}: files__read_text_file listed", "files__read_text_file" in names, sorted(names)[:10])

        r = await s.call_tool("everything__echo", {"message": "through cordon"})
        check(f"{tag}: everything__echo", wrapped_body(text_of(r)) == "Echo: through cordon", text_of(r))

        r = await s.call_tool("everything__get-env", {})
        body = wrapped_body(text_of(r)) or ""
        check(f"{tag}: the server sees only the sandbox environment",
              "CORDON_AUDIT" not in body and "PATH" in body, body)

        r = await s.call_tool("everything__get-tiny-image", {})
        images = [c for c in r.content if getattr(c, "type", "") == "image"]
        check(f"{tag}: images pass the gate as image content",
              len(images) == 1 and getattr(images[0], "mime_type", getattr(images[0], "mimeType", None)) == "image/png", r.content)

        r = await s.call_tool("files__read_text_file", {"path": "/data/note.txt"})
        check(f"{tag}: files__read_text_file", wrapped_body(text_of(r)) == "hello from a file", text_of(r))
        r = await s.call_tool("files__write_file", {"path": "/data/new.txt", "content": "x"})
        err = bool(getattr(r, "is_error", getattr(r, "isError", False)))
        check(f"{tag}: the read-only mount refuses writes (EROFS)",
              err and "EROFS: read-only file system, open '/data/new.txt'" in text_of(r), text_of(r))

        progress = []

        async def on_progress(p, total, message):
            progress.append(p)

        if UPSTREAM_PORT:
            check(f"{tag}: both mcp-server-fetch tools listed",
                  {"fetch__fetch", "webfetch__fetch"} <= names, sorted(names))
        if "fetch__fetch" in names:
            # mcp-server-fetch runs with `network: none` and without its own
            # check of private addresses: only cordon stops it. It cannot
            # connect to the loopback upstream that webfetch, the same server
            # with egress, reaches (the control below). Only loopback: were
            # the sandbox open, nothing would leave this machine.
            url = f"http://127.0.0.1:{UPSTREAM_PORT}/page"
            r = await s.call_tool("fetch__fetch", {"url": url, "raw": True})
            err = bool(getattr(r, "is_error", getattr(r, "isError", False)))
            check(f"{tag}: mcp-server-fetch with no network cannot connect",
                  err and 'error="true"' in text_of(r)
                  and f"Failed to fetch {url}: ConnectError" in text_of(r)
                  and "marker-cordon-egress-ok" not in text_of(r), text_of(r))

        if "webfetch__fetch" in names and UPSTREAM_PORT:
            # The same server with egress to one loopback upstream through
            # cordon's doors: the allowed URL is fetched (positive control),
            # any other is refused by the broker, with its reason.
            r = await s.call_tool("webfetch__fetch", {"url": f"http://api.test:{UPSTREAM_PORT}/page", "raw": True})
            check(f"{tag}: mcp-server-fetch reaches its allowlisted upstream",
                  "marker-cordon-egress-ok" in text_of(r), text_of(r))
            r = await s.call_tool("webfetch__fetch", {"url": f"http://evil.test:{UPSTREAM_PORT}/page", "raw": True})
            check(f"{tag}: mcp-server-fetch is refused any other host",
                  "marker-cordon-egress-ok" not in text_of(r) and "status code 403" in text_of(r), text_of(r))

        names_lro = [n for n in names if "long-running" in n or "longRunning" in n]
        if names_lro:
            r = await s.call_tool(names_lro[0], {"duration": 1, "steps": 3}, progress_callback=on_progress)
            check(f"{tag}: progress from {names_lro[0]} reaches the client", len(progress) >= 3, progress)

        # Resources and prompts of server-everything, forwarded and gated.
        res = await s.list_resources()
        uris = [str(r.uri) for r in res.resources]
        docs = [u for u in uris if u.startswith("demo://resource/static/document/")]
        check(f"{tag}: everything's resources listed with their own URIs", bool(docs), uris[:5])
        if docs:
            r = await s.read_resource(docs[0])
            check(f"{tag}: a resource is wrapped as untrusted",
                  wrapped_body(getattr(r.contents[0], "text", "")) is not None, r.contents[0])
        r = await s.read_resource("demo://resource/dynamic/text/5")
        body = wrapped_body(getattr(r.contents[0], "text", "")) or ""
        check(f"{tag}: a resource through a listed template", body.startswith("Resource 5:"), r.contents[0])
        p = await s.get_prompt("everything__args-prompt", {"city": "Lyon"})
        check(f"{tag}: everything__args-prompt, gated",
              wrapped_body(getattr(p.messages[0].content, "text", "")) == "What's weather in Lyon?", p.messages)
        try:
            await s.read_resource("file:///etc/passwd")
            e = None
        except MCPError as err:
            e = err
        check(f"{tag}: a URI no server listed is -32002",
              e is not None and e.code == -32002 and "not exposed" in e.message, e and e.message)


def third_party_manifest(npm_dir, tmp, py_dir=None):
    # The sandbox runs as an unprivileged uid: the mounted directory and its
    # parents must be readable by it.
    os.chmod(tmp, 0o755)
    data = Path(tmp) / "data"
    data.mkdir(mode=0o755)
    (data / "note.txt").write_text("hello from a file\n")
    os.chmod(data / "note.txt", 0o644)
    mods = "/srv/npm/node_modules/@modelcontextprotocol"
    m = Path(tmp) / "third-party.yaml"
    m.write_text(f"""version: 1
tools:
  everything:
    profile: P2
    description: The MCP reference test server.
    network: none
    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}
    mounts: ["{npm_dir}:/srv/npm"]
    mcp:
      command: ["/usr/bin/node", "{mods}/server-everything/dist/index.js", "stdio"]
  files:
    profile: P2
    description: A directory, read-only.
    network: none
    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}
    mounts: ["{npm_dir}:/srv/npm", "{data}:/data"]
    mcp:
      command: ["/usr/bin/node", "{mods}/server-filesystem/dist/index.js", "/data"]
""")
    if py_dir:
        with m.open("a") as f:
            f.write(f"""  fetch:
    profile: P2
    description: mcp-server-fetch, with no network at all.
    network: none
    limits: {{wall_seconds: 20, memory: 512M, tasks: 64}}
    mounts: ["{py_dir}:/srv/py"]
    env: {{PYTHONPATH: /srv/py}}
    mcp:
      # Its own check of private addresses off: the sandbox is what refuses.
      command: ["/usr/bin/python3", "-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips"]
  webfetch:
    profile: P2
    description: mcp-server-fetch, with egress to one loopback test upstream only.
    egress: ["api.test:{UPSTREAM_PORT}"]
    resolve: {{api.test: 127.0.0.1}}
    allow_cidrs: [127.0.0.1/32]
    limits: {{wall_seconds: 20, memory: 512M, tasks: 64}}
    mounts: ["{py_dir}:/srv/py"]
    env: {{PYTHONPATH: /srv/py}}
    mcp:
      # cordon's doors vet every destination; the server's own check would
      # refuse the loopback upstream (crates/cli/tests/mcp_e2e.rs runs it with
      # the check on against a stand-in public address).
      command: ["/usr/bin/python3", "-m", "mcp_server_fetch", "--ignore-robots-txt", "--allow-private-ips"]
""")
    return m


async def as_is_checks(cordon, npm_dir, tmp, audit):
    """server-everything behind cordon under its own names (`open`, allowed
    to sample and elicit) beside the same server prefixed and not allowed
    (`closed`), with a client that has a model and a user."""
    from mcp import types

    mods = "/srv/npm/node_modules/@modelcontextprotocol"
    server = lambda name, extra: f"""  {name}:
    profile: P2
    network: none
    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}
    mounts: ["{npm_dir}:/srv/npm"]
    mcp:
      command: ["/usr/bin/node", "{mods}/server-everything/dist/index.js", "stdio"]
{extra}"""
    m = Path(tmp) / "as-is.yaml"
    m.write_text("version: 1\ntools:\n"
                 + server("open", "      expose: as-is\n      allow_sampling: true\n      allow_elicitation: true\n")
                 + server("closed", ""))
    sampled, elicited, changed = [], [], []

    async def on_sampling(context, params):
        sampled.append(params)
        return types.CreateMessageResult(role="assistant", model="py-model",
                                         content=types.TextContent(type="text", text="sampled by the python client"))

    async def on_elicitation(context, params):
        elicited.append(params)
        return types.ElicitResult(action="decline")

    async def on_message(message):
        inner = getattr(message, "root", message)
        if type(inner).__name__ == "ToolListChangedNotification":
            changed.append(inner)

    env = dict(os.environ, CORDON_AUDIT=audit, CORDON_STATE_DIR=str(tmp))
    params = StdioServerParameters(command=cordon, args=["serve", "-m", str(m)], env=env)
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1], sampling_callback=on_sampling,
                                 elicitation_callback=on_elicitation, message_handler=on_message) as s:
            await s.initialize()
            names = set()
            for _ in range(50):
                names = {t.name for t in (await s.list_tools()).tools}
                if "trigger-sampling-request" in names:
                    break
                await asyncio.sleep(0.1)
            check("as-is: server-everything's own names", {"echo", "get-sum"} <= names, sorted(names))
            check("as-is: the prefixed server beside it", "closed__echo" in names, sorted(names))
            check("as-is: tools registered after initialize (sampling, elicitation) listed",
                  {"trigger-sampling-request", "trigger-elicitation-request"} <= names, sorted(names))
            check("as-is: the client was told the list changed", len(changed) >= 1, changed)
            check("as-is: not allowed to sample or elicit, the server offers no such tools",
                  not any(n.startswith("closed__trigger-") and ("sampling" in n or "elicitation" in n)
                          for n in names), sorted(names))
            r = await s.call_tool("echo", {"message": "as it was"})
            check("as-is: echo", wrapped_body(text_of(r)) == "Echo: as it was", text_of(r))
            p = await s.get_prompt("simple-prompt", {})
            check("as-is: simple-prompt", wrapped_body(getattr(p.messages[0].content, "text", "")) is not None,
                  p.messages)
            if "trigger-sampling-request" in names:
                r = await s.call_tool("trigger-sampling-request", {"prompt": "hi", "maxTokens": 5})
                check("as-is: sampling reaches the client, the answer the server",
                      len(sampled) == 1 and "sampled by the python client" in text_of(r), (sampled, text_of(r)))
            if "trigger-elicitation-request" in names:
                r = await s.call_tool("trigger-elicitation-request", {})
                check("as-is: elicitation reaches the client, the answer the server",
                      len(elicited) == 1 and "declined" in text_of(r), (elicited, text_of(r)))


UPSTREAM_PORT = None


def start_upstream():
    """A loopback HTTP upstream for the egress check; returns its port."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html><head><title>t</title></head><body><p>marker-cordon-egress-ok</p></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv.server_address[1]


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon", default=str(REPO / "target/debug/cordon"))
    ap.add_argument("--http", action="store_true")
    ap.add_argument("--npm-dir", help="node_modules parent with the reference servers installed")
    ap.add_argument("--py-dir", help="pip --target directory with mcp-server-fetch installed")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        audit = str(Path(tmp) / "audit.jsonl")
        await example_checks(a.cordon, a.http, audit)
        if a.npm_dir:
            global UPSTREAM_PORT
            UPSTREAM_PORT = start_upstream() if a.py_dir else None
            m = third_party_manifest(a.npm_dir, tmp, a.py_dir)
            await third_party_checks(a.cordon, m, a.http, audit)
            if not a.http:
                await as_is_checks(a.cordon, a.npm_dir, tmp, audit)
    print(f"{'FAILED' if FAILED else 'OK'}: {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    asyncio.run(main())
