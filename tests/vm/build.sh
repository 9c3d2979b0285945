#!/usr/bin/env bash
# Build (once) and cache the pure cgroup v2 test bed that tests/vm/run.sh
# boots under QEMU: a Debian bookworm root file system made with debootstrap
# (systemd, dbus with a user bus, lingering user `cordon` uid 1000 so a
# systemd user manager runs for it, python3, nodejs, the reference MCP
# servers copied from /var/cache/cordon-e2e/npm), Debian's kernel and its
# initramfs from that root (linux-image-amd64 from bookworm-backports), in a raw ext4
# image. Nothing of cordon is in the image: run.sh shares the work tree in.
#
# Needs root, debootstrap and e2fsprogs (scripts/setup-vm.sh installs them),
# and the reference MCP servers (scripts/setup.sh). The mirror is the one of
# this host's apt sources (CORDON_VM_MIRROR overrides). The cache is
# CORDON_VM_CACHE (default /var/cache/cordon-vm); delete it to rebuild.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${CORDON_VM_CACHE:-/var/cache/cordon-vm}
npm_dir=${CORDON_E2E_NPM:-/var/cache/cordon-e2e/npm}
suite=bookworm
stamp="$cache/image.v3"
if [ -f "$stamp" ] && [ -f "$cache/root.img" ] && [ -f "$cache/vmlinuz" ] && [ -f "$cache/initrd.img" ]; then
  echo "vm: cached image in $cache"
  exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "vm: build needs root" >&2; exit 1; }
for t in debootstrap mkfs.ext4 chroot; do
  command -v "$t" >/dev/null || { echo "vm: $t missing (scripts/setup-vm.sh installs it)" >&2; exit 1; }
done
[ -f "$npm_dir/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js" ] ||
  { echo "vm: the reference MCP servers are not in $npm_dir (scripts/setup.sh installs them)" >&2; exit 1; }

mirror=${CORDON_VM_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -oE 'https?://[^ ]*/debian/?$' | head -n1 || true)
fi
[ -n "$mirror" ] || { echo "vm: no Debian mirror in this host's apt sources; set CORDON_VM_MIRROR" >&2; exit 1; }

mkdir -p "$cache"
root="$cache/rootfs"
start=$(date +%s)
if [ ! -f "$cache/rootfs.done" ]; then
  rm -rf "$root"
  echo "vm: debootstrap $suite from $mirror into $root"
  nice -n 19 debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,systemd-container,dbus,dbus-user-session,libpam-systemd,udev,kmod,linux-image-amd64,initramfs-tools,python3,nodejs,procps,util-linux,iproute2,busybox-static,ca-certificates \
    "$suite" "$root" "$mirror"
  touch "$cache/rootfs.done"
fi

# The kernel from bookworm-backports (6.12: Landlock ABI 6, a resettable
# memory.peak), Debian's linux-image-amd64 with its initramfs.
if [ ! -f "$cache/kernel.done" ]; then
  echo "vm: linux-image-amd64 from $suite-backports"
  echo "deb $mirror $suite-backports main" >"$root/etc/apt/sources.list.d/backports.list"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  for m in proc sys dev; do mount --bind "/$m" "$root/$m"; done
  trap 'for m in dev sys proc; do umount "$root/$m" 2>/dev/null || true; done' EXIT
  nice -n 19 chroot "$root" apt-get update -qq
  nice -n 19 chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends -t "$suite-backports" linux-image-amd64 >/dev/null
  for m in dev sys proc; do umount "$root/$m"; done
  trap - EXIT
  rm -f "$root/etc/resolv.conf"
  touch "$cache/kernel.done"
fi

echo "vm: configure the guest"
echo cordon-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost cordon-vm\n' >"$root/etc/hosts"
# No root password and no getty: the guest runs its one job and powers off.
chroot "$root" passwd -d root >/dev/null
chroot "$root" systemctl mask getty@tty1.service serial-getty@ttyS0.service >/dev/null 2>&1 || true
id_line=$(chroot "$root" getent passwd cordon || true)
[ -n "$id_line" ] || chroot "$root" useradd -m -u 1000 -s /bin/bash cordon
# The user manager gets the cpu controller too (Debian 12's user@.service
# delegates only memory and pids): the drop-in a host gives its users for
# cpu quotas in their own cgroups.
mkdir -p "$root/etc/systemd/system/user@.service.d"
printf '[Service]\nDelegate=pids memory cpu\n' >"$root/etc/systemd/system/user@.service.d/delegate.conf"
# Lingering: the user manager (and its D-Bus user bus) starts at boot.
mkdir -p "$root/var/lib/systemd/linger"
touch "$root/var/lib/systemd/linger/cordon"
# The reference MCP servers, where the tests look for them.
mkdir -p "$root/var/cache/cordon-e2e"
rm -rf "$root/var/cache/cordon-e2e/npm"
cp -a "$npm_dir" "$root/var/cache/cordon-e2e/npm"
chmod -R a+rX "$root/var/cache/cordon-e2e"
# The job: mount the shares named on the kernel command line and run
# tests/vm/guest.sh from the shared work tree.
cat >"$root/usr/local/sbin/cordon-vm-job" <<'EOF'
#!/bin/sh
set -u
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p" | tail -n1; }
repo=$(arg cordon.repo)
mkdir -p "$repo" /mnt/results
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,ro repo "$repo"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 results /mnt/results
sh "$repo/tests/vm/guest.sh" "$repo" /mnt/results >/mnt/results/guest.log 2>&1
echo "CORDON-VM-DONE rc=$?" >/dev/ttyS0
sync
systemctl poweroff --no-block
EOF
chmod 755 "$root/usr/local/sbin/cordon-vm-job"
cat >"$root/etc/systemd/system/cordon-vm-job.service" <<'EOF'
[Unit]
Description=cordon test bed job
After=multi-user.target user@1000.service
Wants=user@1000.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/cordon-vm-job
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF
chroot "$root" systemctl enable cordon-vm-job.service >/dev/null 2>&1
# 9p and virtio in the initramfs (root on virtio-blk; shares over 9p).
printf '9p\n9pnet\n9pnet_virtio\nvirtio_blk\nvirtio_pci\next4\n' >"$root/etc/initramfs-tools/modules"
kver=$(ls "$root/lib/modules" | sort -V | tail -n1)
nice -n 19 chroot "$root" update-initramfs -u -k "$kver" >/dev/null
cp "$root/boot/vmlinuz-$kver" "$cache/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$cache/initrd.img"

echo "vm: make the ext4 image"
rm -f "$cache/root.img.tmp"
nice -n 19 mkfs.ext4 -q -L cordon-root -d "$root" "$cache/root.img.tmp" 3G
mv "$cache/root.img.tmp" "$cache/root.img"
echo "$kver" >"$stamp"
echo "vm: built in $(( $(date +%s) - start ))s: kernel $kver, $(du -sh "$cache/root.img" | cut -f1) image in $cache"
