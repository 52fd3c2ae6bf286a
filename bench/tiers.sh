#!/usr/bin/env bash
# tiers: what the KV cache's tiers buy a multi-turn workload when the device cache is smaller than
# its working set (docs/kv_offload.md), arm by arm in one run. First an arm whose device cache
# holds everything (1 GiB per rank) measures the working set W (the KV blocks the router's index
# holds afterwards); then each arm restarts `pdserve up` with the device cache at a fraction of W,
# with and without the host tier (4 W) and the filesystem tier, and a last arm restarts on the
# warm directory of the one before. Each row: the servers' hit rate, its ratio to the full arm's,
# TTFT median / p90 for turns >= 2 and their ratio to the full arm's, and the workers' preemptions.
#   bench/tiers.sh MODEL [pdserve up topology flags...] [-- bench flags...]
# Topology defaults to one aggregated worker; bench flags to 64 sessions, 4 requests in flight.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model=${1:?usage: $0 MODEL [up flags] [-- bench flags]}
shift
split_flags "$@"
[ ${#topology[@]} -gt 0 ] || topology=(--aggregated 1)
# 64 open sessions, 4 requests in flight: the servers hold many histories between turns while
# computing few, the case a tier below the device cache is for.
[ ${#bench[@]} -gt 0 ] || bench=(--sessions 64 --max-inflight 4)
work=$(mktemp -d)
trap 'stop_up; rm -rf "$work"' EXIT

metric_sum() {  # NAME [count]: the sum of a router metric's samples, or their number
  python3 - "$1" "$work/metrics" "${2:-sum}" <<'PY'
import sys
name, path, what = sys.argv[1], sys.argv[2], sys.argv[3]
values = [float(l.rsplit(" ", 1)[1]) for l in open(path) if l.startswith(name + "{")]
print(len(values) if what == "count" else int(sum(values)))
PY
}

run() {  # ARM, then extra `pdserve up` flags
  local arm=$1; shift
  start_up "$work" "tiers: $arm" --model "$model" --port 0 "${topology[@]}" "$@"
  "$pdserve" bench --router "$router" --workload multiturn --ignore-eos --result-file "$work/$arm.json" \
    "${bench[@]}" >"$work/bench.out" 2>"$work/bench.err" ||
    { cat "$work/bench.err" >&2; echo "tiers: $arm: bench failed" >&2; }
  sleep 2  # Two health polls: the workers' counters reach the router.
  curl -s "http://$http/metrics" >"$work/metrics" || true
  echo "$(metric_sum pdserve:worker_preemptions_total)" >"$work/$arm.preemptions"
  if [ "$arm" = full ]; then
    metric_sum pdserve:kv_index_blocks >"$work/working_set"
    metric_sum pdserve:kv_cache_total_blocks >"$work/total_blocks"
    metric_sum pdserve:kv_cache_total_blocks count >"$work/workers"
  fi
  stop_up
}

full=$((1 << 30))
run full --kv-cache-bytes "$full"
ws=$(cat "$work/working_set")
total=$(cat "$work/total_blocks")
[ "$ws" -gt 0 ] || { echo "tiers: the full arm cached nothing" >&2; exit 1; }
workers=$(cat "$work/workers")
block=$((full * workers / total))  # Bytes per block per rank (every worker has the same geometry).
per_worker=$(( (ws + workers - 1) / workers ))  # Each worker's share of the working set, in blocks.
bytes() { echo $(( per_worker * block * $1 / 100 )); }  # PERCENT of W per rank
host=$((4 * per_worker * block))
arms=(full)
for pct in 50 25; do
  run "device-$pct" --kv-cache-bytes "$(bytes $pct)"; arms+=("device-$pct")
  run "device-$pct+host" --kv-cache-bytes "$(bytes $pct)" --host-kv-bytes "$host"; arms+=("device-$pct+host")
done
run "device-25+host+fs" --kv-cache-bytes "$(bytes 25)" --host-kv-bytes "$host" --kv-offload-dir "$work/kv"
arms+=("device-25+host+fs")
run "restart-warm-fs" --kv-cache-bytes "$(bytes 25)" --host-kv-bytes "$host" --kv-offload-dir "$work/kv"
arms+=("restart-warm-fs")
printf 'model %s; up %s; bench %s; working set %s blocks of %s bytes per rank\n' "$model" "${topology[*]}" \
  "${bench[*]}" "$ws" "$block"
python3 - "$work" "${arms[@]}" <<'PY'
import json, sys
work = sys.argv[1]
rows = [(arm, json.load(open(f"{work}/{arm}.json")), open(f"{work}/{arm}.preemptions").read().strip())
        for arm in sys.argv[2:]]
base = rows[0][1]["prefix_reuse"]
print("arm\tok\tfailed\thit\thit/full\tTTFT t>=2 med/p90 ms\tTTFT/full\tpreemptions")
for arm, r, pre in rows:
    p = r["prefix_reuse"]
    t2 = p["turn2plus"]
    hit = p["hit_rate"] / base["hit_rate"] if base["hit_rate"] > 0 else float("nan")
    ttft = t2["median_ttft_ms"] / base["turn2plus"]["median_ttft_ms"] if base["turn2plus"]["median_ttft_ms"] > 0 else float("nan")
    print(f'{arm}\t{r["completed"]}\t{r["failed"]}\t{p["hit_rate"]:.3f}\t{hit:.3f}\t'
          f'{t2["median_ttft_ms"]:.1f} / {t2["p90_ttft_ms"]:.1f}\t{ttft:.2f}\t{pre}')
PY
