#!/usr/bin/env sh
# gpu_bench's own code on a tiny preset (ctest gpu_bench_emulated_smoke, with gpu_bench_emulated):
# passes when the run exits 0, prints a row of every kind, and no row reports an error.
#   bench/gpu_bench_smoke.sh GPU_BENCH
out=$("$1" --preset tiny --context 40 --batches 1,3 --prefill 20 --gemm-rows 1,9 --sampling-rows 1,2) || exit 1
echo "$out"
for kind in roofline model decode prefill breakdown sampling portable_gemm_bf16w; do
  echo "$out" | grep -q "\"kind\":\"$kind\"" || { echo "no $kind row"; exit 1; }
done
! echo "$out" | grep '"error":"[^"]'
