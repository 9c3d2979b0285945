#!/bin/sh
# Runs inside the test bed booted by tests/vm/run.sh, as root from a system
# service (not a delegated cgroup): cordon's jail and CLI acceptance tests
# as root, and as the user `cordon` (uid 1000, lingering: a systemd user
# manager with a user bus) from a service of that user manager, on pure
# cgroup v2. Each step's output is in OUT/<step>.log; OUT/summary has one
# CORDON-VM-PASS or CORDON-VM-FAIL line per step and, last,
# "N passed, M failed".
#
# usage: guest.sh REPO OUT   (OUT/bins names the test binaries: `name path`;
# OUT/only, when not empty, the steps to run, the others are left out)
set -u
repo=$1
out=$2
# cordon on the guest's own disk, where an installed one would be, not
# read through the 9p share by every sandbox that runs it (the probe
# agent is this binary); bound over the shared one, which the CLI's test
# binaries name.
install -m 755 "$repo/target/debug/cordon" /usr/local/bin/cordon
mount --bind /usr/local/bin/cordon "$repo/target/debug/cordon"
cordon=/usr/local/bin/cordon
bin() { sed -n "s/^$1 //p" "$out/bins"; }
only=$(cat "$out/only" 2>/dev/null || true)
jail_tests=$(bin jail)
limits_tests=$(bin limits)
export HOME=/root CORDON_TEST_SKIP_LOG=$out/skips.log PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /tmp
pass=0
fail=0
mark() {
  echo "$1" >>"$out/summary"
  echo "$1" >/dev/ttyS0
}
# step NAME CMD...: run CMD, a command or a function of checks.sh (output
# in OUT/NAME.log), pass when it exits 0. run.sh bounds the whole boot.
step() {
  name=$1
  shift
  if [ -n "$only" ] && ! echo " $only " | grep -q " $name "; then
    return 0
  fi
  t0=$(date +%s)
  if "$@" >"$out/$name.log" 2>&1; then
    pass=$((pass + 1))
    mark "CORDON-VM-PASS $name ($(($(date +%s) - t0))s)"
  else
    fail=$((fail + 1))
    mark "CORDON-VM-FAIL $name ($(($(date +%s) - t0))s, see $name.log)"
  fi
}
# Run a command as the user `cordon`, in a service of its user manager (so
# that the user manager can move it into a scope of its own).
as_user() {
  runuser -u cordon -- env XDG_RUNTIME_DIR=/run/user/1000 \
    DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus \
    systemd-run --user --quiet --wait --pipe --collect --working-directory=/tmp \
    -E HOME=/home/cordon -E PATH=/usr/local/bin:/usr/bin:/bin "$@" </dev/null
}

{
  uname -a
  echo "cgroup: $(stat -fc %T /sys/fs/cgroup) controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  echo "own cgroup: $(cat /proc/self/cgroup)"
  echo "lsm: $(cat /sys/kernel/security/lsm 2>/dev/null)"
  systemctl --version | head -n1
  node --version
} >"$out/facts.log" 2>&1

i=0
while [ ! -S /run/user/1000/bus ] && [ $i -lt 120 ]; do
  sleep 1
  i=$((i + 1))
done

# The manifests: a P1 tool for the resource probes (a wall limit long
# enough for the memory and fork probes to meet their own limits under
# emulation), and a P2 Node.js MCP server that requires cgroup limits (no
# `accept:`; Node.js takes well over the default 20 s to initialize under
# emulation).
cat >/tmp/probe.yaml <<'EOF'
tools:
  echo:
    profile: P1
    command: [/bin/cat]
    limits: {memory: 256M, tasks: 32, wall_seconds: 90}
EOF
cat >/tmp/node.yaml <<'EOF'
tools:
  scratch:
    profile: P2
    network: none
    lifetime: session
    limits: {wall_seconds: 60, memory: 1G, tasks: 64}
    mounts: ["/var/cache/cordon-e2e/npm:/srv/npm"]
    mcp:
      command: ["/usr/bin/node", "/srv/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", "/tmp"]
      tools: {allow: [list_allowed_directories]}
      startup_seconds: 300
EOF
chmod 644 /tmp/probe.yaml /tmp/node.yaml

. "$repo/tests/vm/checks.sh"

# The user's case first (the one this bed exists for), then root's; the
# long test binaries last.
[ -n "$only" ] && mark "CORDON-VM-ONLY $only"
step root_doctor doctor_delegated "$cordon"
for c in doctor_delegated limits_typed probes_resource; do
  step "user_${c}" as_user /bin/sh -c ". $repo/tests/vm/checks.sh; $c $cordon"
done
step user_serve_node as_user /bin/sh -c ". $repo/tests/vm/checks.sh; serve_node $cordon $repo"
step root_limits_typed limits_typed "$cordon"
step root_probes_resource probes_resource "$cordon"
step root_serve_node serve_node "$cordon" "$repo"
# The jail's test bodies in-process as the user (their as_root/as_nobody
# wrappers need root; `::body` names the bodies only), then the whole
# suite as root (each body as root and, through setpriv, as uid 65534,
# which has no user manager: the fallback). The jail must use cgroup
# limits in the user's bodies and root's (CORDON_TEST_CGROUPS_REQUIRED),
# and nothing may skip but the one test made for hybrid hosts.
step user_jail_tests as_user -E CORDON_JAIL_TEST_CHILD=1 -E CORDON_TEST_CGROUPS_REQUIRED=1 \
  -E CORDON_TEST_SKIP_LOG=/tmp/user-skips.log \
  -E HOST_SECRET_TOKEN=s3cr3t-value-that-must-not-leak \
  "$jail_tests" --include-ignored --test-threads=1 ::body
step root_jail_tests env CORDON_TEST_CGROUPS_REQUIRED=1 "$jail_tests" --test-threads=1 \
  --skip shared_slots_of_different_layouts_never_overlap
step root_limits_tests "$limits_tests" --test-threads=1
[ -f /tmp/user-skips.log ] && sed 's/^/user: /' /tmp/user-skips.log >>"$out/skips.log"

# The guest kernel's log (OOM kills, hung tasks), for the steps' logs.
dmesg >"$out/dmesg.log" 2>&1
mark "$pass passed, $fail failed"
[ $fail -eq 0 ]
