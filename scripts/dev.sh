#!/usr/bin/env bash
# The project's two quick-start jobs, each runnable on a fresh Debian 12 machine:
#   scripts/dev.sh run    set up, build, and generate from the bundled model (stories260K)
#   scripts/dev.sh test   set up, build, and run every test (ctest)
# BUILD_DIR (default build/) and JOBS (default: cores) may be set.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

"$root/scripts/setup.sh"
# The bundled model lives in ../shared/models beside the checkout; a model named on the command
# line is looked up there first (then in the user cache, then downloaded).
if [ -z "${PDSERVE_MODEL_PATH:-}" ] && [ -d "$root/../shared/models" ]; then
  export PDSERVE_MODEL_PATH="$root/../shared/models"
fi
# Share ccache hits between checkouts in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

case "${1:-}" in
  run)
    ninja -C "$build" -j "$jobs" pdserve
    shift
    "$build/tools/pdserve" generate --model stories260K --prompt "${PROMPT:-Once upon a time}" --max-tokens 200 "$@"
    ;;
  test)
    ninja -C "$build" -j "$jobs"
    shift
    cd "$build" && ctest --output-on-failure -j "$jobs" "$@"
    ;;
  *)
    echo "usage: $0 run|test [extra args]" >&2
    exit 2
    ;;
esac
