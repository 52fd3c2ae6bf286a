#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy) on the given sources with build/'s compile commands, e.g.
#   scripts/tidy.sh common/wake_fd.cc kvtransfer/control/control_channel.cc
# Exit 1 when it reports anything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PDSERVE_BUILD_DIR:-$root/build}
[ -f "$build/compile_commands.json" ] || { echo "tidy: no $build/compile_commands.json (configure first)" >&2; exit 2; }
[ $# -gt 0 ] || { echo "usage: $0 FILE.cc..." >&2; exit 2; }
out=$(cd "$root" && clang-tidy -p "$build" --quiet "$@" 2>/dev/null || true)
if grep -qE '(warning|error):' <<<"$out"; then
  echo "$out"
  exit 1
fi
echo "tidy: $# file(s) clean"
