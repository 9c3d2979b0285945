#!/usr/bin/env python3
"""P2 image benchmark (not part of CI): same run, same image.

- `cordon exec --image IMG -- /bin/true` against `cordon exec -- /bin/true`
  on the host root (target: at most 1.1x) and against `crun run` of an OCI
  bundle of the same rootfs (target: faster);
- cordon's unpack of an image (first use) against `umoci unpack` of the
  same layout (target: at least as fast);
- the store's disk use against the sum of the layers.

Rounds are interleaved (one sample of every row per round), medians
reported. Run as root after `cargo build --release -p cordon`:

    python3 scripts/bench-images.py [--cordon target/release/cordon] [--rounds 100]

Needs umoci and crun (`apt-get install umoci crun`).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, check=True):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.decode()[-400:]}")
    return r


def timed(cmd, env):
    t = time.perf_counter()
    run(cmd, env)
    return time.perf_counter() - t


def du(path):
    out = run(["du", "-sb", path]).stdout.decode()
    return int(out.split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cordon", default=os.path.join(ROOT, "target/release/cordon"))
    ap.add_argument("--rounds", type=int, default=100)
    a = ap.parse_args()
    if shutil.which("umoci") is None:
        raise SystemExit("umoci is not installed (apt-get install umoci crun runc)")
    # crun when it runs here; Debian bookworm's crun 1.8 refuses a hybrid
    # cgroup host ("cgroups in hybrid mode not supported"), where runc
    # (the reference runtime) is the baseline instead.
    oci = None
    for cand in ("crun", "runc"):
        if shutil.which(cand):
            oci = cand
            break
    if oci is None:
        raise SystemExit("neither crun nor runc is installed (apt-get install crun runc)")
    work = tempfile.mkdtemp(prefix="cordon-bench-img-")
    os.chmod(work, 0o755)
    store = os.path.join(work, "store")
    env = dict(os.environ, CORDON_STORE=store, CORDON_AUDIT=os.path.join(work, "audit.jsonl"))
    build = os.path.join(ROOT, "tests/images/build.sh")
    npm = os.environ.get("CORDON_E2E_NPM", "/var/cache/cordon-e2e/npm")
    rows = {}
    try:
        lay = os.path.join(work, "busybox")
        run([build, "busybox", lay])
        ref = run([a.cordon, "image", "load", lay, "--name", "busybox"], env).stdout.decode().strip()
        run([a.cordon, "exec", "--image", ref, "--", "/bin/true"], env)  # unpack once
        # An OCI bundle of the same image for crun (umoci's runtime config,
        # the process set to /bin/true, no terminal).
        bundle = os.path.join(work, "bundle")
        run(["umoci", "unpack", "--image", lay + ":t", bundle])
        cfg_path = os.path.join(bundle, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg["process"]["args"] = ["/bin/true"]
        cfg["process"]["terminal"] = False
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        # crun when it works on this host, else runc.
        probe = run([oci, "run", "--bundle", bundle, f"cordon-bench-{os.getpid()}-probe"], check=False)
        if probe.returncode != 0 and oci == "crun" and shutil.which("runc"):
            print(f"crun cannot run here ({probe.stderr.decode().strip()}); runc is the baseline\n")
            oci = "runc"
        cases = {
            "cordon exec -- /bin/true (host root)": [a.cordon, "exec", "--", "/bin/true"],
            "cordon exec --image busybox -- /bin/true": [a.cordon, "exec", "--image", ref, "--", "/bin/true"],
            "OCI runtime run (bundle of the same rootfs) /bin/true": None,
        }
        samples = {k: [] for k in cases}
        n = 0
        for _ in range(5):
            for k, c in cases.items():
                if c:
                    run(c, env)
        for _ in range(a.rounds):
            for k, c in cases.items():
                if c is None:
                    n += 1
                    c = [oci, "run", "--bundle", bundle, f"cordon-bench-{os.getpid()}-{n}"]
                samples[k].append(timed(c, env))
        for k, v in samples.items():
            rows[k] = statistics.median(v) * 1000
        host = rows["cordon exec -- /bin/true (host root)"]
        image = rows["cordon exec --image busybox -- /bin/true"]
        crun = rows["OCI runtime run (bundle of the same rootfs) /bin/true"]
        print(f"## Start-up ({a.rounds} interleaved rounds, medians)\n")
        print("| method | median ms |\n|---|---:|")
        for k, v in rows.items():
            print(f"| {k} | {v:.2f} |")
        print(f"\nimage / host root: **{image / host:.2f}x** (target at most 1.1x); "
              f"image / {oci}: **{image / crun:.2f}x** (target below 1)\n")

        # Unpack throughput: the node MCP image, cordon's first use against
        # `umoci unpack` of the same layout, each from a cold store/dir.
        if os.path.isfile(os.path.join(npm, "node_modules/@modelcontextprotocol/server-everything/dist/index.js")):
            nlay = os.path.join(work, "node")
            run([build, "node-mcp", nlay, npm])
            nref = run([a.cordon, "image", "load", nlay, "--name", "node"], env).stdout.decode().strip()
            cordon_t, umoci_t = [], []
            digest = nref.split("@")[1].split(":")[1]
            for i in range(5):
                shutil.rmtree(os.path.join(store, "rootfs", digest), ignore_errors=True)
                t0 = time.perf_counter()
                run([a.cordon, "exec", "--image", nref, "--", "/usr/bin/node", "-e", "0"], env)
                t1 = time.perf_counter()
                run([a.cordon, "exec", "--image", nref, "--", "/usr/bin/node", "-e", "0"], env)
                t2 = time.perf_counter()
                cordon_t.append((t1 - t0) - (t2 - t1))
                d = os.path.join(work, f"u{i}")
                t0 = time.perf_counter()
                run(["umoci", "unpack", "--image", nlay + ":t", d])
                umoci_t.append(time.perf_counter() - t0)
                shutil.rmtree(d)
            size = du(os.path.join(store, "rootfs", digest))
            c, u = statistics.median(cordon_t), statistics.median(umoci_t)
            print("## Unpack (node + server-everything image, 5 cold runs, medians)\n")
            print("| method | seconds | MiB/s of unpacked tree |\n|---|---:|---:|")
            print(f"| cordon (first use: verify, unpack, diff_id, sync, marker) | {c:.2f} | {size / c / 2**20:.0f} |")
            print(f"| umoci unpack | {u:.2f} | {size / u / 2**20:.0f} |")
            print(f"\ncordon / umoci time: **{c / u:.2f}x** (target at most 1)\n")
        layers = 0
        for rec in json.loads(run([a.cordon, "image", "ls", "--json"], env).stdout):
            layers += sum(l["size"] for l in rec["layers"])
        blobs = du(os.path.join(store, "blobs"))
        rootfs = du(os.path.join(store, "rootfs"))
        print("## Store disk use\n")
        print(f"layers (compressed, as pulled): {layers} bytes; blobs directory: {blobs} bytes "
              f"({blobs / layers:.2f}x, the manifests and configs included); "
              f"unpacked trees: {rootfs} bytes")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
