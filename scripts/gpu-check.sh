#!/usr/bin/env bash
# The GPU checks as one command: gpu_backend_tests (every kernel against the CPU reference, and
# stories260K's greedy text on the GPU engine), scripts/cluster-check.sh (the GPU engine in
# process and a prefill + decode worker on the GPU behind the router give the CPU's tokens) and
# gpu_bench (8B-shape decode and prefill against the GPU's rooflines: H200, H100 SXM or MI355X
# by the device, ROOFLINE to name one), engine_bench (the whole engine on the GPU, synchronous and
# with --async-scheduling in one run), and kvtransfer_bench's small
# requests on the GPU machine's host (the copy and per-request overhead on a server's memory
# system, which the 2-vCPU development VM cannot show), results written to a directory.
#
# The GPU machine has the CUDA toolkit and a driver but none of the project's Debian packages
# (abseil, GTest, ...), so the programs are built here and travel as a bundle:
#   scripts/gpu-check.sh bundle        on the dev machine (Debian 12 + CUDA toolkit): builds the
#                                      programs for sm_90 and sm_100 and packs them, with the
#                                      shared libraries they need (UCX's transport modules too)
#                                      and the bundled model, into build-gpu-bundle/bundle.tar.gz
#                                      (gzip: the GPU machine may lack xz)
#   scripts/gpu-check.sh run OUT       on the GPU machine: unpacks the bundle (or, without one,
#                                      builds from source, which needs the packages) and writes
#                                      summary.txt, gpu_backend_tests.{log,xml}, cluster/ and
#                                      gpu_bench.{log,jsonl}, gpu_bench_f32.jsonl,
#                                      gpu_bench_attention.jsonl, engine_bench.{log,json} and
#                                      kvtransfer_bench.log into OUT; exits
#                                      non-zero if a check failed
#   scripts/gpu-check.sh rocm OUT      on an AMD machine with ROCm 7 (MI355X: gfx950; ROCM_ARCHS
#                                      to change) and the project's packages: builds from source
#                                      with -DPDSERVE_WITH_HIP=ON and runs the same checks on the
#                                      hip backend (docs/gpu.md, "Validating on AMD")
# Through the device tool: run(command="scripts/gpu-check.sh run $OUT", carry=["build-gpu-bundle"]).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-gpu}
bundle_dir=$root/build-gpu-bundle
targets=(gpu_backend_tests gpu_bench engine_bench kvtransfer_bench pdserve pdserve-prefill pdserve-decode pdserve-router)

# The vendor the checks run on: cuda (bundle, run) or hip (rocm).
vendor=cuda

configure_and_build() {
  if [ "$vendor" = hip ]; then
    cmake -S "$root" -B "$build" -G Ninja -DPDSERVE_WITH_HIP=ON \
      -DCMAKE_HIP_ARCHITECTURES="${ROCM_ARCHS:-gfx950}" >/dev/null || return 1
  else
    cmake -S "$root" -B "$build" -G Ninja -DPDSERVE_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90;100}" >/dev/null || return 1
  fi
  ninja -C "$build" -j"${JOBS:-$(nproc)}" "${targets[@]}"
}

