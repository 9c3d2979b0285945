#!/usr/bin/env bash
# Set up a fresh machine and run cordon's main job on the bundled example
# manifest: validate it, show what this host can enforce, then run each
# example tool on bundled untrusted input inside its P1 jail, and a P2 tool
# whose root is an OCI image built and loaded here (examples/images.yaml), the
# same image as a P3 microVM (examples/microvm.yaml), and a P3 browser under
# gVisor (examples/browse.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build -q --bin cordon
cordon=target/debug/cordon
m=examples/cordon.yaml
echo "== cordon check"; $cordon check -m $m
echo "== pdf_to_text on examples/data/report.pdf"
$cordon run pdf_to_text -m $m < examples/data/report.pdf
echo "== word_count, with the run record"
echo "three small words" | $cordon run word_count -m $m --json
echo "== thumbnail on examples/data/screenshot.png"
$cordon run thumbnail -m $m < examples/data/screenshot.png > /tmp/cordon-thumb.png
file /tmp/cordon-thumb.png 2>/dev/null || ls -l /tmp/cordon-thumb.png
echo "== the conformance probes of each example tool (aimed at stand-ins when root)"
if [ "$(id -u)" -eq 0 ]; then
  scripts/probe-standins.sh $cordon probe -m $m --only escape | tail -n 4
else
  $cordon probe -m $m --only escape | tail -n 4
fi
echo "== P2 from an image: build it (umoci), load it into the store, run its tool"
img=$(mktemp -d)
tests/images/build.sh busybox "$img/busybox" >/dev/null
$cordon image load "$img/busybox" --name busybox
rm -rf "$img"
$cordon check -m examples/images.yaml
echo "an image is the root here" | $cordon run shout -m examples/images.yaml
echo "== P3 on a microVM (examples/microvm.yaml): the first call boots and snapshots a template, the second restores it"
scripts/build-vm-init.sh >/dev/null
$cordon check -m examples/microvm.yaml
for _ in 1 2; do
  echo "counted inside a microVM" | $cordon run guest_info -m examples/microvm.yaml
done
echo "== P3: headless Chromium under gVisor (examples/browse.yaml), twice: no cookie survives a task"
$cordon check -m examples/browse.yaml
# The page comes from a local upstream the example pins news.example to; no
# public name resolves (CORDON_UPSTREAM_DNS points at a closed port), so
# nothing the browser asks for leaves this machine.
if [ "$(id -u)" -eq 0 ]; then
  python3 -m http.server 80 --bind 127.0.0.80 --directory examples/data/web >/dev/null 2>&1 &
  web=$!
  sleep 0.5
  for _ in 1 2; do
    echo http://news.example/ | CORDON_UPSTREAM_DNS=127.0.0.1:9 $cordon run browse -m examples/browse.yaml
  done
  kill "$web"
else
  echo "(skipped: the demo's upstream binds port 80, which needs root)"
fi
echo "== an agent's MCP session through cordon serve (tools/list, tools/call)"
python3 scripts/mcp-demo.py --cordon $cordon
echo "== the audit log of this run"
$cordon audit tail -n 5
