#!/usr/bin/env python3
"""Many concurrent HTTP sessions against `cordon serve`, from several client
processes (the official Python MCP SDK), on loopback.

    scripts/bench-sessions.py [--cordon target/debug/cordon] [--sessions 200] [--procs 2]

The manifest has a P1 command tool (`hello`) and an `mcp:` server (the
fixture server of crates/mcp/tests/fixtures, `lifetime: session`). Each
session initializes, calls `hello`, and every `--mcp-every`-th session also
calls the server's `fx__echo` (starting that session's server sandbox).
With every session open and idle, the resident set of `cordon serve` is
read: memory per idle session = (RSS with the sessions - RSS before) /
sessions. Then the first client process closes its sessions (DELETE) and
every other one is killed with SIGKILL; the script waits (bounded) until no
process descended from `cordon serve` is left and counts the audit's
`session_ended` records.

Prints one line per figure and a Markdown table row; exits 1 on any error.
Needs the `mcp` package (scripts/setup.sh) and root or the jail's usual
requirements for the sandboxes.
"""
import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def descendants(root):
    parent = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e}/stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        parent[int(e)] = int(rest[1])
    out = []
    for pid in parent:
        p, hops = pid, 0
        while p in parent and hops < 64:
            if parent[p] == root:
                out.append(pid)
                break
            p, hops = parent[p], hops + 1
    return out


def is_error(result):
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", None))


async def client_main(url, n, mcp_every, tag):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    close = asyncio.Event()
    ready = 0
    errors = []
    all_ready = asyncio.Event()

    async def one(i):
        nonlocal ready
        try:
            async with streamable_http_client(url) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    r = await s.call_tool("hello", {})
                    if is_error(r):
                        raise RuntimeError(f"hello: {r}")
                    if mcp_every and i % mcp_every == 0:
                        r = await s.call_tool("fx__echo", {"text": f"{tag}-{i}"})
                        if is_error(r):
                            raise RuntimeError(f"fx__echo: {r}")
                    ready += 1
                    if ready + len(errors) == n:
                        all_ready.set()
                    await close.wait()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            while isinstance(e, BaseExceptionGroup) and e.exceptions:
                e = e.exceptions[0]
            errors.append(f"{type(e).__name__}: {e}")
            if ready + len(errors) == n:
                all_ready.set()

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await all_ready.wait()
    print(json.dumps({"ready": ready, "errors": errors[:5], "n_errors": len(errors)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    close.set()
    await asyncio.gather(*tasks, return_exceptions=True)


def manifest(dir_):
    fixtures = REPO / "crates/mcp/tests/fixtures"
    m = f"""version: 1
tools:
  hello:
    profile: P1
    description: Say hello.
    command: [/bin/echo, hello]
  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/srv/fx"]
    mcp:
      command: ["/usr/bin/python3", "/srv/fx/fixture_server.py"]
      tools:
        allow: [echo]
"""
    p = Path(dir_) / "cordon.yaml"
    p.write_text(m)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon", default=str(REPO / "target/debug/cordon"))
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--mcp-every", type=int, default=10)
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="c", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        asyncio.run(client_main(a.client, a.n, a.mcp_every, a.tag))
        return 0
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("the Python `mcp` package is missing (scripts/setup.sh)")
        return 2

    with tempfile.TemporaryDirectory(prefix="cordon-bench-sessions-") as d:
        audit = Path(d) / "audit.jsonl"
        env = dict(os.environ, CORDON_AUDIT=str(audit), CORDON_STATE_DIR=d)
        serve = subprocess.Popen(
            [a.cordon, "serve", "--http", "127.0.0.1:0", "-m", str(manifest(d))],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        url = None
        for line in serve.stderr:
            if "serving MCP on " in line:
                url = line.split("serving MCP on ", 1)[1].split()[0]
                break
        if url is None:
            print("cordon serve did not start")
            return 1
        # Keep draining stderr.
        import threading
        threading.Thread(target=lambda: [None for _ in serve.stderr], daemon=True).start()
        failed = False
        try:
            # One warm-up session first: what every session shares (the
            # listing, the allocator's arenas) is then in the baseline.
            warm = subprocess.run(
                [sys.executable, __file__, "--client", url, "--n", "1", "--mcp-every", "1",
                 "--tag", "warm"], input="\n", capture_output=True, text=True, timeout=120)
            if '"n_errors": 0' not in warm.stdout:
                print(f"warm-up failed: {warm.stdout} {warm.stderr}")
                return 1
            for _ in range(100):
                if not descendants(serve.pid):
                    break
                time.sleep(0.1)
            time.sleep(1)
            base = rss_kib(serve.pid)
            per = a.sessions // a.procs
            started = time.monotonic()
            clients = [
                subprocess.Popen(
                    [sys.executable, __file__, "--client", url, "--n", str(per),
                     "--mcp-every", str(a.mcp_every), "--tag", f"p{i}"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for i in range(a.procs)
            ]
            reports = [json.loads(c.stdout.readline() or "{}") for c in clients]
            opened = time.monotonic() - started
            ready = sum(r.get("ready", 0) for r in reports)
            errors = sum(r.get("n_errors", per) for r in reports)
            time.sleep(2)
            full = rss_kib(serve.pid)
            live = len(descendants(serve.pid))
            per_session = (full - base) / max(ready, 1)
            print(f"sessions open: {ready} of {per * a.procs} from {a.procs} processes "
                  f"in {opened:.1f} s, errors: {errors}")
            for r in reports:
                for e in r.get("errors", []):
                    print(f"  error: {e}")
            print(f"cordon serve RSS: {base} KiB before, {full} KiB with the sessions idle; "
                  f"{per_session:.0f} KiB per idle session")
            print(f"processes under cordon serve with the sessions open: {live} "
                  f"(the sessions' fx server sandboxes)")
            # The first process ends its sessions; the others are killed.
            clients[0].stdin.write("\n")
            clients[0].stdin.flush()
            clients[0].wait(timeout=120)
            for c in clients[1:]:
                c.send_signal(signal.SIGKILL)
                c.wait()
            t0 = time.monotonic()
            left = descendants(serve.pid)
            while left and time.monotonic() - t0 < 120:
                time.sleep(0.2)
                left = descendants(serve.pid)
            gone_after = time.monotonic() - t0
            ended = sum(1 for l in audit.read_text().splitlines()
                        if '"status":"session_ended"' in l.replace(" ", ""))
            print(f"left under cordon serve after the clients went: {len(left)} "
                  f"(waited {gone_after:.1f} s); session_ended records: {ended}")
            print(f"| {ready} | {a.procs} | {errors} | {per_session:.0f} KiB | {live} | "
                  f"{len(left)} | {gone_after:.1f} s |")
            failed = errors > 0 or ready != per * a.procs or bool(left)
        finally:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=20)
            except subprocess.TimeoutExpired:
                serve.kill()
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
