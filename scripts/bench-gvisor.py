#!/usr/bin/env python3
"""P3 on gVisor, same run (docs/benchmarks/gvisor.md):

1. cold `cordon run` of a P3 gVisor `/bin/true` tool against bare `runsc
   run` of an equivalent bundle (the same binds, tmpfs, flags and platform);
2. a task taken from a warm pool: how long after the hand-over the tool's
   program runs, against a cold start (crates/runtime/examples/pool-bench.rs);
3. memory (PSS) of an idle pooled sandbox;
4. a Chromium page fetch through cordon P3 (examples/browse.yaml) against
   the same Chromium run directly on the host;
5. a browser MCP conversation (examples/playwright-mcp.yaml: @playwright/mcp
   and Chromium in a gVisor sandbox per session, through `cordon serve
   --http` and the proxy door) against the same server and Chromium run
   directly on the host over stdio, with the Python MCP SDK client: from
   `initialize` to the first `browser_navigate` result, then each
   `browser_navigate` and `browser_snapshot` of the same conversation;
6. memory of idle warm browser sandboxes (`--only browser-memory`):
   `cordon serve` with examples/playwright-mcp.yaml at `mcp: {warm: N}`
   (with `--warm-up`: Chromium launched by the warm-up navigate) for each
   N of `--warm-sizes`; once the pool status `cordon doctor` reads says N
   ready, the PSS of each sandbox (the sum of /proc/PID/smaps_rollup Pss
   over the runsc process serve started and all its descendants: gofer,
   sandbox/Sentry, its systrap stubs), and how many fit in 2 GiB.

Run as root on a release build: `cargo build --release --bin cordon &&
python3 scripts/bench-gvisor.py [--rounds N] [--only browser]` (`CORDON_BIN`
for another binary). Nothing leaves the machine:
the page comes from a loopback upstream, and no public name resolves.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import HTTPServer, SimpleHTTPRequestHandler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORDON = os.environ.get("CORDON_BIN", os.path.join(ROOT, "target/release/cordon"))
CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--no-default-browser-check",
    "--disable-client-side-phishing-detection", "--disable-domain-reliability",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
]
ENV = dict(os.environ, CORDON_UPSTREAM_DNS="127.0.0.1:9", CORDON_AUDIT="/dev/null")


def timed(cmd, stdin=b"", env=ENV):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, input=stdin, capture_output=True, env=env)
    dt = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}): {p.stderr.decode()[-400:]}")
    return dt, p.stdout


def runsc_bundle(tmp, args=("/bin/true",), extra_binds=(), network_ns=True):
    """A bundle like cordon's for /bin/true (host binds, tmpfs /tmp and
    /dev/shm, an empty /sys, P3 rlimits, no capabilities); `args`, more
    read-only binds and the host's network (with `runsc --network=host`)
    for the browser's bare baseline."""
    rootfs = os.path.join(tmp, "rootfs")
    os.makedirs(rootfs)
    binds = [("/usr", "/usr")] + list(extra_binds)
    for d in ("bin", "lib", "lib64", "sbin", "lib32", "libx32"):
        p = "/" + d
        if os.path.islink(p):
            os.symlink(os.readlink(p), os.path.join(rootfs, d))
        elif os.path.isdir(p):
            binds.append((p, p))
    binds.append(("/etc", "/etc"))
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", "size=536870912"]},
        {"destination": "/sys", "type": "tmpfs", "source": "tmpfs", "options": ["ro", "nosuid", "nodev", "noexec", "size=4k"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "nodev", "noexec", "mode=1777", "size=536870912"]},
    ] + [{"destination": d, "type": "bind", "source": s, "options": ["rbind", "ro", "nosuid", "nodev"]} for s, d in binds]
    cfg = {
        "ociVersion": "1.0.2",
        "hostname": "cordon",
        "root": {"path": "rootfs", "readonly": True},
        "process": {
            "terminal": False, "user": {"uid": 1000, "gid": 1000}, "args": list(args),
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/tmp"], "cwd": "/tmp",
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}], "noNewPrivileges": True,
        },
        "mounts": mounts,
        "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts")
                                 + (("network",) if network_ns else ())]},
    }
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)


