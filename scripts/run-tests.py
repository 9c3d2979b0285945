#!/usr/bin/env python3
"""Run the workspace's test binaries, several at a time.

`cargo test --workspace` runs one test binary after another; most of cordon's
binaries spend their time waiting on sandboxes, servers and guests, so two at
a time take far less wall time than one. This builds every test binary
(`cargo test --no-run`), then runs them JOBS at a time (default 2, or
CORDON_TEST_JOBS), each from its package's directory with the environment
`cargo test` gives it, the slowest known first (the durations of the last run
are kept in target/test-durations.json). Each binary's output is printed
whole when it ends, so outputs never interleave. The doc tests run too
(`cargo test --workspace --doc`). CORDON_TEST_ONLY=REGEX runs only the
binaries whose label matches (and no doc tests). Every failure is listed at the end and the
exit status is 1 if any binary failed.

    scripts/run-tests.py [ARGS passed to every test binary...]
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Slowest first when no durations are recorded yet (a fresh checkout):
# names of test targets, measured on a 2-core machine.
SLOW_FIRST = [
    "newcomer", "microvm", "import", "browser", "mcp_e2e", "add", "mcp_serve",
    "caps", "auth", "images", "gvisor", "cli", "properties", "mcp_servers",
]


def metadata() -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def build(packages: dict[str, str]) -> list[dict]:
    """Build every test binary; return one job per binary."""
    proc = subprocess.run(
        ["cargo", "test", "--workspace", "--no-run",
         "--message-format=json-render-diagnostics"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    jobs = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact":
            continue
        if not msg.get("profile", {}).get("test") or not msg.get("executable"):
            continue
        target = msg["target"]
        manifest = Path(msg["manifest_path"])
        name = packages.get(str(manifest), manifest.parent.name)
        kind = target["kind"][0]
        label = (
            f"{name} {target['src_path'].removeprefix(str(manifest.parent) + '/')}"
            if kind == "test" else f"{name} ({kind} {target['name']})"
        )
        jobs.append({
            "label": label,
            "key": f"{name}/{kind}/{target['name']}",
            "target": target["name"],
            "exe": msg["executable"],
            "cwd": str(manifest.parent),
            "pkg": name,
            "crate": target["name"].replace("-", "_"),
        })
    return jobs


def main() -> int:
    args = sys.argv[1:]
    jobs_n = int(os.environ.get("CORDON_TEST_JOBS", "2"))
    meta = metadata()
    packages = {p["manifest_path"]: p["name"] for p in meta["packages"]}
    durations_file = Path(meta["target_directory"]) / "test-durations.json"
    try:
        durations = json.loads(durations_file.read_text())
    except (OSError, ValueError):
        durations = {}
    jobs = build(packages)

    def rank(job):
        if job["key"] in durations:
            return -durations[job["key"]]
        if job["target"] in SLOW_FIRST:
            return -1000 + SLOW_FIRST.index(job["target"])
        return 0

    jobs.sort(key=rank)
    only = os.environ.get("CORDON_TEST_ONLY")
    if only:
        jobs = [j for j in jobs if re.search(only, j["label"])]
    else:
        jobs.append({"label": "doc tests", "key": "doc", "doc": True})
    lock = threading.Lock()
    failed = []
    passed = []
    pending = list(jobs)
    started = time.monotonic()

    def run(job):
        t0 = time.monotonic()
        if job.get("doc"):
            cmd = ["cargo", "test", "--workspace", "--doc", "--", *args]
            cwd, env = ROOT, os.environ
        else:
            cmd = [job["exe"], *args]
            cwd = job["cwd"]
            env = dict(os.environ)
            env.update({
                "CARGO_MANIFEST_DIR": job["cwd"],
                "CARGO_PKG_NAME": job["pkg"],
                "CARGO_CRATE_NAME": job["crate"],
            })
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              errors="replace")
        took = time.monotonic() - t0
        with lock:
            print(f"     Running {job['label']} ({job.get('exe', 'cargo test --doc')})")
            sys.stdout.write(proc.stdout)
            print(f"     {job['label']}: exit {proc.returncode} in {took:.1f} s", flush=True)
            durations[job["key"]] = round(took, 1)
            (failed if proc.returncode != 0 else passed).append(job["label"])

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
            run(job)

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs_n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        durations_file.write_text(json.dumps(durations, indent=1, sort_keys=True))
    except OSError:
        pass
    total = time.monotonic() - started
    print(f"== {len(passed)} test binaries passed, {len(failed)} failed, "
          f"{jobs_n} at a time, in {total:.0f} s")
    for label in failed:
        print(f"   FAILED: {label}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
