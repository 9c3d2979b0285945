#!/usr/bin/env python3
"""Time `cordon image load` of the busybox image, and the first call after it.

    python3 scripts/bench-load.py CORDON [CORDON...] [--rounds N]

Each CORDON binary (e.g. one built before a change and one after) loads
the layout `tests/images/build.sh busybox` builds into a fresh store, then
runs `cordon exec --image REF -- /bin/true` twice (the first call, then a
warm one). Rounds are interleaved across the binaries; medians are printed
as a Markdown table. Run as root (the exec needs the jail); needs umoci.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, env):
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.decode()}")
    return dt, p.stdout.decode().strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cordon", nargs="+")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cordon-bench-load-", dir="/var/tmp")
    os.chmod(work, 0o755)
    try:
        layout = os.path.join(work, "layout")
        subprocess.run([os.path.join(REPO, "tests/images/build.sh"), "busybox", layout],
                       check=True, stdout=subprocess.DEVNULL)
        rows = {c: {"load": [], "first": [], "warm": []} for c in a.cordon}
        for r in range(a.rounds):
            for c in a.cordon:
                store = os.path.join(work, f"store-{r}-{a.cordon.index(c)}")
                env = dict(os.environ, CORDON_STORE=store, CORDON_AUDIT="-")
                dt, ref = timed([c, "image", "load", layout, "--name", "busybox"], env)
                rows[c]["load"].append(dt)
                for k in ("first", "warm"):
                    dt, _ = timed([c, "exec", "--image", ref, "--", "/bin/true"], env)
                    rows[c][k].append(dt)
                shutil.rmtree(store)
        print("| binary | load ms | first call ms | warm call ms | load + first call ms |")
        print("|---|---:|---:|---:|---:|")
        for c in a.cordon:
            m = {k: statistics.median(v) * 1000 for k, v in rows[c].items()}
            print(f"| {c} | {m['load']:.1f} | {m['first']:.1f} | {m['warm']:.1f} | "
                  f"{m['load'] + m['first']:.1f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
