#!/usr/bin/env bash
# multiturn: what the prefix cache buys a multi-turn (or agentic) workload, arm by arm in one run:
# starts `pdserve up` for each arm in turn, drives it with `pdserve bench --workload WORKLOAD`,
# and prints one row per arm: the servers' hit rate, the single-cache oracle's, their ratio, TTFT
# median / p90 for turn 1 and for turns >= 2, and the turns >= 2 TTFT median of the cache-off arm
# divided by this arm's (the speed-up), the KV blocks moved (in all, and a request) and the
# prompts prefilled on their decode worker. Arms: cache-off; cache-load (the cache on, placement by
# load); cache-routed (placement by cache); and on P/D topologies cache-local (placement by cache
# and decode-local prefill at the default 512 tokens). The first three prefill every prompt on a
# prefill worker (--local-prefill-tokens 0).
#   bench/multiturn.sh MODEL [WORKLOAD=multiturn] [pdserve up topology flags...] [-- bench flags...]
# Topology defaults to 2 prefill + 2 decode workers, push; bench flags to the workload's defaults.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model=${1:?usage: $0 MODEL [WORKLOAD] [up flags] [-- bench flags]}
workload=${2:-multiturn}
shift $(( $# >= 2 ? 2 : 1 ))
split_flags "$@"
[ ${#topology[@]} -gt 0 ] || topology=(--prefill 2 --decode 2 --kv-mode push)
work=$(mktemp -d)
trap 'stop_up; rm -rf "$work"' EXIT

run() {  # ARM, then extra `pdserve up` flags
  local arm=$1; shift
  start_up "$work" "multiturn: $arm" --model "$model" --port 0 "${topology[@]}" "$@"
  "$pdserve" bench --router "$router" --workload "$workload" --ignore-eos --result-file "$work/$arm.json" \
    "${bench[@]}" >"$work/bench.out" 2>"$work/bench.err" ||
    { cat "$work/bench.err" >&2; echo "multiturn: $arm: bench failed" >&2; }
  stop_up
}

arms=(cache-off cache-load cache-routed)
pd=(--local-prefill-tokens 0)
case " ${topology[*]} " in *" --aggregated "*) pd=() ;; *) arms+=(cache-local) ;; esac
run cache-off --prefix-caching off "${pd[@]}"
run cache-load --prefix-caching on --placement load "${pd[@]}"
run cache-routed --prefix-caching on --placement cache "${pd[@]}"
[ ${#pd[@]} -eq 0 ] || run cache-local --prefix-caching on --placement cache
printf 'model %s; workload %s; up %s; bench %s\n' "$model" "$workload" "${topology[*]}" "${bench[*]}"
python3 - "$work" "${arms[@]}" <<'PY'
import json, sys
work = sys.argv[1]
rows = [(arm, json.load(open(f"{work}/{arm}.json"))) for arm in sys.argv[2:]]
base = rows[0][1]["prefix_reuse"]["turn2plus"]["median_ttft_ms"]
print("arm\tok\tfailed\thit\toracle\tefficiency\tTTFT t1 med/p90 ms\tTTFT t>=2 med/p90 ms\tt>=2 speed-up"
      "\tKV blocks moved (/req)\tdecode-local")
for arm, r in rows:
    p = r["prefix_reuse"]
    t1, t2 = p["turn1"], p["turn2plus"]
    eff = "-" if p["hit_efficiency"] is None else f'{p["hit_efficiency"]:.3f}'
    speed = base / t2["median_ttft_ms"] if t2["median_ttft_ms"] > 0 else float("nan")
    print(f'{arm}\t{r["completed"]}\t{r["failed"]}\t{p["hit_rate"]:.3f}\t{p["oracle_hit_rate"]:.3f}\t{eff}\t'
          f'{t1["median_ttft_ms"]:.1f} / {t1["p90_ttft_ms"]:.1f}\t{t2["median_ttft_ms"]:.1f} / {t2["p90_ttft_ms"]:.1f}\t'
          f'{speed:.2f}x\t{r["total_transferred_blocks"]} ({r["mean_transferred_blocks"]:.1f})\t'
          f'{r["decode_local_prefills"]}')
PY