cmd_bundle() {
  set -e
  configure_and_build
  local stage
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  mkdir -p "$stage/bin" "$stage/lib" "$stage/root" "$stage/shared/models"
  strip --strip-debug -o "$stage/bin/gpu_backend_tests" "$build/tests/gpu/gpu_backend_tests"
  strip --strip-debug -o "$stage/bin/gpu_bench" "$build/bench/gpu_bench"
  strip --strip-debug -o "$stage/bin/kvtransfer_bench" "$build/bench/kvtransfer_bench"
  strip --strip-debug -o "$stage/bin/engine_bench" "$build/bench/engine_bench"
  local program
  for program in pdserve pdserve-prefill pdserve-decode pdserve-router; do
    strip --strip-debug -o "$stage/bin/$program" "$(find "$build" -name "$program" -type f -perm -u+x | head -1)"
  done
  # The GPU backend library, which the engine loads when asked for a GPU (gpu_backend_tests
  # links it too).
  cp -L "$build/engine/backends/gpu/libpdserve_gpu_backend.so" "$stage/lib/"
  # UCX loads its transports (cma, ib, rdmacm) as modules at run time.
  mkdir -p "$stage/lib/ucx"
  cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0 "$stage/lib/ucx/"
  # Every shared library except the C/C++ runtime (newer on the GPU machine) and CUDA's own
  # (the GPU machine's toolkit and driver provide those).
  ldd "$stage/bin/"* "$stage/lib/ucx/"* | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so|ld-linux|libcuda|libcudart|libcublas|libnccl' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  cp -r "$root/../shared/models/stories260K" "$stage/shared/models/"
  mkdir -p "$bundle_dir"
  tar -C "$stage" -czf "$bundle_dir/bundle.tar.gz" .
  echo "bundle: $(du -h "$bundle_dir/bundle.tar.gz" | cut -f1) in $bundle_dir"
}

# Directories holding CUDA's runtime libraries on the GPU machine (toolkit, driver, or the
# nvidia-* Python wheels PyTorch brings).
cuda_lib_path() {
  local dirs=() d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64; do
    [ -d "$d" ] && dirs+=("$d")
  done
  # cuBLAS, and NCCL (which the toolkit may lack; PyTorch's nvidia-nccl wheel has it).
  while read -r lib; do dirs+=("$(dirname "$lib")"); done < <(
    find /usr/local /opt /usr/lib \( -name 'libcublas.so.13' -o -name 'libnccl.so.2' \) 2>/dev/null | head -6)
  (IFS=:; echo "${dirs[*]}")
}

