#!/usr/bin/env bash
# serving_compare: disaggregated (P/D) against aggregated serving on the same number of ranks, at
# equal load, in one run: starts `pdserve up` for each setup in turn, drives it with `pdserve
# bench`, and prints one table row per setup (TTFT and TPOT mean / median / p99, throughput, and
# from the router's timings TTFT minus the prefill's compute — the serving path's own cost — and
# the KV transfer).
#   bench/serving_compare.sh MODEL [TP] [extra pdserve bench flags]
# TP (default 2) is each P/D worker's TP; the aggregated baseline runs 2 workers of that TP, so
# both use 2*TP ranks. Bench flags default to 64 prompts of 128 in / 64 out, concurrency 8.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model=${1:?usage: $0 MODEL [TP] [bench flags]}
tp=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(--num-prompts 64 --random-input-len 128 --random-output-len 64 --max-concurrency 8)
work=$(mktemp -d)
trap 'stop_up; rm -rf "$work"' EXIT

run() {  # NAME, then `pdserve up` flags
  local name=$1; shift
  start_up "$work" "serving_compare: $name" --model "$model" --port 0 "$@"
  "$pdserve" bench --router "$router" --ignore-eos --num-warmups 2 "${flags[@]}" >"$work/bench.out" 2>"$work/bench.err" ||
    { cat "$work/bench.err" >&2; echo "serving_compare: $name: bench failed" >&2; }
  stop_up
  awk -F':' -v n="$name" '
    { gsub(/^ +| +$/, "", $2); v[$1] = $2 }
    END { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n, v["Successful requests"], v["Failed requests"],
            v["Mean TTFT (ms)"], v["Median TTFT (ms)"], v["P99 TTFT (ms)"],
            v["Mean/median TTFT minus prefill (ms)"], v["Mean/median KV transfer (ms)"], v["Mean TPOT (ms)"],
            v["Median TPOT (ms)"], v["P99 TPOT (ms)"], v["Output token throughput (tok/s)"] }' "$work/bench.out"
}

printf 'model %s; bench %s\n' "$model" "${flags[*]}"
printf 'setup\tok\tfailed\tTTFT mean\tmedian\tp99\tTTFT-prefill mean/med\tKV transfer mean/med\tTPOT mean\tmedian\tp99\tout tok/s\n'
run "aggregated-2xTP$tp" --aggregated 2 --tp "$tp"
# P/D arms prefill every prompt on the prefill worker (no decode-local prefill): the transfer is measured.
run "pd-push-TP$tp+TP$tp" --prefill 1 --prefill-tp "$tp" --decode 1 --decode-tp "$tp" --kv-mode push --local-prefill-tokens 0
run "pd-pull-TP$tp+TP$tp" --prefill 1 --prefill-tp "$tp" --decode 1 --decode-tp "$tp" --kv-mode pull --local-prefill-tokens 0
