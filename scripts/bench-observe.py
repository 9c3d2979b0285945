#!/usr/bin/env python3
"""The cost of observing `cordon serve`, same run (docs/benchmarks.md,
"Observing the gateway"):

1. a P1 call (`/usr/bin/wc`, its text on stdin) through `cordon serve
   --http` on loopback, one MCP session per gateway, `--calls` sequential
   calls per block, on four gateways served at once: "off" (`--no-metrics`,
   no traces: the audit log is the only bookkeeping), "metrics" (the
   default: the metrics and the console kept, nobody reading them),
   "traces" (`--no-metrics --otlp`: every call's spans exported over
   OTLP/HTTP to a receiver on loopback, each call carrying an agent's
   `traceparent`) and "on" (both: the metrics and the console read by a
   scraper fetching `/metrics` and `/console` every `--scrape-interval`
   seconds, far more often than Prometheus or the console's own 5 s
   refresh would, and the spans exported); blocks interleaved, `--rounds`
   of each, medians over every call.
2. a probe run's CPU time per tool: `cordon probe -m MANIFEST --tool T`
   for each tool of the manifest (examples/cordon.yaml by default), user +
   system CPU of the probe process and everything it started
   (resource.getrusage of children), median of `--probe-rounds` runs.

Run after a release build (`cargo build --release -p cordon`): `python3
scripts/bench-observe.py [--calls N] [--rounds R]` (`CORDON_BIN` or
`--cordon` for another binary, e.g. a debug build: say so with the
figures). Nothing leaves the machine: the gateway and the scraper are on
loopback, the MCP client is plain `http.client`, and the example
manifest's tools have no network (`network: none`), so the probes' network
attempts end in their own sandboxes.
"""

import argparse
import http.client
import http.server
import json
import multiprocessing
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORDON = os.environ.get("CORDON_BIN", os.path.join(ROOT, "target/release/cordon"))

MANIFEST = """version: 1
tools:
  word_count:
    profile: P1
    description: Count lines, words and bytes of a text.
    command: ["/usr/bin/wc"]
    limits: {wall_seconds: 5, memory: 64M, tasks: 4, output_bytes: 4K}
    network: none
    input: {stdin: text}
    input_schema:
      type: object
      properties: {text: {type: string}}
      required: [text]
"""