cmd_run() {
  local out=${1:?usage: gpu-check.sh run OUT}
  mkdir -p "$out"
  local bin src_dir
  if [ "$vendor" = cuda ] && [ -f "$bundle_dir/bundle.tar.gz" ]; then
    local unpacked=/tmp/pdserve-gpu-bundle
    rm -rf "$unpacked" && mkdir -p "$unpacked" && tar -C "$unpacked" -xzf "$bundle_dir/bundle.tar.gz" || return 1
    bin=$unpacked/bin
    src_dir=$unpacked/root  # Tests read $PDSERVE_SOURCE_DIR/../shared/models.
    export LD_LIBRARY_PATH="$unpacked/lib:$(cuda_lib_path)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export UCX_MODULE_DIR=$unpacked/lib/ucx MODEL=$unpacked/shared/models/stories260K
  else
    echo "building from source (needs the project's packages)"
    configure_and_build || return 1
    bin=$build/bin-links && mkdir -p "$bin"
    ln -sf "$build/tests/gpu/gpu_backend_tests" "$build/bench/gpu_bench" "$build/bench/engine_bench" \
      "$build/bench/kvtransfer_bench" "$build/tools/pdserve" \
      "$build/prefill_worker/pdserve-prefill" "$build/decode_worker/pdserve-decode" "$build/router/pdserve-router" "$bin/"
    src_dir=$root
  fi
  local lib=${unpacked:+$unpacked/lib/}libpdserve_gpu_backend.so
  [ -n "${unpacked:-}" ] || lib=$build/engine/backends/gpu/libpdserve_gpu_backend.so
  {
    date -u
    if [ "$vendor" = hip ]; then
      rocm-smi --showproductname --showdriverversion 2>&1
      hipconfig --version 2>&1
      echo "--- device code in the GPU backend library (roc-obj-ls)"
      if command -v roc-obj-ls >/dev/null; then roc-obj-ls "$lib" 2>&1; else echo "roc-obj-ls not found"; fi
    else
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
      command -v nvcc >/dev/null && nvcc --version | tail -1
      echo "--- device code in the GPU backend library (cuobjdump --list-elf)"
      if command -v cuobjdump >/dev/null; then cuobjdump --list-elf "$lib" 2>&1; else echo "cuobjdump not found"; fi
    fi
    echo "--- shared libraries"
    ldd "$bin/gpu_backend_tests" "$bin/pdserve" 2>&1 | grep -E 'not found|cublas|nccl|cudart|amdhip|hipblas|rccl' || true
  } >"$out/summary.txt" 2>&1
  local status=0
  PDSERVE_SOURCE_DIR=$src_dir timeout 240 "$bin/gpu_backend_tests" --gtest_output="xml:$out/gpu_backend_tests.xml" \
    2>&1 | tee "$out/gpu_backend_tests.log" || status=1
  timeout 180 "$root/scripts/cluster-check.sh" "$bin" "$out/cluster" "$vendor" 2>&1 || status=1
  # The fractions are of this GPU's datasheet peaks (gpu_bench's first line names them): MI355X
  # on AMD, H100 SXM ("H100 80GB HBM3"), else H200; ROOFLINE overrides.
  local roofline=${ROOFLINE:-} gpu_name=""
  if [ -z "$roofline" ]; then
    roofline=h200
    if [ "$vendor" = hip ]; then
      roofline=mi355x
    else
      gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)
      case "$gpu_name" in *"H100 80GB HBM3"*) roofline=h100 ;; esac
    fi
  fi
  # First the targets' configuration (bf16 weights and KV) with both GEMM precisions, decode eager
  # and replaying graphs, sampling and the GEMMs; then the f32 baselines (f32 weights, f32 KV; bf16
  # weights with f32 KV). Rows are flushed as they come, so a run cut short keeps what it measured.
  timeout 180 "$bin/gpu_bench" --roofline "$roofline" --weights bf16 --kv-dtype bf16 --gemm exact,bf16 --graphs off,on \
    --out "$out/gpu_bench.jsonl" 2>&1 | tee "$out/gpu_bench.log" || status=1
  timeout 90 "$bin/gpu_bench" --roofline "$roofline" --only decode,prefill --weights f32,bf16 --kv-dtype f32 \
    --gemm exact --graphs off --out "$out/gpu_bench_f32.jsonl" 2>&1 | tee -a "$out/gpu_bench.log" || status=1
  # Prefill attention alone at 8K tokens, where the tensor-core kernel's target is set (the run
  # above times it at 512 and 2048).
  timeout 60 "$bin/gpu_bench" --roofline "$roofline" --only attention --prefill 8192 \
    --out "$out/gpu_bench_attention.jsonl" 2>&1 | tee -a "$out/gpu_bench.log" || status=1
  # The whole engine on the GPU, synchronous and with --async-scheduling in one run (their ratio
  # is R10's gain): stories260K, where the host's share of a step is largest.
  local model=${MODEL:-$root/../shared/models/stories260K}
  PDSERVE_MODEL_PATH=$(dirname "$model") timeout 120 "$bin/engine_bench" --models stories260K --tp 1 --device "$vendor" \
    --weight-dtype bf16 --async off,on --batches 1 8 32 --json "$out/engine_bench.json" 2>&1 | tee "$out/engine_bench.log" || status=1
  # Host memory only (UCX over shared memory between two processes); no ucx_perftest there.
  timeout 90 "$bin/kvtransfer_bench" --tokens 512 --reps 1 --small-reps 100 --no-perftest --pairs 1:1,4:8,8:4 \
    2>&1 | tee "$out/kvtransfer_bench.log" || status=1
  echo "tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$out/gpu_backend_tests.log" | tr '\n' ' ')" >>"$out/summary.txt"
  echo "cluster: $(tr '\n' ' ' <"$out/cluster/cluster_check.txt")" >>"$out/summary.txt"
  return $status
}

case "${1:-}" in
  bundle) cmd_bundle ;;
  run) shift; cmd_run "$@" ;;
  rocm) shift; vendor=hip; build=${BUILD_DIR:-$root/build-rocm}; cmd_run "$@" ;;
  *) sed -n '2,28p' "$0"; exit 2 ;;
esac
