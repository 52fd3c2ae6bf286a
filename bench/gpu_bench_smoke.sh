#!/usr/bin/env sh
# gpu_bench's own code on a tiny preset (ctest gpu_bench_emulated_smoke, with gpu_bench_emulated):
# passes when the run exits 0, prints a row of every kind — decode and prefill rows with both KV
# dtypes and both GEMM precisions, decode rows eager and replaying graphs, both prefill attention
# kernels, every breakdown row with its kernel_calls_per_step — and no row reports an error; and
# when an option for a part --only leaves out, or --gemm without bf16 weights, is refused.
#   bench/gpu_bench_smoke.sh GPU_BENCH
out=$("$1" --preset tiny --context 40 --batches 1,3 --prefill 20 --gemm-rows 1,9 --sampling-rows 1,2) || exit 1
echo "$out"
for kind in roofline model decode prefill breakdown sampling portable_gemm_bf16w prefill_attention; do
  echo "$out" | grep -q "\"kind\":\"$kind\"" || { echo "no $kind row"; exit 1; }
done
for kernel in exact bf16_tensor_cores; do
  echo "$out" | grep -q "\"kind\":\"prefill_attention\",\"kernel\":\"$kernel\"" ||
    { echo "no prefill_attention row of the $kernel kernel"; exit 1; }
done
for gemm in exact bf16; do
  for kv in f32 bf16; do
    for kind in decode prefill; do
      echo "$out" | grep -q "\"kind\":\"$kind\",\"weights\":\"bf16\",\"gemm\":\"$gemm\",\"kv_dtype\":\"$kv\"" ||
        { echo "no $kind row with $gemm GEMMs and $kv KV"; exit 1; }
    done
  done
done
for graphs in false true; do
  echo "$out" | grep -q "\"kind\":\"decode\",\"weights\":\"bf16\",\"gemm\":\"bf16\",\"kv_dtype\":\"bf16\",\"graphs\":$graphs" ||
    { echo "no decode row with graphs $graphs"; exit 1; }
done
if echo "$out" | grep '"kind":"breakdown"' | grep -v '"kernel_calls_per_step":[1-9]'; then
  echo "a breakdown row without kernel_calls_per_step"
  exit 1
fi
! echo "$out" | grep '"error":"[^"]' || exit 1
if "$1" --only gemm --kv-dtype bf16 >/dev/null 2>&1; then
  echo "--kv-dtype with --only gemm was not refused"
  exit 1
fi
refusal=$("$1" --preset tiny --context 4 --batches 1 --only decode --weights f32 --gemm bf16 2>&1 >/dev/null) &&
  { echo "--gemm without bf16 weights was not refused"; exit 1; }
echo "$refusal" | grep -q -- "--gemm sets the bf16-weight rows' precision" ||
  { echo "--gemm without bf16 weights: unexpected refusal: $refusal"; exit 1; }
