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
# --from-bos-steps), their texts must be equal (else exit 1), and each is timed from its first
# token to its last. run.c runs with OMP_NUM_THREADS=THREADS, pdserve at each TP size in TPS (one
# thread per rank). RUNS rounds alternate the programs; the table gives min/median/max tok/s
# and the ratio of medians to run.c.
# Env: RUNS (5), STEPS (256), THREADS (2), TPS ("1 2").
set -euo pipefail
source "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
runc=$1 ckpt=$2
tok=${3:-$( (ls "$(dirname "$ckpt")"/tok*.bin "$(dirname "$ckpt")"/tokenizer.bin 2>/dev/null || true) | head -1)}
[ -x "$runc" ] || { echo "$runc is not an executable" >&2; exit 2; }
[ -f "$ckpt" ] || { echo "$ckpt: no such checkpoint" >&2; exit 2; }
[ -n "$tok" ] || { echo "no tokenizer beside $ckpt: pass one" >&2; exit 2; }
runs=${RUNS:-5} steps=${STEPS:-256} threads=${THREADS:-2} tps=${TPS:-"1 2"}
bench_bin=${ENGINE_BENCH:-$root/build/bench/engine_bench}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The same text first: equal weights and greedy decoding must give equal tokens.
OMP_NUM_THREADS=$threads "$runc" "$ckpt" -z "$tok" -t 0 -n "$steps" >"$work/runc.txt" 2>/dev/null
"$pdserve" generate --model "$ckpt" --tokenizer "$tok" --prompt "" --max-tokens "$steps" \
  >"$work/pdserve.txt" 2>/dev/null
if ! diff <(sed -e 's/[[:space:]]*$//' "$work/runc.txt") <(sed -e 's/[[:space:]]*$//' "$work/pdserve.txt") >/dev/null; then
  echo "pdserve's greedy text differs from run.c's:" >&2
  diff <(cat "$work/runc.txt") <(cat "$work/pdserve.txt") | head -5 >&2
  exit 1
fi

for i in $(seq "$runs"); do
  OMP_NUM_THREADS=$threads "$runc" "$ckpt" -z "$tok" -t 0 -n "$steps" 2>&1 >/dev/null |
    sed -n 's/^achieved tok\/s: //p' >>"$work/runc.rates"
  # shellcheck disable=SC2086
  "$bench_bin" --models "$ckpt" --tp $tps --from-bos-steps "$steps" 2>/dev/null |
    awk '/tok\/s from BOS/ { print $2, $3 }' >>"$work/pdserve.rates"
done

# stats FILE: "min median max" of a column of numbers.
stats() { sort -g "$1" | awk '{ v[NR] = $1 } END { printf "%.1f %.1f %.1f", v[1], (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR] }'; }
read -r rmin rmed rmax <<<"$(stats "$work/runc.rates")"
echo "model: $ckpt ($(stat -c %s "$ckpt") bytes), $steps positions from BOS, $runs runs alternated, text equal"
printf '%-34s %10s %10s %10s %10s\n' program min median max "vs run.c"
printf '%-34s %10s %10s %10s %10s\n' "run.c (OMP_NUM_THREADS=$threads)" "$rmin" "$rmed" "$rmax" 1.00
for tp in $tps; do
  awk -v tp="$tp" '$1 == tp { print $2 }' "$work/pdserve.rates" >"$work/tp$tp"
  read -r pmin pmed pmax <<<"$(stats "$work/tp$tp")"
  printf '%-34s %10s %10s %10s %10.2f\n' "pdserve TP $tp ($tp thread(s))" "$pmin" "$pmed" "$pmax" \
    "$(awk -v a="$pmed" -v b="$rmed" 'BEGIN { print a / b }')"
done
