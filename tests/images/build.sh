#!/usr/bin/env bash
# Build a small OCI image layout with umoci (Debian's package), for the
# image tests and the demo. No registry, no daemon, nothing downloaded.
#
#   tests/images/build.sh busybox OUT_LAYOUT
#       busybox-static with sh/ls/id/cat/echo/wc/sleep links, its own
#       /etc/passwd; entrypoint /bin/sh.
#   tests/images/build.sh node-mcp OUT_LAYOUT NPM_DIR
#       node (with the shared libraries it links) and the reference MCP
#       server server-everything from NPM_DIR; entrypoint runs it on stdio.
#       Also /app/fetch-server.js (tests/images/files), a server with one
#       tool that fetches through the egress proxy door.
#   tests/images/build.sh chromium OUT_LAYOUT
#       Debian's Chromium (/usr/lib/chromium, scripts/setup.sh installs it)
#       with its libraries and fonts, and busybox; for the browse tool on a
#       microVM (examples/browse-microvm.yaml).
#   tests/images/build.sh jira-mcp OUT_LAYOUT
#       node (with its libraries) and /app/jira-server.js (tests/images/files),
#       a Jira-shaped MCP server on stdio; entrypoint runs it. No npm needed.
#
# The layout's only image is tagged `t`; `cordon image load OUT_LAYOUT
# --name NAME` prints its pinned reference.
set -euo pipefail
kind=$1 out=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tree=$work/tree
mkdir -p "$tree/etc" "$tree/bin"
echo 'root:x:0:0:root:/root:/bin/sh' > "$tree/etc/passwd"
echo 'root:x:0:' > "$tree/etc/group"
copy_with_libs() { # BINARY: the binary and every library it loads, at their own paths
  local b=$1
  mkdir -p "$tree$(dirname "$b")"
  cp -L "$b" "$tree$b"
  ldd "$b" | grep -oE '/[^ ]+' | while read -r lib; do
    mkdir -p "$tree$(dirname "$lib")"
    cp -L "$lib" "$tree$lib"
  done
}
case $kind in
  busybox)
    cp /bin/busybox "$tree/bin/busybox"
    for c in sh ls id cat echo wc sleep tr true wget; do ln -s busybox "$tree/bin/$c"; done
    entry=(--config.entrypoint /bin/sh)
    ;;
  node-mcp)
    npm=$3
    copy_with_libs "$(command -v node)"
    mkdir -p "$tree/app"
    cp -a "$npm/node_modules" "$tree/app/"
    cp "$(dirname "$0")/files/fetch-server.js" "$tree/app/"
    entry=(--config.entrypoint "$(command -v node)"
           --config.cmd /app/node_modules/@modelcontextprotocol/server-everything/dist/index.js
           --config.cmd stdio --config.workingdir /app --config.user 1000:1000
           --config.env NODE_ENV=production)
    ;;
  jira-mcp)
    copy_with_libs "$(command -v node)"
    mkdir -p "$tree/app"
    cp "$(dirname "$0")/files/jira-server.js" "$tree/app/"
    entry=(--config.entrypoint "$(command -v node)" --config.cmd /app/jira-server.js
           --config.workingdir /app --config.user 1000:1000 --config.env NODE_ENV=production)
    ;;
  chromium)
    # Debian's headless Chromium with every library it links or loads
    # (NSS's crypto modules are loaded at run time), its data, and the
    # fonts; busybox for the shell, sed and mktemp of the browse tool.
    cp /bin/busybox "$tree/bin/busybox"
    for c in sh sed mktemp cat echo; do ln -s busybox "$tree/bin/$c"; done
    mkdir -p "$tree/usr/lib"
    cp -a /usr/lib/chromium "$tree/usr/lib/"
    copy_with_libs /usr/lib/chromium/chromium
    copy_with_libs /usr/lib/chromium/chrome_crashpad_handler
    for lib in /usr/lib/x86_64-linux-gnu/lib{softokn3,freebl3,freeblpriv3,nssckbi}.so; do
      [ -e "$lib" ] && copy_with_libs "$lib"
    done
    for lib in /usr/lib/x86_64-linux-gnu/lib{softokn3,freebl3,freeblpriv3}.chk; do
      [ -e "$lib" ] && cp -L "$lib" "$tree$lib"
    done
    mkdir -p "$tree/usr/share" "$tree/etc"
    cp -a /usr/share/fonts "$tree/usr/share/"
    cp -a /etc/fonts "$tree/etc/"
    entry=(--config.entrypoint /usr/lib/chromium/chromium)
    ;;
  *) echo "build.sh: unknown image kind $kind" >&2; exit 2 ;;
esac
# Reproducible: fixed times everywhere, so the same inputs give the same
# digest (the example manifest pins the busybox image's).
epoch=2026-01-01T00:00:00Z
find "$tree" -exec touch -h -d "$epoch" {} +
rm -rf "$out"
umoci init --layout "$out"
umoci new --image "$out:t"
umoci unpack --rootless --image "$out:t" "$work/bundle" >/dev/null
cp -a "$tree/." "$work/bundle/rootfs/"
touch -h -d "$epoch" "$work/bundle/rootfs"
umoci repack --history.created "$epoch" --history.created_by "tests/images/build.sh $kind" --image "$out:t" "$work/bundle"
umoci config --history.created "$epoch" --history.created_by "tests/images/build.sh config" --created "$epoch" --image "$out:t" "${entry[@]}"
umoci gc --layout "$out"