def bench_cold(rounds):
    tmp = tempfile.mkdtemp(prefix="cordon-bench-gv-")
    try:
        m = os.path.join(tmp, "m.yaml")
        with open(m, "w") as f:
            f.write("tools:\n  t:\n    profile: P3\n    runtime: gvisor\n    command: [/bin/true]\n")
        bundle = os.path.join(tmp, "bundle")
        os.makedirs(bundle)
        runsc_bundle(bundle)
        state = os.path.join(tmp, "state")
        runsc = shutil.which("runsc") or "/usr/bin/runsc"
        bare = [runsc, "--root", state, "--platform=systrap", "--network=none", "--ignore-cgroups",
                "--overlay2=none", "run", "--bundle", bundle]
        # Warm both (page cache, the platform cache).
        timed([CORDON, "run", "-m", m, "t"])
        timed(bare + ["warm"])
        c, b = [], []
        for i in range(rounds):  # interleaved
            c.append(timed([CORDON, "run", "-m", m, "t"])[0])
            b.append(timed(bare + [f"b{i}"])[0])
        return statistics.median(c), statistics.median(b)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench_exec_in_sandbox(rounds):
    """What a pooled hand-over cannot avoid: the program's `execve` inside
    the sandbox. Milliseconds per fork+exec+wait of /bin/true, 20 in a row
    in one P3 gVisor sandbox, and the same loop on the host (medians)."""
    loop = ('a=$(date +%s%N); i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done; '
            'b=$(date +%s%N); echo $(( (b - a) / 20000 ))')
    inside, host = [], []
    for _ in range(rounds):
        _, out = timed([CORDON, "exec", "--runtime", "gvisor", "--", "/bin/sh", "-c", loop])
        inside.append(int(out.strip()) / 1000)
        _, out = timed(["/bin/sh", "-c", loop])
        host.append(int(out.strip()) / 1000)
    return statistics.median(inside), statistics.median(host)


def bench_pool(rounds, profile):
    exe = os.path.join(ROOT, f"target/{profile}/examples/pool-bench")
    flags = ["--release"] if profile == "release" else []
    subprocess.run(["cargo", "build", *flags, "-q", "-p", "cordon-runtime", "--example", "pool-bench"],
                   cwd=ROOT, check=True)
    out = subprocess.run([exe, str(rounds)], capture_output=True, check=True, env=ENV).stdout
    return json.loads(out)


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def bench_chromium(rounds):
    web = os.path.join(ROOT, "examples/data/web")
    srv = HTTPServer(("127.0.0.80", 80), lambda *a: Quiet(*a, directory=web))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        direct, cordon = [], []
        m = os.path.join(ROOT, "examples/browse.yaml")
        for _ in range(rounds):
            prof = tempfile.mkdtemp(prefix="cordon-bench-chromium-")
            try:
                dt, out = timed([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={prof}", "--dump-dom",
                                 "http://127.0.0.80/"])
                assert b"Hello from the local upstream" in out, out[:200]
                direct.append(dt)
            finally:
                shutil.rmtree(prof, ignore_errors=True)
            dt, out = timed([CORDON, "run", "-m", m, "browse"], stdin=b"http://news.example/\n")
            assert b"Hello from the local upstream" in out, out[:200]
            cordon.append(dt)
        return statistics.median(cordon), statistics.median(direct)
    finally:
        srv.shutdown()


PLAYWRIGHT_MCP = os.path.join(os.environ.get("CORDON_E2E_CACHE", "/var/cache/cordon-e2e"),
                              "playwright-mcp/node_modules/@playwright/mcp/cli.js")