class Mcp:
    """A minimal streamable-HTTP MCP client: one session, JSON-RPC over
    POST, the answer read from JSON or the SSE stream."""

    def __init__(self, host, port, traced=False):
        self.c = http.client.HTTPConnection(host, port, timeout=60)
        self.session = None
        self.id = 0
        self.traced = traced
        self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench-observe", "version": "1"}})
        self.notify("notifications/initialized")

    def _post(self, body):
        h = {"Content-Type": "application/json",
             "Accept": "application/json, text/event-stream"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        self.c.request("POST", "/mcp", json.dumps(body), h)
        r = self.c.getresponse()
        data = r.read()
        if r.status >= 300:
            sys.exit(f"POST /mcp: {r.status} {data[:300]!r}")
        self.session = r.getheader("Mcp-Session-Id") or self.session
        return r.getheader("Content-Type") or "", data

    def notify(self, method):
        self._post({"jsonrpc": "2.0", "method": method})

    def request(self, method, params):
        self.id += 1
        ctype, data = self._post({"jsonrpc": "2.0", "id": self.id, "method": method,
                                  "params": params})
        if ctype.startswith("text/event-stream"):
            for line in data.decode().splitlines():
                if line.startswith("data:") and '"id"' in line:
                    m = json.loads(line[5:])
                    if m.get("id") == self.id:
                        return m
            sys.exit(f"{method}: no answer in {data[:300]!r}")
        return json.loads(data)

    def call(self, text):
        params = {"name": "word_count", "arguments": {"text": text}}
        if self.traced:
            params["_meta"] = {"traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
        t0 = time.perf_counter()
        m = self.request("tools/call", params)
        dt = (time.perf_counter() - t0) * 1e3
        if "result" not in m or m["result"].get("isError"):
            sys.exit(f"call failed: {json.dumps(m)[:400]}")
        return dt


class Scraper:
    """Reads /metrics and /console every `interval` seconds until stopped,
    in a process of its own (not competing with the client for the GIL)."""

    def __init__(self, host, port, interval):
        self.stop = multiprocessing.Event()
        self.count = multiprocessing.Value("i", 0)
        self.p = multiprocessing.Process(
            target=Scraper.run, args=(host, port, interval, self.stop, self.count), daemon=True)

    def start(self):
        self.p.start()

    def join(self):
        self.stop.set()
        self.p.join()
        return self.count.value

    @staticmethod
    def run(host, port, interval, stop, count):
        c = http.client.HTTPConnection(host, port, timeout=30)
        while not stop.is_set():
            for path in ("/metrics", "/console"):
                c.request("GET", path)
                r = c.getresponse()
                r.read()
                if r.status != 200:
                    sys.exit(f"GET {path}: {r.status}")
                with count.get_lock():
                    count.value += 1
            stop.wait(interval)


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that counts what it is sent (in a process of
    its own: see `collect`)."""
    protocol_version = "HTTP/1.1"
    counts = None

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        with Collector.counts.get_lock():
            Collector.counts[0] += 1
            Collector.counts[1] += n
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def collect(server, counts):
    Collector.counts = counts
    server.serve_forever()


def serve(tmp, name, extra):
    """`cordon serve --http 127.0.0.1:0` of the manifest: (process, host, port)."""
    d = os.path.join(tmp, name)
    os.makedirs(d)
    m = os.path.join(d, "bench.yaml")
    with open(m, "w") as f:
        f.write(MANIFEST)
    env = dict(os.environ, CORDON_AUDIT=os.path.join(d, "audit.jsonl"), CORDON_STATE_DIR=d)
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(k, None)
    p = subprocess.Popen([CORDON, "serve", "--no-probe", "-m", m, "--http", "127.0.0.1:0"] + extra,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, text=True)
    for line in p.stderr:
        hit = re.search(r"serving MCP on http://([0-9.]+):(\d+)/mcp", line)
        if hit:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, hit.group(1), int(hit.group(2))
    sys.exit(f"cordon serve {name} did not start ({p.wait()})")


def bench_calls(calls, rounds, interval):
    tmp = tempfile.mkdtemp(prefix="cordon-bench-observe-")
    os.chmod(tmp, 0o755)
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    counts = multiprocessing.Array("q", 2)
    receiver = multiprocessing.Process(target=collect, args=(collector, counts), daemon=True)
    receiver.start()
    otlp = f"http://127.0.0.1:{collector.server_address[1]}"
    procs = []
    try:
        gws = {}
        for name, extra in (("off", ["--no-metrics"]), ("metrics", []),
                            ("traces", ["--no-metrics", "--otlp", otlp]),
                            ("on", ["--otlp", otlp])):
            p, host, port = serve(tmp, name, extra)
            procs.append(p)
            gws[name] = (host, port, Mcp(host, port, traced=(name in ("traces", "on"))))
        for _, _, mcp in gws.values():
            for _ in range(20):  # warm up
                mcp.call("a b\nc\n")
        times = {name: [] for name in gws}
        reads = 0
        names = list(gws)
        for r in range(rounds):
            # Each round in another order: no configuration always runs
            # first, or last.
            for name in names[r % len(names):] + names[:r % len(names)]:
                host, port, mcp = gws[name]
                s = None
                if name == "on":
                    s = Scraper(host, port, interval)
                    s.start()
                times[name].extend(mcp.call("a b\nc\n") for _ in range(calls))
                if s:
                    reads += s.join()
        medians = {name: statistics.median(t) for name, t in times.items()}
        for p in procs:
            p.terminate()
            p.wait()
        procs = []
        return medians, reads, calls * rounds, counts[0], counts[1]
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        receiver.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


def tools_of(manifest):
    p = subprocess.run([CORDON, "explain", "-m", manifest, "--json"], capture_output=True,
                       text=True)
    if p.returncode == 0:
        try:
            doc = json.loads(p.stdout)
            tools = doc.get("tools") if isinstance(doc, dict) else None
            if isinstance(tools, dict):
                return sorted(tools)
            if isinstance(tools, list):
                return [t["name"] for t in tools]
        except (ValueError, KeyError, TypeError):
            pass
    # The manifest's top-level tool names, read from its text.
    names, inside = [], False
    for line in open(manifest):
        if re.match(r"^tools:\s*$", line):
            inside = True
            continue
        if inside and re.match(r"^\S", line):
            inside = False
        hit = re.match(r"^  ([A-Za-z0-9_.-]+):\s*$", line) if inside else None
        if hit:
            names.append(hit.group(1))
    return names


def cpu_of(cmd):
    """Run `cmd`: (user + system CPU seconds of it and its descendants,
    wall seconds, exit status)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, p.returncode


def bench_probe(manifest, rounds):
    out = []
    for tool in tools_of(manifest):
        cpus, walls, codes = [], [], set()
        for _ in range(rounds):
            cpu, wall, code = cpu_of([CORDON, "probe", "-m", manifest, "--tool", tool])
            cpus.append(cpu)
            walls.append(wall)
            codes.add(code)
        out.append((tool, statistics.median(cpus), statistics.median(walls), sorted(codes)))
    return out


def main():
    global CORDON
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon", default=CORDON)
    ap.add_argument("--calls", type=int, default=100, help="calls per block")
    ap.add_argument("--rounds", type=int, default=5, help="blocks of each, interleaved")
    ap.add_argument("--scrape-interval", type=float, default=0.25)
    ap.add_argument("--manifest", default=os.path.join(ROOT, "examples/cordon.yaml"))
    ap.add_argument("--probe-rounds", type=int, default=3)
    ap.add_argument("--only", choices=["calls", "probe"])
    a = ap.parse_args()
    CORDON = a.cordon
    if not os.path.exists(CORDON):
        sys.exit(f"{CORDON} missing: cargo build --release -p cordon")
    print(f"cordon: {CORDON}; load average before: {os.getloadavg()}")
    if a.only in (None, "calls"):
        med, reads, n, posts, sent = bench_calls(a.calls, a.rounds, a.scrape_interval)
        off = med["off"]
        print(f"\n{n} calls each, {a.rounds} interleaved blocks; 'on': {reads} reads of "
              f"/metrics and /console (every {a.scrape_interval} s), {posts} OTLP exports "
              f"({sent} bytes) to a loopback receiver\n")
        print("| P1 call through `cordon serve --http` | median ms | ratio |")
        print("|---|---:|---:|")
        print(f"| off: `--no-metrics`, no traces | {off:.2f} | 1.000 |")
        print(f"| metrics and console kept, not read | {med['metrics']:.2f} | "
              f"{med['metrics'] / off:.3f} |")
        print(f"| spans exported (`--no-metrics --otlp`), each call with a traceparent | "
              f"{med['traces']:.2f} | {med['traces'] / off:.3f} |")
        print(f"| on: metrics and console read every {a.scrape_interval} s, spans exported (`--otlp`) | "
              f"{med['on']:.2f} | {med['on'] / off:.3f} |")
    if a.only in (None, "probe"):
        rows = bench_probe(a.manifest, a.probe_rounds)
        print(f"\n`cordon probe -m {os.path.relpath(a.manifest, ROOT)} --tool T`, median of "
              f"{a.probe_rounds} runs\n")
        print("| tool | CPU s (user+sys) | wall s | exit |")
        print("|---|---:|---:|---|")
        for tool, cpu, wall, codes in rows:
            print(f"| {tool} | {cpu:.3f} | {wall:.2f} | {','.join(map(str, codes))} |")
        total = sum(r[1] for r in rows)
        print(f"| all ({len(rows)} tools) | {total:.3f} | | |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
