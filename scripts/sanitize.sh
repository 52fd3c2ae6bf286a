#!/usr/bin/env bash
# The tests under sanitizers, in their own build trees (build-asan/, build-tsan/):
#   scripts/sanitize.sh asan   ASan + UBSan: the unit tests of every component and the router
#                              and worker integration tests (their worker processes sanitized too)
#   scripts/sanitize.sh tsan   TSan: the concurrency that does not run inside gRPC — the engine
#                              loop and its tiers' loader, the TP rank threads (barriers, all-reduce, the layer hook), the prefill/decode roles and KV ranks, admission, the parallel samples, the HTTP
#                              task queue, block release, kvtransfer sessions, KV events. (Suites built on
#                              gRPC servers report races inside Debian's uninstrumented libgrpc
#                              and Abseil; they need an instrumented gRPC first.)
# Every finding is fatal (-fno-sanitize-recover), so a race, an overflow or a leak fails the run.
# Not here: the GPU kernels on their CPU emulation (gpu_emulated_tests). Its threads are coroutines
# that switch stacks at every barrier, which ASan follows ~50x slower (GpuKernels.SamplingNarrowed*
# 3 s plain, 152 s under ASan; the kernel suites did not end in 20 min); they run in the plain
# test run instead, under the emulation's own checks (barriers every thread must reach, and each
# block's threads in reversed order).
# Uses the Debian packages setup.sh installs; JOBS (default: cores) as dev.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-$(nproc)}
mode=${1:?usage: $0 asan|tsan [gtest filter]}
filter=${2:-*}
"$root/scripts/setup.sh"
if [ -z "${PDSERVE_MODEL_PATH:-}" ] && [ -d "$root/../shared/models" ]; then
  export PDSERVE_MODEL_PATH="$root/../shared/models"
fi
export PDSERVE_SOURCE_DIR="$root" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
# UCX's own malloc/mmap hooks fight the sanitizers' interceptors.
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no
case "$mode" in
  asan)
    sanitize=address,undefined
    # Not FsKvTier's crash sweep (400 forked writers, each killed mid-write): ~14 s plain, minutes
    # under ASan, for no code that the other FsKvTier tests do not run here.
    tests=("tests/engine/engine_unit_tests|*:-FsKvTier.WritersKilledAnywhereLeaveOnlyWholeFiles" tests/tokenizer/tokenizer_unit_tests tests/model/model_unit_tests
           tests/kvtransfer/kvtransfer_unit_tests tests/kvtransfer/kvtransfer_session_unit_tests
           tests/transport/transport_unit_tests tests/serving/router_unit_tests tests/serving/worker_unit_tests
           tests/serving/router_integration_tests tests/serving/worker_integration_tests tests/tune/tune_unit_tests
           "tests/engine/engine_integration_tests|Preemption*:*PreemptionIdentity*:HostTier*:FsTier*:*AsyncScheduling*")
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:suppressions=$root/scripts/sanitizer/lsan.supp"
    export LSAN_OPTIONS="suppressions=$root/scripts/sanitizer/lsan.supp"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    ;;
  tsan)
    sanitize=thread
    tests=("tests/serving/router_unit_tests|RouterPolicy.*:AdmissionQueue.*:BoundedTaskQueue.*:RouterMetricsFormat.*:ApiKeys.*:ParallelSamples.*"
           "tests/serving/worker_unit_tests|EngineLoop.*:BlockRelease.*:KvRanksMemory.*:KvStaging*:PdWorkers.*:PdTopology.*:PdStaged.*:PdWorkerFaults.*"
           tests/kvtransfer/kvtransfer_session_unit_tests tests/kvtransfer/kvtransfer_unit_tests
           "tests/kvevents/kvevents_tests|KvIndexTest.*:KvIndexSlots.*:KvEvents.*:KvEventsFromTheEngine.*"
           "tests/engine/engine_unit_tests|FsKvTier.ConcurrentStoresAndLoadsStayExact:FsKvTier.Drops*:FsKvTier.Evicts*:SpinBarrier.*:SharedMemoryCommunicator.*:*ThreadTeam*:CpuThreads*"
           "tests/engine/engine_integration_tests|FsTier.*:*PublishedOutput.*:Engine.ARanksThreadsChangeNoToken:Handoff.*:*AsyncScheduling*tp2:*AsyncScheduling*tp4")
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/scripts/sanitizer/tsan.supp"
    ;;
  *) echo "usage: $0 asan|tsan [gtest filter]" >&2; exit 2 ;;
esac
build="$root/build-$mode"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDSERVE_WITH_CUDA=OFF \
  -DPDSERVE_SANITIZE="$sanitize" >/dev/null
# The test executables (an entry may name a gtest filter after '|'), and the binaries the
# integration tests start.
binaries=()
for t in "${tests[@]}"; do binaries+=("${t%%|*}"); done
ninja -C "$build" -j "$jobs" "${binaries[@]}" pdserve pdserve-prefill pdserve-decode pdserve-router
failed=()
for t in "${tests[@]}"; do
  bin=${t%%|*}
  only=$filter
  [ "$bin" != "$t" ] && [ "$filter" = "*" ] && only=${t#*|}
  echo "=== $mode: $bin ($only)" >&2
  (cd "$(dirname "$build/$bin")" && "$build/$bin" --gtest_filter="$only" --gtest_brief=1) || failed+=("$bin")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitize $mode: failed: ${failed[*]}" >&2
  exit 1
fi
echo "sanitize $mode: ${#tests[@]} suites clean" >&2
