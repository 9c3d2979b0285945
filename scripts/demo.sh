#!/usr/bin/env bash
# Set up a fresh machine and run cordon's main job on the bundled example
# manifest: validate it, show what this host can enforce, then run each
# example tool on bundled untrusted input inside its P1 jail, and a P2 tool
# whose root is an OCI image built and loaded here (examples/images.yaml), the
# same image as a P3 microVM (examples/microvm.yaml), a P3 browser under
# gVisor (examples/browse.yaml) and on a microVM (examples/browse-microvm.yaml),
# an agent's MCP session, and the P2
# `jira_search` of examples/jira.yaml: an MCP server image built and loaded
# here, pinned by digest, whose token is minted per session and substituted
# at the egress door on its one API (a local HTTPS stand-in).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build -q --bin cordon
cordon=${CARGO_TARGET_DIR:-target}/debug/cordon
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
  echo "== P3: the seed's browse as written, on a microVM (examples/browse-microvm.yaml): an image holding"
  echo "   Chromium, a guest kernel per task restored from a template, twice: no cookie survives a task"
  echo "   (where KVM boots no guest, cordon doctor says why, QEMU emulates: about half a minute a page here)"
  bd=$(mktemp -d -t cordon-browse.XXXXXX)
  tests/images/build.sh chromium "$bd/layout" >/dev/null
  ref=$($cordon image load "$bd/layout" --name chromium)
  sed "s|chromium@sha256:DIGEST|$ref|" examples/browse-microvm.yaml > "$bd/browse-microvm.yaml"
  grep -qF "image: $ref" "$bd/browse-microvm.yaml"
  $cordon check -m "$bd/browse-microvm.yaml"
  for _ in 1 2; do
    echo http://news.example/ | CORDON_UPSTREAM_DNS=127.0.0.1:9 $cordon run browse -m "$bd/browse-microvm.yaml"
  done
  rm -rf "$bd"
  kill "$web"
else
  echo "(skipped: the demo's upstream binds port 80, which needs root)"
fi
echo "== an agent's MCP session through cordon serve (tools/list, tools/call)"
python3 scripts/mcp-demo.py --cordon $cordon
echo "== P2 jira_search (examples/jira.yaml): an MCP server image pinned by digest, one API, a token minted per session"
if [ "$(id -u)" -eq 0 ]; then
  jd=$(mktemp -d -t cordon-jira.XXXXXX)
  api=
  trap '[ -z "$api" ] || kill "$api" 2>/dev/null; rm -rf "$jd"' EXIT
  # The image: node and a small Jira MCP server (tests/images/files/jira-server.js).
  tests/images/build.sh jira-mcp "$jd/layout" >/dev/null
  ref=$($cordon image load "$jd/layout" --name jira-mcp)
  echo "loaded $ref"
  sed "s|jira-mcp@sha256:DIGEST|$ref|" examples/jira.yaml > "$jd/jira.yaml"
  grep -qF "image: $ref" "$jd/jira.yaml"
  # The API: a local HTTPS stand-in for jira.example:443 (the manifest pins
  # the name to 127.0.0.81), its certificate from a demo CA that cordon's
  # doors trust through SSL_CERT_FILE for this run only. The sandbox trusts
  # the session CA of the door that terminates its TLS.
  scripts/jira-standin.py certs "$jd"
  { [ -r /etc/ssl/certs/ca-certificates.crt ] && cat /etc/ssl/certs/ca-certificates.crt; cat "$jd/ca.pem"; } > "$jd/roots.pem"
  scripts/jira-standin.py serve "$jd" 127.0.0.81:443 &
  api=$!
  # Listening, or gone: waited for as long as a loaded host needs (60 s at most).
  up=
  for _ in $(seq 600); do
    if (exec 3<>/dev/tcp/127.0.0.81/443) 2>/dev/null; then up=1; break; fi
    kill -0 "$api" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$up" ] || { echo "demo: the jira stand-in did not listen on 127.0.0.81:443" >&2; exit 1; }
  # The provider file (mode 0600): an `exec` provider standing in for an IdP.
  (umask 077; cat > "$jd/providers.yaml" <<EOF
default: mint
providers:
  mint:
    type: exec
    command: ["$PWD/scripts/jira-standin.py", "mint", "$jd"]
    revoke: ["$PWD/scripts/jira-standin.py", "revoke", "$jd"]
EOF
  )
  $cordon check -m "$jd/jira.yaml" --providers "$jd/providers.yaml"
  echo "-- an agent's MCP session through cordon serve calls jira_search__search"
  out=$(SSL_CERT_FILE="$jd/roots.pem" CORDON_UPSTREAM_DNS=127.0.0.1:9 python3 scripts/mcp-demo.py \
    --cordon "$cordon" --manifest "$jd/jira.yaml" --providers "$jd/providers.yaml")
  echo "$out"
  kill "$api"; api=
  token=$(tail -n 1 "$jd/minted")
  echo "-- the token, from the stand-ins' own records (never from cordon or the sandbox)"
  echo "minted by the provider:         ${token:0:18}... (a fresh one per session)"
  echo "the API received:               $(grep -o 'Bearer .\{0,18\}' "$jd/received" | head -n 1)..."
  echo "the sandbox's server held:      $(grep -o 'cordon-ph-.\{0,8\}' <<<"$out" | head -n 1)... (a placeholder)"
  echo "revoked when the session ended: $(grep -c -xF "$token" "$jd/revoked") time(s)"
  grep -qF "Bearer $token" "$jd/received"
  grep -q "JIRA_TOKEN in this server: cordon-ph-" <<<"$out"
  if grep -qF "$token" <<<"$out"; then echo "the token reached the agent" >&2; exit 1; fi
  grep -qxF "$token" "$jd/revoked"
  echo "-- the session's audit records: mint, the doors (DNS, then HTTPS with injected=\"JIRA_TOKEN\"), revoke, the agent's call"
  session=$($cordon audit query --tool jira_search__search --since 5m | tail -n 1 | grep -o ' session="[^"]*"')
  $cordon audit query --since 5m | grep -F -- "$session"
else
  echo "(skipped: the demo's API stand-in binds port 443, which needs root)"
fi
echo "== the audit log of this run"
$cordon audit tail -n 5
