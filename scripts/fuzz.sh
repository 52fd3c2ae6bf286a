#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in build-fuzz/, and runs each
# for SECONDS (default 30) over its committed seed corpus (fuzz/corpus/NAME; what it finds new
# goes to build-fuzz/fuzz/corpus/NAME). A crash, a leak, a sanitizer finding or a timeout fails.
#   scripts/fuzz.sh [SECONDS] [FUZZER...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-$(nproc)}
seconds=${1:-30}
shift $(( $# > 0 ? 1 : 0 ))
PDSERVE_FUZZ=1 "$root/scripts/setup.sh"
if [ -z "${PDSERVE_MODEL_PATH:-}" ] && [ -d "$root/../shared/models" ]; then
  export PDSERVE_MODEL_PATH="$root/../shared/models"
fi
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
build="$root/build-fuzz"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDSERVE_WITH_CUDA=OFF \
  -DPDSERVE_BUILD_TESTS=OFF -DPDSERVE_SANITIZE=address,undefined -DPDSERVE_BUILD_FUZZERS=ON \
  -DPDSERVE_FUZZ_SECONDS="$seconds" >/dev/null
fuzzers=("$@")
[ ${#fuzzers[@]} -gt 0 ] || mapfile -t fuzzers < <(cd "$root/fuzz" && ls fuzz_*.cc | sed 's/\.cc$//')
ninja -C "$build" -j "$jobs" "${fuzzers[@]}"
cd "$build" && ctest --output-on-failure -L fuzz -R "^($(IFS='|'; echo "${fuzzers[*]}"))\$"
