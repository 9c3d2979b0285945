# The checks tests/vm/guest.sh runs as root and as the user `cordon`
# (sourced; each takes the cordon binary first). Scratch files are named
# after the uid, so the two runs never share one.
t=/tmp/vm-$(id -u)

# doctor: delegated by the manager, cgroup limits usable, cgroup enforced.
doctor_delegated() {
  "$1" doctor >"$t-doctor.out" 2>&1
  cat "$t-doctor.out"
  grep -q '^ok   systemd delegation  *delegated at ' "$t-doctor.out" &&
    grep -q '^ok   cgroup limits usable' "$t-doctor.out" &&
    grep -q '^  cgroup: enforced' "$t-doctor.out"
}

# The typed outcomes, and the v2 files of a live slot.
limits_typed() {
  c=$1
  set -x
  "$c" exec --require cgroup -- /bin/true || return 1
  "$c" exec --wall 300 --memory 64M -- /usr/bin/python3 -c 'b = bytearray(512 << 20)' 2>"$t-mem.err"
  rc=$?
  cat "$t-mem.err"
  [ $rc -eq 12 ] && grep -q 'memory limit 64M exceeded (OOM kill)' "$t-mem.err" || return 1
  "$c" exec --wall 300 --tasks 8 -- /bin/sh -c 'for i in $(seq 40); do sleep 3 & done; wait' 2>"$t-tasks.err"
  rc=$?
  cat "$t-tasks.err"
  [ $rc -eq 13 ] && grep -q 'task limit 8 reached' "$t-tasks.err" || return 1
  # A sandbox that stays a while: its slot has the limits in its v2 files.
  "$c" exec --wall 300 --memory 96M --tasks 12 --cpu 50% -- /bin/sleep 20 &
  slot=
  i=0
  while [ -z "$slot" ] && [ $i -lt 120 ]; do
    sleep 1
    i=$((i + 1))
    for f in $(find /sys/fs/cgroup -path '*/cordon/*' -name memory.max 2>/dev/null); do
      [ "$(cat "$f")" = 100663296 ] && [ -n "$(cat "$(dirname "$f")/cgroup.procs")" ] && slot=$(dirname "$f")
    done
  done
  echo "slot: $slot"
  ok=0
  if [ -n "$slot" ]; then
    echo "memory.max $(cat "$slot/memory.max") memory.swap.max $(cat "$slot/memory.swap.max") pids.max $(cat "$slot/pids.max") cpu.max $(cat "$slot/cpu.max") procs $(cat "$slot/cgroup.procs" | wc -l)"
    [ "$(cat "$slot/pids.max")" = 12 ] && [ "$(cat "$slot/cpu.max")" = "50000 100000" ] &&
      [ "$(cat "$slot/memory.swap.max")" = 0 ] && ok=1
  fi
  wait
  [ $ok -eq 1 ]
}

# The resource probes in a P1 tool's sandbox: 8 of 8 held, memory by the
# cgroup.
probes_resource() {
  "$1" probe -m /tmp/probe.yaml --only resource >"$t-probe.out" 2>&1
  rc=$?
  cat "$t-probe.out"
  [ $rc -eq 0 ] && grep -q '^8 held, 0 escaped, 0 error, 0 skipped, 0 void' "$t-probe.out" &&
    grep -q 'memory limit 256M exceeded (OOM kill)' "$t-probe.out"
}

# cordon serve with a Node.js MCP server (a P2 tool that requires cgroup
# limits): one call answers, without warnings.
serve_node() {
  /usr/bin/python3 "$2/tests/vm/mcp_call.py" "$1" /tmp/node.yaml scratch__list_allowed_directories >"$t-serve.out" 2>&1
  rc=$?
  cat "$t-serve.out"
  [ $rc -eq 0 ] && grep -q '/tmp' "$t-serve.out" && ! grep -q 'cordon/warnings' "$t-serve.out"
}
