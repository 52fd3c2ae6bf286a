#!/usr/bin/env bash
# chaos: a soak of the serving edge. `pdserve up` with 2 prefill + 2 decode workers serves
# `pdserve bench` rounds (greedy, --ignore-eos, each output checked against the in-process engine
# with --verify-model) for MINUTES minutes, while a random worker is SIGKILLed every KILL_EVERY
# seconds (`up` restarts it on its address; the router migrates what it was serving), and the
# router once half-way (`up` restarts it too; clients resend what failed UNAVAILABLE). At the
# end: requests sent, failed, resent, outputs unlike the in-process engine's, kills, migrations,
# and whether every block came back in every worker's pool (the host tiers' too), and how many file
# descriptors each worker gained over its life. Exit 0 only if nothing failed, every output was
# equal, no block leaked and no worker gained more than 64 descriptors.
#   bench/chaos.sh MODEL [MINUTES=30] [CONCURRENCY=16] [KILL_EVERY=20 (0: none)] [KV_MODE=push]
# CHAOS_UP_FLAGS adds `pdserve up` flags, e.g. a small device cache and a host tier, so that
# preemption and the tiers run under the kills:
#   CHAOS_UP_FLAGS="--kv-cache-bytes 3000000 --host-kv-bytes 67108864" bench/chaos.sh stories260K 5
# CHAOS_BENCH_FLAGS adds `pdserve bench` flags, e.g. clients that give up a fifth of their
# requests at random points ("--abort-fraction 0.2 --abort-within-ms 400": counted as abandoned).
# CHAOS_FAULTS=1 runs the workers built with injected kvtransfer faults
# (tests/serving/faulty_worker_main.cc: a random $PDSERVE_DROP_NOTIFICATIONS of the transfers'
# completion notifications, default 5 %, never leave; those transfers end at their lease).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
model=${1:?usage: $0 MODEL [MINUTES] [CONCURRENCY] [KILL_EVERY] [KV_MODE]}
minutes=${2:-30}
concurrency=${3:-16}
kill_every=${4:-20}
kv_mode=${5:-push}
work=$(mktemp -d)
# Its own copy of the binaries (`up` finds the others beside itself), so that a rebuild meanwhile
# cannot take a binary away from a restart.
mkdir -p "$work/bin" "$work/fds"
touch "$work/kills"
read -r -a up_flags <<<"${CHAOS_UP_FLAGS:-}"
build=$(dirname "$(dirname "$pdserve")")
for b in "$pdserve" "$build/prefill_worker/pdserve-prefill" "$build/decode_worker/pdserve-decode" "$build/router/pdserve-router"; do
  cp "$b" "$work/bin/"
done
if [ "${CHAOS_FAULTS:-0}" = 1 ]; then  # The faulty workers under the names `up` starts.
  ninja -C "$build" pdserve-prefill-faulty pdserve-decode-faulty >/dev/null
  cp "$build/tests/serving/pdserve-prefill-faulty" "$work/bin/pdserve-prefill"
  cp "$build/tests/serving/pdserve-decode-faulty" "$work/bin/pdserve-decode"
fi
read -r -a bench_flags <<<"${CHAOS_BENCH_FLAGS:-}"
pdserve="$work/bin/pdserve"
trap 'stop_up; rm -rf "$work"' EXIT

# Every prompt on a prefill worker (no decode-local prefill): their deaths are part of the chaos.
start_up "$work" "chaos: the cluster" --model "$model" --prefill 2 --decode 2 --kv-mode "$kv_mode" --port 0 \
  --local-prefill-tokens 0 "${up_flags[@]}"
echo "chaos: $model, $kv_mode, 2P+2D at $router, $minutes min, concurrency $concurrency, $([ "$kill_every" -gt 0 ] && echo "a kill every ${kill_every}s" || echo "no kills")${CHAOS_UP_FLAGS:+, up $CHAOS_UP_FLAGS}${CHAOS_BENCH_FLAGS:+, bench $CHAOS_BENCH_FLAGS}${CHAOS_FAULTS:+, faults $CHAOS_FAULTS}"

worker_pids() {  # The children of `up` that are workers.
  for p in $(cat "/proc/$up_pid/task/$up_pid/children"); do
    tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qE -- '--role (prefill|decode) ' && echo "$p"
  done
}
( # Every 2 s, each worker's open descriptors: a file per pid, first and latest count.
  while kill -0 "$up_pid" 2>/dev/null; do
    for p in $(worker_pids); do
      n=$(ls "/proc/$p/fd" 2>/dev/null | wc -l) || continue
      [ -s "$work/fds/$p" ] || echo "$n" >"$work/fds/$p"
      echo "$n" >"$work/fds/$p.last"
    done
    sleep 2
  done ) &
fd_sampler=$!

