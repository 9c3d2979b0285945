#!/usr/bin/env bash
# The pure cgroup v2 test bed: boot the guest that tests/vm/build.sh builds
# (and caches) under QEMU TCG, with this work tree shared in read-only at
# the same path, and run tests/vm/guest.sh in it: cordon's jail and CLI
# acceptance tests as root and as an unprivileged user with a systemd user
# manager, on pure cgroup v2 with systemd delegation. Slow under
# emulation (see the README's slow suites); not part of scripts/test.sh.
#
# usage: tests/vm/run.sh [STEP...]: only these steps of guest.sh (e.g.
# user_serve_node root_jail_tests), else all of them.
#
# Results: target/vm-results/<time>/ (summary, one log per step, the
# serial console); the summary's last line is "N passed, M failed", and
# the exit status is 0 only when every step passed.
#
# Needs root, qemu-system-x86 and what build.sh needs (scripts/setup-vm.sh).
# CORDON_VM_TIMEOUT (seconds, default 5400) bounds the whole boot.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
cache=${CORDON_VM_CACHE:-/var/cache/cordon-vm}
command -v qemu-system-x86_64 >/dev/null ||
  { echo "vm: qemu-system-x86_64 missing (scripts/setup-vm.sh installs it)" >&2; exit 1; }
start=$(date +%s)
tests/vm/build.sh

# The binaries the guest runs: cordon and the test binaries, built here.
echo "vm: build cordon and the test binaries"
cargo build -p cordon --bins
bins=$(cargo test -p cordon-jail --test jail -p cordon --test limits --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
')
out=$repo/target/vm-results/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"
chmod 777 "$out"
echo "$bins" >"$out/bins"
echo "$*" >"$out/only"

# TCG boots hang without the TSC rate: the host's, from the kernel log or
# /proc/cpuinfo.
mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Refined TSC clocksource calibration: \([0-9.]*\) MHz.*/\1/p' | tail -n1 || true)
[ -n "$mhz" ] || mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz processor.*/\1/p' | tail -n1 || true)
[ -n "$mhz" ] || mhz=$(sed -n 's/^cpu MHz[[:space:]]*: \([0-9.]*\)/\1/p' /proc/cpuinfo | head -n1)
khz=$(awk -v m="$mhz" 'BEGIN { printf "%d", m * 1000 }')
echo "vm: boot (tsc_early_khz=$khz), results in $out"
boot=$(date +%s)
# No network device: nothing leaves the guest. The root image is used
# copy-on-write (snapshot=on): the cached image is never changed.
set +e
nice -n 19 timeout "${CORDON_VM_TIMEOUT:-5400}" qemu-system-x86_64 \
  -machine q35 -accel tcg,thread=multi -cpu max -smp 2 -m 3072 \
  -display none -vga none -no-reboot -nic none \
  -serial "file:$out/console.log" \
  -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
  -append "root=/dev/vda rw quiet console=ttyS0 tsc_early_khz=$khz systemd.unified_cgroup_hierarchy=1 cordon.repo=$repo" \
  -drive "file=$cache/root.img,format=raw,if=virtio,snapshot=on" \
  -virtfs "local,path=$repo,mount_tag=repo,security_model=none,readonly=on" \
  -virtfs "local,path=$out,mount_tag=results,security_model=none"
qrc=$?
set -e
end=$(date +%s)
echo "vm: guest ran $((end - boot))s (all: $((end - start))s), qemu exit $qrc"
if [ ! -f "$out/summary" ]; then
  echo "vm: no results (see $out/console.log)" >&2
  tail -n 30 "$out/console.log" >&2 || true
  exit 1
fi
cat "$out/summary"
[ -s "$out/skips.log" ] && { echo "== skipped in the guest"; cat "$out/skips.log"; }
tail -n1 "$out/summary" | grep -q ' 0 failed$'
