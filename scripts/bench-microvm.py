#!/usr/bin/env python3
"""P3 on microVMs, same run (docs/benchmarks/microvm.md):

1. bare QEMU: cordon's launcher booting the guest kernel and initramfs
   directly, cold boot to result and snapshot restore to result
   (crates/vm-init/examples/vm-bench.rs, no broker, no jail);
2. through cordon (`cordon exec --runtime microvm --image`): a cold boot
   to result (`--boot cold`: no snapshot), the first call (the template is
   booted and snapshotted, then restored for the task) and every later
   call (a restore), `/bin/true` and a small real tool (`sha256sum` of
   1 MiB of stdin);
   And a served tool (`cordon serve --no-probe`, the MCP stdio door):
   the time `serve` takes to be ready, which makes the tool's template
   snapshot when it has none, then its first and second calls;
3. a pooled task (`lifetime: pool`) against a restored one, whole tasks
   timed on the host (crates/runtime/examples/pool-bench.rs; its
   hand-over-to-first-act figure reads the guest's clock, which drifts
   from the host's under TCG once the guest has waited in the pool, so it
   is not reported here);
4. QEMU's RSS, PSS and private memory per restored guest with 1, 4 and
   16 guests of one template running at once (a restore maps the
   template's RAM file privately: the pages a guest only reads are shared
   with every other guest of the template, in the page cache; the pages it
   writes are its own), and the template's files.

Run as root: `python3 scripts/bench-microvm.py [--rounds N] [--kvm] [--only served]`
(`CORDON_BIN` for another cordon binary; default target/debug/cordon).
The guests run under TCG unless `--kvm` (a host where KVM boots guests):
the table's KVM column is filled only there.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORDON = os.environ.get("CORDON_BIN", os.path.join(ROOT, "target/debug/cordon"))


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({p.returncode}): {p.stderr.decode()[-600:]}")
    return p.stdout.decode()


def timed(cmd, env, stdin=b""):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, input=stdin, capture_output=True, env=env)
    dt = (time.perf_counter() - t0) * 1e3
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} failed ({p.returncode}): {p.stderr.decode()[-600:]}")
    return dt, p.stdout


def qemu_pids(needle):
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("/usr/bin/qemu-system") and needle in cmd:
            out.append(int(pid))
    return out


def rss_pss(pid):
    """RSS, PSS and private (clean + dirty) memory of `pid`, MiB."""
    vals = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            m = re.match(r"(Rss|Pss|Private_Clean|Private_Dirty):\s+(\d+) kB", line)
            if m:
                vals[m.group(1)] = int(m.group(2)) / 1024
    return (vals.get("Rss", 0), vals.get("Pss", 0),
            vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0))


def ram_mapping(pid):
    """RSS, PSS and anonymous pages (the pages the guest wrote, copied on
    write) of the guest RAM file's mapping in QEMU `pid`, MiB; None
    without one. (Private_Dirty would count the file's own pages too
    while the template's writes are not yet written back.)"""
    cur, vals = None, {}
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = re.match(r"[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \d+\s*(.*)$", line)
            if head:
                cur = head.group(1).strip().endswith("/vm/ram")
                continue
            m = re.match(r"(Rss|Pss|Anonymous):\s+(\d+) kB", line)
            if cur and m:
                vals[m.group(1)] = vals.get(m.group(1), 0) + int(m.group(2)) / 1024
    if not vals:
        return None
    return vals.get("Rss", 0), vals.get("Pss", 0), vals.get("Anonymous", 0)


def allocated(path):
    st = os.stat(path)
    return st.st_size, st.st_blocks * 512


def mcp(proc, msg):
    """One JSON-RPC request (or notification) on a served cordon's stdio;
    the response's result for a request."""
    import json
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()
    if "id" not in msg:
        return None
    while True:
        line = proc.stdout.readline()
        if not line:
            sys.exit("cordon serve ended: " + proc.stderr.read().decode()[-600:])
        r = json.loads(line)
        if r.get("id") == msg["id"]:
            if "error" in r or r["result"].get("isError"):
                sys.exit(f"cordon serve: {r}")
            return r["result"]


def served(env, ref, tmp, store, rounds):
    """Per round, with no template in the store: `cordon serve` started
    until it answers `initialize` (it makes the template then), and its
    first and second `tools/call` of a `/bin/true` tool."""
    m = os.path.join(tmp, "served.yaml")
    with open(m, "w") as f:
        f.write("tools:\n  t:\n    profile: P3\n    runtime: microvm\n    accept: [kvm]\n"
                f"    image: {ref}\n    command: [/bin/true]\n    network: none\n"
                "    limits: {memory: 128M, cpu: 100%}\n")
    ready, first, second = [], [], []
    for i in range(rounds):
        shutil.rmtree(os.path.join(store, "vm", "snapshots"), ignore_errors=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen([CORDON, "serve", "-m", m, "--no-probe", "--no-metrics"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            mcp(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "bench", "version": "0"}}})
            ready.append((time.perf_counter() - t0) * 1e3)
            mcp(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            for n, out in ((2, first), (3, second)):
                t0 = time.perf_counter()
                mcp(proc, {"jsonrpc": "2.0", "id": n, "method": "tools/call",
                           "params": {"name": "t", "arguments": {}}})
                out.append((time.perf_counter() - t0) * 1e3)
        finally:
            proc.kill()
            proc.wait()
        print(f"served round {i}: ready {ready[-1]:.0f} ms, first call {first[-1]:.0f} ms, "
              f"second call {second[-1]:.0f} ms", flush=True)
    return ready, first, second


def served_rows(ready, first, second, bare_cold):
    """The served tool's table rows (medians), without their last `|`."""
    m = statistics.median
    return [
        f"| `cordon serve` ready (answers `initialize`), template made at its start | {m(ready):.0f} ms | {bare_cold:.0f} ms (bare cold boot) | {m(ready) / bare_cold:.2f}x",
        f"| a served tool's first call vs bare QEMU cold boot to result | {m(first):.0f} ms | {bare_cold:.0f} ms | {m(first) / bare_cold:.3f}x",
        f"| a served tool's second call vs bare QEMU cold boot to result | {m(second):.0f} ms | {bare_cold:.0f} ms | {m(second) / bare_cold:.3f}x",
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kvm", action="store_true")
    ap.add_argument("--only", choices=["served"],
                    help="the bare QEMU baseline and the served tool only")
    a = ap.parse_args()
    init = sh(["bash", os.path.join(ROOT, "scripts/build-vm-init.sh")]).strip()
    tmp = tempfile.mkdtemp(prefix="cordon-bench-vm-")
    os.chmod(tmp, 0o755)
    try:
        store = os.path.join(tmp, "store")
        sh([os.path.join(ROOT, "tests/images/build.sh"), "busybox", os.path.join(tmp, "layout")])
        env = dict(os.environ, CORDON_STORE=store, CORDON_AUDIT="/dev/null",
                   CORDON_VM_INIT=init, CORDON_VM_ACCEL="kvm" if a.kvm else "tcg")
        ref = sh([CORDON, "image", "load", os.path.join(tmp, "layout"), "--name", "busybox"],
                 env=env).strip()
        exe = [CORDON, "exec", "--runtime", "microvm", "--accept", "kvm", "--memory", "128M",
               "--cpu", "100%", "--image", ref, "--"]

        # 1. bare QEMU (the launcher alone): 256 MiB, as cordon's 128M tool's
        # guest (128 MiB + 96 for the guest kernel, rounded the same way).
        print("== bare QEMU (vm-bench)", flush=True)
        bench = ["cargo", "run", "-q", "--release", "-p", "cordon-vm-init", "--example",
                 "vm-bench", "--", init, str(a.rounds)] + (["kvm"] if a.kvm else [])
        out = sh(bench, cwd=ROOT)
        print(out, flush=True)
        med = out.strip().splitlines()[-1]
        bare_cold = float(re.search(r"cold result (\d+) ms", med).group(1))
        bare_restore = float(re.search(r"restore result (\d+) ms", med).group(1))

        m = statistics.median
        if a.only == "served":
            ready, first_s, second_s = served(env, ref, tmp, store, a.rounds)
            print()
            print(f"| what ({'KVM' if a.kvm else 'TCG'}, median of {a.rounds}) | cordon | baseline | ratio |")
            print("|---|---:|---:|---|")
            for row in served_rows(ready, first_s, second_s, bare_cold):
                print(row + " |")
            return

        # 2. through cordon, interleaved: a first call (template) and warm calls.
        print("== through cordon", flush=True)
        cold, first, warm_true, warm_tool = [], [], [], []
        exe_cold = exe[:4] + ["--boot", "cold"] + exe[4:]
        blob = os.urandom(1 << 20)
        for i in range(a.rounds):
            shutil.rmtree(os.path.join(store, "vm", "snapshots"), ignore_errors=True)
            dt, _ = timed(exe_cold + ["/bin/true"], env)
            cold.append(dt)
            dt, _ = timed(exe + ["/bin/true"], env)
            first.append(dt)
            dt, _ = timed(exe + ["/bin/true"], env)
            warm_true.append(dt)
            dt, out = timed(exe + ["/bin/busybox", "sha256sum"], env, blob)
            warm_tool.append(dt)
            print(f"round {i}: cold boot {cold[-1]:.0f} ms, first call {first[-1]:.0f} ms, warm /bin/true "
                  f"{warm_true[-1]:.0f} ms, warm sha256sum 1 MiB {warm_tool[-1]:.0f} ms",
                  flush=True)
        ready, first_s, second_s = served(env, ref, tmp, store, a.rounds)
        # Pools: a restored guest waiting for its task (the generic pool over
        # spawn), from the hand-over to the program's first act.
        hexd = ref.split("sha256:")[1]
        rootfs = os.path.join(store, "rootfs", hexd, "root")
        out = sh(["cargo", "run", "-q", "-p", "cordon-runtime", "--example", "pool-bench", "--",
                  str(a.rounds), "microvm", rootfs], cwd=ROOT, env=env)
        import json
        pool = json.loads(out.strip().splitlines()[-1])
        print("pool:", pool, flush=True)
        # 3. memory per restored guest, 1, 4 and 16 at once.
        mem, ram = {}, {}
        needle = os.path.join(store, "vm")
        for n in (1, 4, 16):
            procs = [subprocess.Popen(exe + ["/bin/sleep", "30"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for _ in range(n)]
            deadline = time.time() + 120
            while len(qemu_pids(needle)) < n and time.time() < deadline:
                time.sleep(0.5)
            time.sleep(5)  # every guest restored and running its task
            pids = qemu_pids(needle)
            vals = [rss_pss(p) for p in pids]
            mean = lambda i: statistics.mean(v[i] for v in vals) if vals else 0
            mem[n] = (len(pids), mean(0), mean(1), mean(2), sum(v[1] for v in vals))
            print(f"{n} guests: {len(pids)} QEMU, mean RSS {mem[n][1]:.1f} MiB, "
                  f"mean PSS {mem[n][2]:.1f} MiB, mean private {mem[n][3]:.1f} MiB, "
                  f"PSS of all {mem[n][4]:.1f} MiB", flush=True)
            maps = [m for m in (ram_mapping(p) for p in pids) if m]
            if maps:
                ram[n] = tuple(statistics.mean(m[i] for m in maps) for i in range(3))
                print(f"{n} guests: the guest RAM file's mapping, mean RSS {ram[n][0]:.1f} MiB, "
                      f"PSS {ram[n][1]:.1f} MiB, copied on write {ram[n][2]:.1f} MiB",
                      flush=True)
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            while qemu_pids(needle):
                time.sleep(0.2)

        snaps = os.path.join(store, "vm", "snapshots")
        files = {}
        for name in sorted(os.listdir(snaps)):
            ext = name.rsplit(".", 1)[-1]
            if ext in ("snap", "ram", "verified", "json") and not name.startswith("."):
                files[ext] = allocated(os.path.join(snaps, name))
        print("template files (apparent, allocated bytes):", files, flush=True)

        accel = "KVM" if a.kvm else "TCG"
        other = "TCG" if a.kvm else "KVM"
        print()
        print(f"| what ({accel}, median of {a.rounds}) | cordon | baseline | ratio | {other} |")
        print("|---|---:|---:|---|---|")
        print(f"| **cold boot to result: `cordon exec --boot cold` of `/bin/true` vs bare QEMU cold boot to result** | {m(cold):.0f} ms | {bare_cold:.0f} ms | **{m(cold) / bare_cold:.2f}x** (target 1.1x) | not measured |")
        print(f"| first call: first `cordon exec` of `/bin/true` (template boot + snapshot + restore) vs bare QEMU cold boot to result | {m(first):.0f} ms | {bare_cold:.0f} ms | {m(first) / bare_cold:.2f}x | not measured |")
        print(f"| warm `cordon exec` of `/bin/true` (restore) vs bare QEMU restore to result | {m(warm_true):.0f} ms | {bare_restore:.0f} ms | {m(warm_true) / bare_restore:.2f}x | not measured |")
        print(f"| restore to result vs cold boot to result, through cordon | {m(warm_true):.0f} ms | {bare_cold:.0f} ms (bare cold) | **{m(warm_true) / bare_cold:.3f}x** (target 0.1x) | not measured |")
        print(f"| restore to result vs cold boot to result, bare QEMU | {bare_restore:.0f} ms | {bare_cold:.0f} ms | {bare_restore / bare_cold:.3f}x | not measured |")
        print(f"| warm `cordon exec` of `busybox sha256sum` of 1 MiB | {m(warm_tool):.0f} ms | | | not measured |")
        for row in served_rows(ready, first_s, second_s, bare_cold):
            print(row + " | not measured |")
        for n, (k, rss, pss, priv, total) in mem.items():
            print(f"| {n} restored guests of one template at once ({k} QEMU seen): mean RSS / PSS / private per QEMU; PSS of all | {rss:.1f} / {pss:.1f} / {priv:.1f} MiB; {total:.0f} MiB | | | not measured |")
        for n, (rss, pss, dirty) in ram.items():
            print(f"| {n} guests: the guest RAM file's mapping per QEMU: RSS / PSS / copied on write | {rss:.1f} / {pss:.1f} / {dirty:.1f} MiB | | | not measured |")
        if "ram" in files and "snap" in files:
            print(f"| the template's files: device state; RAM file apparent / allocated | {files['snap'][0] / 1e3:.0f} KB; {files['ram'][0] / 2**20:.0f} / {files['ram'][1] / 2**20:.0f} MiB | | | not measured |")
        print(f"| a whole pooled task vs a whole restored one (runtime API, debug build) | {pool['pool_total_ms']:.0f} ms | {pool['cold_total_ms']:.0f} ms | {pool['pool_total_ms'] / pool['cold_total_ms']:.2f}x | not measured |")
        print(f"| an idle pooled guest: PSS of QEMU and the helper | {pool['idle_pooled_pss_mib']:.1f} MiB | | | not measured |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