end=$(( $(date +%s) + minutes * 60 ))
kills=0
half=$(( $(date +%s) + minutes * 30 ))
( # The killer: a random worker (a child of `up` with --role prefill|decode) every kill_every s,
  # and once, half-way, the router (clients resend what it was serving: bench --retries).
  # KILL_EVERY=0: no kills (the other faults alone).
  router_killed=0
  while [ "$kill_every" -gt 0 ] && [ "$(date +%s)" -lt "$end" ]; do
    sleep "$kill_every"
    if [ "$router_killed" = 0 ] && [ "$(date +%s)" -ge "$half" ]; then
      for p in $(cat "/proc/$up_pid/task/$up_pid/children"); do
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q 'pdserve-router ' &&
          kill -9 "$p" 2>/dev/null && echo "kill router $p $(date +%s)" >>"$work/kills"
      done
      router_killed=1
      continue
    fi
    mapfile -t workers < <(worker_pids)
    [ ${#workers[@]} -gt 0 ] || continue
    victim=${workers[RANDOM % ${#workers[@]}]}
    kill -9 "$victim" 2>/dev/null && echo "kill $victim $(date +%s)" >>"$work/kills"
  done ) &
killer=$!

sent=0 failed=0 abandoned=0 mismatched=0 resent=0 migrations=0 round=0
while [ "$(date +%s)" -lt "$end" ]; do
  round=$((round + 1))
  "$pdserve" bench --router "$router" --num-prompts $((concurrency * 8)) --random-input-len 64 --random-output-len 128 \
    --random-range-ratio 0.5 --max-concurrency "$concurrency" --ignore-eos --seed "$round" --verify-model "$model" --retries 30 \
    "${bench_flags[@]}" --result-file "$work/round.json" >"$work/bench.out" 2>"$work/bench.err" || true
  if [ ! -s "$work/round.json" ]; then
    echo "chaos: round $round produced no result" >&2; tail -3 "$work/bench.err" >&2; failed=$((failed + concurrency * 8))
    continue
  fi
  read -r c f a m r g < <(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["completed"], j["failed"], j.get("abandoned", 0), j.get("mismatched", 0), j.get("retried", 0), j.get("migrations", 0))' "$work/round.json")
  sent=$((sent + c + f + a)) failed=$((failed + f)) abandoned=$((abandoned + a)) mismatched=$((mismatched + m)) resent=$((resent + r)) migrations=$((migrations + g))
  [ "$f" -gt 0 ] && grep -m1 'first failure' "$work/bench.err" >&2 || true
  if [ "$m" -gt 0 ]; then  # Kept for replay: prompts, both outputs, the router's request ids.
    grep -m1 'differs from the in-process engine' "$work/bench.err" >&2 || true
    cp "$work/round.json" "${CHAOS_KEEP:-${TMPDIR:-/tmp}}/chaos-mismatch-$$-$round.json"
  fi
  rm -f "$work/round.json"
done
wait "$killer" || true
kills=$(wc -l <"$work/kills" 2>/dev/null || echo 0)

# Every pool whole again: the router's gauges, once every worker is up and idle — within 90 s,
# past the 30 s transfer lease that frees what a lost notification left held.
leaked=unknown
for _ in $(seq 450); do
  metrics=$(curl -s "http://$http/metrics" || true)
  leaked=$(python3 - "$metrics" <<'PY'
import re, sys
m = sys.argv[1]
def gauge(name):
    return {w: float(v) for w, v in re.findall(name + r'\{worker="([^"]+)",role="[^"]+"\} (\S+)', m)}
def tier(name):
    return {w: float(v) for w, v in re.findall(name + r'\{worker="([^"]+)",role="[^"]+",tier="host"\} (\S+)', m)}
up, free, total = gauge("pdserve:worker_up"), gauge("pdserve:kv_cache_free_blocks"), gauge("pdserve:kv_cache_total_blocks")
host_free, host_total = tier("pdserve:worker_kv_tier_free_blocks"), tier("pdserve:worker_kv_tier_blocks")
if len(up) != 4 or any(v != 1 for v in up.values()): print("unsettled")
else: print(sum(total[w] - free[w] for w in total) + sum(host_total[w] - host_free.get(w, 0) for w in host_total))
PY
)
  [ "$leaked" = "0.0" ] && break
  sleep 0.2
done
sleep 3  # A last descriptor sample, idle.
kill "$fd_sampler" 2>/dev/null || true
fd_growth=0
for f in "$work"/fds/*.last; do
  [ -e "$f" ] || continue
  g=$(( $(cat "$f") - $(cat "${f%.last}") ))
  [ "$g" -gt "$fd_growth" ] && fd_growth=$g
done
restarts=$(grep -c 'restarting it' "$work/up.err" || true)
accounting=$(grep -c 'block-accounting bug' "$work/up.err" || true)
preemptions=$(python3 -c 'import re,sys; print(int(sum(float(v) for v in re.findall(r"^pdserve:worker_preemptions_total\{[^}]*\} (\S+)", sys.argv[1], re.M))))' "$metrics")
transfer_failures=$(python3 -c 'import re,sys; print(int(sum(float(v) for v in re.findall(r"^pdserve:worker_kv_transfer_failures_total\{[^}]*\} (\S+)", sys.argv[1], re.M))))' "$metrics")
printf 'requests\tfailed\tabandoned\tresent\tmismatched\tkills\trestarts\tmigrations\tpreemptions*\ttransfer failures*\tblocks not back\tblock-accounting errors\tmax fd growth\n'
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sent" "$failed" "$abandoned" "$resent" "$mismatched" "$kills" "$restarts" "$migrations" \
  "$preemptions" "$transfer_failures" "$leaked" "$accounting" "$fd_growth"
echo "(* by the workers alive at the end, since their start)"
if [ "$failed" -ne 0 ] || [ "$mismatched" -ne 0 ] || [ "$leaked" != "0.0" ] || [ "$accounting" -ne 0 ] || [ "$fd_growth" -gt 64 ]; then
  keep="${CHAOS_KEEP:-${TMPDIR:-/tmp}}/chaos-up-$$.log"
  cp "$work/up.err" "$keep" && echo "chaos: the cluster's log is kept in $keep" >&2
fi
[ "$failed" -eq 0 ] && [ "$mismatched" -eq 0 ] && [ "$leaked" = "0.0" ] && [ "$accounting" -eq 0 ] && [ "$fd_growth" -le 64 ]
