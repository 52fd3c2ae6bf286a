#!/usr/bin/env bash
# CPU single-sequence decode, pdserve against llama2.c's run.c on the same checkpoint, in one run.
#
#   bench/cpu_vs_runc.sh RUN_C_BINARY CHECKPOINT [TOKENIZER]
#
# RUN_C_BINARY: run.c built outside this checkout (it never enters the repository), e.g. from a
# snapshot of karpathy/llama2.c: `gcc -Ofast -fopenmp -march=native run.c -lm -o run` (its
# Makefile's `runomp`). CHECKPOINT: a llama2.c .bin (stories260K, or one from
# build/bench/write_llama2c); TOKENIZER defaults to the tok*.bin / tokenizer.bin beside it.
# Both decode greedily from BOS over STEPS positions (run.c -t 0 -n STEPS; engine_bench
# --from-bos-steps), their texts must be equal in every configuration (else exit 1), and each is
# timed from its first token to its last (run.c's clock has millisecond ticks: ~2% on
# stories260K's ~50 ms). run.c runs with OMP_NUM_THREADS=THREADS; pdserve in each configuration
# TPxN of CONFIGS: TP ranks of N threads each (--tp, --cpu-threads). RUNS rounds alternate the
# programs; the table gives min/median/max tok/s and the ratio of medians to run.c.
# Env: RUNS (5), STEPS (256), THREADS (2), CONFIGS ("1x1 1x2 2x1").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
runc=$1 ckpt=$2
tok=${3:-$( (ls "$(dirname "$ckpt")"/tok*.bin "$(dirname "$ckpt")"/tokenizer.bin 2>/dev/null || true) | head -1)}
[ -x "$runc" ] || { echo "$runc is not an executable" >&2; exit 2; }
[ -f "$ckpt" ] || { echo "$ckpt: no such checkpoint" >&2; exit 2; }
[ -n "$tok" ] || { echo "no tokenizer beside $ckpt: pass one" >&2; exit 2; }
runs=${RUNS:-5} steps=${STEPS:-256} threads=${THREADS:-2} configs=${CONFIGS:-"1x1 1x2 2x1"}
for c in $configs; do
  [[ $c =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || { echo "CONFIGS: $c is not TPxTHREADS (e.g. 1x2)" >&2; exit 2; }
done
bench_bin=${ENGINE_BENCH:-$root/build/bench/engine_bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# fail WHAT LOG: the run's errors, then exit 1.
fail() { echo "$1 failed:" >&2; tail -n 20 "$2" >&2; exit 1; }

# The same text first: equal weights and greedy decoding must give equal tokens, in every configuration.
OMP_NUM_THREADS=$threads "$runc" "$ckpt" -z "$tok" -t 0 -n "$steps" >"$work/runc.txt" 2>"$work/err" ||
  fail "run.c" "$work/err"
for c in $configs; do
  tp=${c%x*} n=${c#*x}
  "$pdserve" generate --model "$ckpt" --tokenizer "$tok" --prompt "" --max-tokens "$steps" --tp "$tp" \
    --cpu-threads "$n" >"$work/pdserve.txt" 2>"$work/err" || fail "pdserve generate --tp $tp --cpu-threads $n" "$work/err"
  if ! diff <(sed -e 's/[[:space:]]*$//' "$work/runc.txt") <(sed -e 's/[[:space:]]*$//' "$work/pdserve.txt") >/dev/null; then
    echo "pdserve's greedy text at TP $tp, $n thread(s) a rank differs from run.c's:" >&2
    diff "$work/runc.txt" "$work/pdserve.txt" | head -5 >&2 || true
    exit 1
  fi
done

for i in $(seq "$runs"); do
  OMP_NUM_THREADS=$threads "$runc" "$ckpt" -z "$tok" -t 0 -n "$steps" 2>"$work/err" >/dev/null || fail "run.c" "$work/err"
  sed -n 's/^achieved tok\/s: //p' "$work/err" >>"$work/runc.rates"
  for c in $configs; do
    "$bench_bin" --models "$ckpt" --tp "${c%x*}" --cpu-threads "${c#*x}" --from-bos-steps "$steps" >"$work/out" \
      2>"$work/err" || fail "engine_bench" "$work/err"
    # "<model> <tp> <threads> <tok/s> tok/s from BOS (<n> tokens)", counted from the end (paths may hold spaces).
    awk '/tok\/s from BOS/ { print $(NF - 7) "x" $(NF - 6), $(NF - 5) }' "$work/out" >>"$work/pdserve.rates"
  done
done

# stats FILE: "min median max" of a column of numbers.
stats() { sort -g "$1" | awk '{ v[NR] = $1 } END { printf "%.1f %.1f %.1f", v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR] }'; }
read -r rmin rmed rmax <<<"$(stats "$work/runc.rates")"
echo "model: $ckpt ($(stat -c %s "$ckpt") bytes), $steps positions from BOS, $runs runs alternated, texts equal"
printf '%-34s %10s %10s %10s %10s\n' program min median max "vs run.c"
printf '%-34s %10s %10s %10s %10s\n' "run.c (OMP_NUM_THREADS=$threads)" "$rmin" "$rmed" "$rmax" 1.00
for c in $configs; do
  awk -v c="$c" '$1 == c { print $2 }' "$work/pdserve.rates" >"$work/rates-$c"
  read -r pmin pmed pmax <<<"$(stats "$work/rates-$c")"
  printf '%-34s %10s %10s %10s %10.2f\n' "pdserve TP ${c%x*} x ${c#*x} thread(s)" "$pmin" "$pmed" "$pmax" \
    "$(awk -v a="$pmed" -v b="$rmed" 'BEGIN { print a / b }')"
done