def bench_browser(rounds, calls, warm=0, warm_up=False):
    """Part 5: medians in ms of one conversation's first navigate (from
    `initialize`) and of its later navigates and snapshots, through cordon,
    directly, and under bare `runsc run` (the same server and Chromium in
    a bundle like the cold benchmark's, systrap, the host's network: no
    cordon, no doors, no gateway; what gVisor's platform alone costs). With `warm`, the manifest's server gets `mcp: {warm: N}`
    and each conversation through cordon starts 15 s after the last one
    ended (the pool refilled; 25 s with `warm_up`); with `warm_up` also `warm_up:
    {tool: browser_navigate, arguments: {url: "about:blank"}}`."""
    import asyncio
    import re
    import httpx2
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    web = os.path.join(ROOT, "examples/data/web")
    srv = HTTPServer(("127.0.0.80", 80), lambda *a: Quiet(*a, directory=web))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="cordon-bench-browser-")

    async def conversation(open_streams, url, figures):
        t0 = time.perf_counter()
        async with open_streams() as streams:
            async with ClientSession(streams[0], streams[1], read_timeout_seconds=600) as s:
                await s.initialize()
                r = await s.call_tool("browser_navigate", {"url": url})
                figures["first"].append((time.perf_counter() - t0) * 1e3)
                text = "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text")
                assert "Page Title:" in text and not getattr(r, "is_error", False), text[:400]
                for _ in range(calls):
                    t = time.perf_counter()
                    r = await s.call_tool("browser_navigate", {"url": url})
                    figures["navigate"].append((time.perf_counter() - t) * 1e3)
                    assert not getattr(r, "is_error", False)
                    t = time.perf_counter()
                    r = await s.call_tool("browser_snapshot", {})
                    figures["snapshot"].append((time.perf_counter() - t) * 1e3)
                    assert not getattr(r, "is_error", False)

    def direct_streams():
        return stdio_client(StdioServerParameters(
            command="/usr/bin/node",
            args=[PLAYWRIGHT_MCP, "--headless", "--isolated", "--no-sandbox", "--executable-path", CHROMIUM,
                  "--output-dir", os.path.join(tmp, "direct-out")],
            cwd=tmp))

    # Bare runsc: one container per conversation, its stdio the server's.
    bundle = os.path.join(tmp, "bundle")
    os.makedirs(bundle)
    pw_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(PLAYWRIGHT_MCP))))
    runsc_bundle(bundle, args=["/usr/bin/node", PLAYWRIGHT_MCP, "--headless", "--isolated", "--no-sandbox",
                               "--executable-path", CHROMIUM, "--output-dir", "/tmp/playwright-mcp"],
                 extra_binds=[(pw_dir, pw_dir)], network_ns=False)
    runsc_state = os.path.join(tmp, "runsc-state")
    runsc = shutil.which("runsc") or "/usr/bin/runsc"
    bare_ids = []

    def bare_streams():
        cid = f"bench-browser-{len(bare_ids)}"
        bare_ids.append(cid)
        return stdio_client(StdioServerParameters(
            command=runsc,
            args=["--root", runsc_state, "--platform=systrap", "--network=host", "--ignore-cgroups",
                  "--overlay2=none", "run", "--bundle", bundle, cid],
            cwd=tmp))

    env = dict(ENV, CORDON_STATE_DIR=os.path.join(tmp, "state"))
    err = open(os.path.join(tmp, "serve.stderr"), "w+")
    manifest = os.path.join(ROOT, "examples/playwright-mcp.yaml")
    if warm:
        text = open(manifest).read()
        assert "      startup_seconds: 60\n" in text
        manifest = os.path.join(tmp, "playwright-mcp.yaml")
        with open(manifest, "w") as f:
            f.write(text.replace("      startup_seconds: 60\n",
                                 f"      startup_seconds: 60\n      warm: {warm}\n"
                                 + ('      warm_up: {tool: browser_navigate, arguments: {url: "about:blank"}}\n'
                                    if warm_up else "")))
    serve = subprocess.Popen([CORDON, "serve", "--http", "127.0.0.1:0", "-m", manifest],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        for _ in range(1200):
            m = re.search(r"serving MCP on (\S+)", open(err.name).read())
            if m:
                url = m.group(1)
                break
            if serve.poll() is not None:
                break
            time.sleep(0.5)
        if not url:
            sys.exit("cordon serve did not start: " + open(err.name).read()[-2000:])

        def cordon_streams():
            return streamable_http_client(url, http_client=httpx2.AsyncClient(timeout=httpx2.Timeout(60, read=600)))

        via = {"first": [], "navigate": [], "snapshot": []}
        direct = {"first": [], "navigate": [], "snapshot": []}
        bare = {"first": [], "navigate": [], "snapshot": []}

        async def run():
            # Warm both (page cache; the gateway's listing of the server).
            await conversation(cordon_streams, "http://news.example/", {"first": [], "navigate": [], "snapshot": []})
            await conversation(direct_streams, "http://127.0.0.80/", {"first": [], "navigate": [], "snapshot": []})
            await conversation(bare_streams, "http://127.0.0.80/", {"first": [], "navigate": [], "snapshot": []})
            for _ in range(rounds):  # interleaved
                if warm:
                    await asyncio.sleep(25 if warm_up else 15)
                await conversation(cordon_streams, "http://news.example/", via)
                await conversation(direct_streams, "http://127.0.0.80/", direct)
                await conversation(bare_streams, "http://127.0.0.80/", bare)
        try:
            asyncio.run(run())
        except BaseException:
            err.seek(0)
            sys.stderr.write("cordon serve's stderr:\n" + err.read()[-4000:])
            raise
        med = statistics.median
        return {k: (med(via[k]), med(direct[k]), med(bare[k])) for k in via}
    finally:
        for cid in bare_ids:
            subprocess.run([runsc, "--root", runsc_state, "delete", "--force", cid],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        serve.terminate()
        serve.wait(60)
        srv.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def proc_children():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def pss_kib(pid, fields=("Pss:",)):
    """The sum of `fields` of /proc/PID/smaps_rollup, in KiB."""
    n = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.split(maxsplit=1)[0] in fields:
                    n += int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return n


PRIVATE = ("Private_Clean:", "Private_Dirty:")


def sandbox_pss_mib(serve_pid):
    """PSS (MiB) of each sandbox `cordon serve` started: each of its child
    processes (the runsc that started a sandbox) with all descendants."""
    kids = proc_children()
    out = []
    for top in kids.get(serve_pid, []):
        todo, tree = [top], []
        while todo:
            p = todo.pop()
            tree.append(p)
            todo.extend(kids.get(p, []))
        with open(f"/proc/{top}/cmdline", "rb") as f:
            if b"runsc" not in f.read():
                continue
        out.append((sum(pss_kib(p) for p in tree) / 1024, len(tree),
                    sum(pss_kib(p, PRIVATE) for p in tree) / 1024))
    return out


def bench_browser_memory(sizes, warm_up, settle):
    """Part 6: for each pool size, the PSS of every idle warm browser
    sandbox once the pool is full, read `settle` seconds after the pool
    status says so."""
    import re
    web = os.path.join(ROOT, "examples/data/web")
    srv = HTTPServer(("127.0.0.80", 80), lambda *a: Quiet(*a, directory=web))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    text = open(os.path.join(ROOT, "examples/playwright-mcp.yaml")).read()
    assert "      startup_seconds: 60\n" in text
    results = {}
    try:
        for n in sizes:
            tmp = tempfile.mkdtemp(prefix="cordon-bench-browser-mem-")
            manifest = os.path.join(tmp, "playwright-mcp.yaml")
            with open(manifest, "w") as f:
                f.write(text.replace("      startup_seconds: 60\n",
                                     f"      startup_seconds: 60\n      warm: {n}\n"
                                     + ('      warm_up: {tool: browser_navigate, arguments: {url: "about:blank"}}\n'
                                        if warm_up else "")))
            state = os.path.join(tmp, "state")
            env = dict(ENV, CORDON_STATE_DIR=state)
            err = open(os.path.join(tmp, "serve.stderr"), "w+")
            serve = subprocess.Popen([CORDON, "serve", "--http", "127.0.0.1:0", "--no-probe", "-m", manifest],
                                     env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            try:
                status = os.path.join(state, "pools", f"{serve.pid}.json")
                t0 = time.perf_counter()
                ready = 0
                while time.perf_counter() - t0 < 900 and serve.poll() is None:
                    try:
                        with open(status) as f:
                            pools = json.load(f)["pools"]
                        ready = sum(p["ready"] for p in pools if p["tool"] == "browser")
                        failed = [p["last_failure"] for p in pools if p["refill_failures"]]
                        if failed:
                            sys.exit(f"warm {n}: a warm server failed: {failed}")
                    except (OSError, ValueError, KeyError):
                        pass
                    if ready >= n:
                        break
                    time.sleep(1)
                if ready < n:
                    err.seek(0)
                    sys.exit(f"warm {n}: {ready} ready: " + err.read()[-2000:])
                fill_s = time.perf_counter() - t0
                time.sleep(settle)
                per = sandbox_pss_mib(serve.pid)
                serve_pss = pss_kib(serve.pid) / 1024
                load = os.getloadavg()[0]
                results[n] = {"fill_s": fill_s, "sandboxes_mib": [p for p, _, _ in per],
                              "private_mib": [u for _, _, u in per],
                              "processes": [c for _, c, _ in per], "serve_mib": serve_pss, "load": load}
                print(f"warm {n}{' + warm-up' if warm_up else ''}: ready after {fill_s:.0f} s; "
                      f"PSS per idle sandbox {', '.join(f'{p:.0f}' for p, _, _ in per)} MiB "
                      f"(total {sum(p for p, _, _ in per):.0f}; private {', '.join(f'{u:.0f}' for _, _, u in per)}; "
                      f"{', '.join(str(c) for _, c, _ in per)} processes); cordon serve itself {serve_pss:.0f} MiB; "
                      f"load {load:.1f}", flush=True)
            finally:
                serve.terminate()
                serve.wait(120)
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        srv.shutdown()
    # What fits in 2 GiB: sandboxes share host pages (runsc, the files
    # they map), so PSS per sandbox falls as they are added; the largest
    # pool measured gives the most sharing, its private memory the floor.
    if results:
        n = max(results)
        r = results[n]
        mean = statistics.mean(r["sandboxes_mib"])
        private = statistics.mean(r["private_mib"])
        print(f"at warm {n}: mean PSS per idle warm browser sandbox {mean:.0f} MiB "
              f"(private {private:.0f}): {int(2048 // mean)} fit in 2 GiB at that sharing")
    print(json.dumps({"browser_warm_pss": results}))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--chromium-rounds", type=int, default=5)
    ap.add_argument("--pool-profile", choices=["release", "debug"], default="release",
                    help="build of the pool benchmark (the pool's own code is not on a hot path)")
    ap.add_argument("--browser-rounds", type=int, default=5,
                    help="conversations of part 5, each side")
    ap.add_argument("--browser-calls", type=int, default=5,
                    help="navigate+snapshot pairs per conversation of part 5")
    ap.add_argument("--only", choices=["browser", "browser-memory", "start"],
                    help="run only that part (start: the cold start, the pool and the exec figures)")
    ap.add_argument("--warm-sizes", default="1,2,4",
                    help="browser-memory: the pool sizes measured, comma-separated")
    ap.add_argument("--settle", type=int, default=20,
                    help="browser-memory: seconds between the pool being full and the reading")
    ap.add_argument("--warm", type=int, default=0,
                    help="part 5 with `mcp: {warm: N}` (a pool of started servers)")
    ap.add_argument("--warm-up", action="store_true",
                    help="with --warm: each pooled server first navigates to about:blank (Chromium launched)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (P3 needs cgroup limits; the page's upstream binds port 80)")
    if not os.path.exists(CORDON):
        sys.exit(f"{CORDON} missing: cargo build --release --bin cordon")
    if a.only == "browser-memory":
        bench_browser_memory([int(x) for x in a.warm_sizes.split(",")], a.warm_up, a.settle)
        return
    if a.only == "browser":
        report_browser(bench_browser(a.browser_rounds, a.browser_calls, a.warm, a.warm_up))
        return
    c, b = bench_cold(a.rounds)
    print(f"cold P3 /bin/true: cordon run {c:.1f} ms, bare runsc run {b:.1f} ms: {c / b:.2f}x")
    if a.only == "start":
        p = bench_pool(a.rounds, a.pool_profile)
        print(f"pool: program runs {p['pool_take_to_start_ms']:.2f} ms after the take "
              f"(cold: {p['cold_start_ms']:.1f} ms); task total {p['pool_total_ms']:.1f} ms")
        ei, eh = bench_exec_in_sandbox(5)
        print(f"fork+exec+wait of /bin/true: {ei:.2f} ms inside a P3 gVisor sandbox, {eh:.2f} ms on the host")
        return
    p = bench_pool(a.rounds, a.pool_profile)
    print(f"pool: program runs {p['pool_take_to_start_ms']:.2f} ms after the take "
          f"(cold: {p['cold_start_ms']:.1f} ms); task total {p['pool_total_ms']:.1f} ms "
          f"(cold {p['cold_total_ms']:.1f} ms); idle pooled sandbox PSS {p['idle_pooled_pss_mib']:.1f} MiB")
    ei, eh = bench_exec_in_sandbox(5)
    print(f"fork+exec+wait of /bin/true: {ei:.2f} ms inside a P3 gVisor sandbox, {eh:.2f} ms on the host")
    cc, cd = bench_chromium(a.chromium_rounds)
    print(f"chromium page fetch: cordon P3 {cc:.0f} ms, directly {cd:.0f} ms: {cc / cd:.2f}x")
    br = bench_browser(a.browser_rounds, a.browser_calls)
    report_browser(br)
    print(json.dumps({"cold_cordon_ms": c, "cold_runsc_ms": b, "ratio": c / b, "pool": p,
                      "exec_in_gvisor_ms": ei, "exec_on_host_ms": eh,
                      "chromium_cordon_ms": cc, "chromium_direct_ms": cd, "browser_mcp_ms": br}))


def report_browser(br):
    for k, what in (("first", "initialize to the first browser_navigate result"),
                    ("navigate", "browser_navigate, later in the conversation"),
                    ("snapshot", "browser_snapshot")):
        v, d, b = br[k]
        print(f"browser MCP, {what}: cordon P3 {v:.0f} ms, directly {d:.0f} ms: {v / d:.2f}x; "
              f"bare runsc {b:.0f} ms: {b / d:.2f}x of directly, cordon {v / b:.2f}x of bare runsc")
    if len(sys.argv) > 1 and "--only" in sys.argv:
        print(json.dumps({"browser_mcp_ms": br}))


if __name__ == "__main__":
    main()
