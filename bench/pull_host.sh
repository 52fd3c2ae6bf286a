#!/usr/bin/env bash
# pull_host: what --kv-mode pull-host buys over pull (docs/kv_offload.md), both arms in one run on
# the same topology and workload. In pull the prefill worker holds each prompt's device blocks
# until the decode worker has read them; in pull-host it copies them to its host tier and frees
# them at once, so a decode side slower to take requests than the prefill side makes them no
# longer pile up on the prefill worker's device. A sampler reads the router's metrics every
# 100 ms while the bench runs (the router polls the workers' Info; --poll-interval-ms). Each row:
# requests, failures, TTFT median / p90 and their ratio to pull, the device block-milliseconds the
# prefill worker held per request for its transfer after the prefill ended
# (pdserve:worker_transfer_held_block_seconds_total), its device KV usage (mean and peak of the
# samples, from pdserve:kv_cache_usage_perc: running prefills included) and its host-tier copies.
#   bench/pull_host.sh MODEL [pdserve up flags...] [-- bench flags...]
# Topology defaults to 1 prefill, 1 decode, a 3 MB device cache per rank (about four
# 512-token-prompt requests on stories260K) and a 64 MiB host tier; bench flags to 64 random
# requests of 512 prompt tokens and 64 output tokens, all at once.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model=${1:?usage: $0 MODEL [up flags] [-- bench flags]}
shift
split_flags "$@"
[ ${#topology[@]} -gt 0 ] || topology=(--prefill 1 --decode 1 --kv-cache-bytes 3000000 --host-kv-bytes 67108864)
[ ${#bench[@]} -gt 0 ] || bench=(--num-prompts 64 --input-len 512 --output-len 64 --ignore-eos)
work=$(mktemp -d)
sampler=""
stop() {
  [ -n "$sampler" ] && kill "$sampler" 2>/dev/null && wait "$sampler" 2>/dev/null
  sampler=""
  stop_up
}
trap 'stop; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

run() {  # MODE
  local mode=$1
  # Every prompt is prefilled on the prefill worker (no decode-local prefill): the arms differ in
  # how its KV moves.
  start_up "$work" "pull_host: $mode" --model "$model" --port 0 "${topology[@]}" --kv-mode "$mode" \
    --local-prefill-tokens 0
  : >"$work/$mode.usage"
  (while true; do
     curl -s "http://$http/metrics" | sed -n 's/^pdserve:kv_cache_usage_perc{.*role="prefill".*} \(.*\)$/\1/p' \
       >>"$work/$mode.usage" || true
     sleep 0.1
   done) &
  sampler=$!
  "$pdserve" bench --router "$router" --result-file "$work/$mode.json" "${bench[@]}" \
    >"$work/bench.out" 2>"$work/bench.err" || { cat "$work/bench.err" >&2; echo "pull_host: $mode: bench failed" >&2; }
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null || true
  sampler=""
  sleep 2  # Two health polls: the workers' counters reach the router.
  curl -s "http://$http/metrics" >"$work/$mode.metrics" || true
  stop
}

run pull
run pull-host
printf 'model %s; up %s; bench %s\n' "$model" "${topology[*]}" "${bench[*]}"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def metric(mode, name, label=""):
    total = 0.0
    for line in open(f"{work}/{mode}.metrics"):
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
rows = []
for mode in ("pull", "pull-host"):
    try:
        r = json.load(open(f"{work}/{mode}.json"))
    except OSError:
        print(f"{mode}: no result (its bench failed)")
        sys.exit(1)
    usage = [float(x) for x in open(f"{work}/{mode}.usage").read().split()]
    rows.append((mode, r, usage))
base = rows[0][1]
print("mode\tok\tfailed\tTTFT med/p90 ms\tTTFT med/pull\theld block-ms/request\tprefill device usage mean/peak\t"
      "host copies/fallbacks\ttok/s")
for mode, r, usage in rows:
    mean = sum(usage) / len(usage) if usage else float("nan")
    peak = max(usage) if usage else float("nan")
    ratio = r["median_ttft_ms"] / base["median_ttft_ms"] if base["median_ttft_ms"] > 0 else float("nan")
    copies = int(metric(mode, "pdserve:worker_host_copies_total", 'outcome="copied"'))
    fallbacks = int(metric(mode, "pdserve:worker_host_copies_total", 'outcome="fallback"'))
    held = metric(mode, "pdserve:worker_transfer_held_block_seconds_total") * 1000 / max(1, r["completed"])
    print(f'{mode}\t{r["completed"]}\t{r["failed"]}\t{r["median_ttft_ms"]:.1f} / {r["p90_ttft_ms"]:.1f}\t{ratio:.2f}\t'
          f'{held:.1f}\t{mean:.3f} / {peak:.3f} ({len(usage)} samples)\t{copies} / {fallbacks}\t'
          f'{r["output_throughput"]:.0f}')
PY
