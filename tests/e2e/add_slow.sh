#!/usr/bin/env bash
# `cordon add` of markitdown-mcp (about 140 MB of wheels from the wheelhouse
# scripts/setup.sh fills; its install and its start take minutes on a
# loaded machine, so scripts/test.sh leaves it out): added offline, checked,
# served, and one HTML file the test mounts converted.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh
exec cargo test -p cordon --test add -- --ignored markitdown_is_added_checked_and_served
