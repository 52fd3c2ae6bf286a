#!/usr/bin/env bash
# The model on a compute backend gives the CPU's tokens — in process and through a P/D cluster.
#   scripts/cluster-check.sh BIN_DIR OUT [DEVICE]
# BIN_DIR holds pdserve, pdserve-prefill, pdserve-decode and pdserve-router; DEVICE (default
# cuda) is the backend under test, against `pdserve generate --device cpu`. Checks, one line
# each in OUT/cluster_check.txt (logs beside it):
#   bos        greedy from BOS on DEVICE equals the published stories260K text
#   inprocess  a prompt's greedy tokens on DEVICE equal the CPU's
#   push, pull 1 prefill + 1 decode worker on DEVICE behind the router give the CPU's tokens
#   mixed      prefill on DEVICE, decode on the CPU (a device arena meets a host one)
#   bf16kv     --kv-dtype bf16: the push cluster's tokens equal DEVICE's in process with the same
#              cache (bf16 blocks cross unchanged); on the CPU, that the CPU refuses a bf16 cache
# and records each cluster's pdserve:worker_info lines (backend, kv_memory). Exits non-zero if
# any check failed. CI runs it with DEVICE=cpu (ctest cluster_check_script) and emulated (the GPU
# backend on the CPU emulation of the GPU, ctest cluster_check_emulated); the GPU machine with
# cuda (scripts/gpu-check.sh run).
set -uo pipefail
bin=${1:?usage: cluster-check.sh BIN_DIR OUT [DEVICE]}
out=${2:?usage: cluster-check.sh BIN_DIR OUT [DEVICE]}
device=${3:-cuda}
root=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-$root/../shared/models/stories260K}
prompt="Once upon a time, there was a little dog named Max. Max liked to"
mkdir -p "$out"
report=$out/cluster_check.txt
: >"$report"
failed=0
pdserve=$bin/pdserve

check() {  # name, then a command that succeeds when the check passes
  local name=$1
  shift
  if "$@" >"$out/$name.log" 2>&1; then
    echo "PASS $name" | tee -a "$report"
  else
    echo "FAIL $name (see $name.log)" | tee -a "$report"
    failed=1
  fi
}

token_ids() { grep -o '"token_ids":\[[0-9,]*\]' "$1"; }

generate_json() {  # file, extra args...
  local file=$1
  shift
  timeout 120 "$pdserve" generate --model "$model" --prompt "$prompt" --max-tokens 64 --json "$@" >"$file"
}

check_bos() {
  timeout 120 "$pdserve" generate --model "$model" --device "$device" --prompt "" --max-tokens 256 >"$out/bos.txt" || return 1
  # $(...) drops trailing newlines: the published file ends with one the model did not generate.
  [ "$(cat "$out/bos.txt")" = "$(cat "$model/greedy_from_bos.txt")" ] || {
    diff "$out/bos.txt" "$model/greedy_from_bos.txt"
    return 1
  }
}

check_inprocess() {
  generate_json "$out/inprocess.json" --device "$device" || return 1
  echo "cpu:    $(token_ids "$out/reference.json")"
  echo "device: $(token_ids "$out/inprocess.json")"
  [ "$(token_ids "$out/reference.json")" = "$(token_ids "$out/inprocess.json")" ]
}

check_cpu_refuses_bf16_kv() {
  ! generate_json "$out/bf16kv.json" --device cpu --kv-dtype bf16 2>"$out/bf16kv.err" &&
    grep 'cannot keep its KV cache in bf16' "$out/bf16kv.err"
}

# Starts `pdserve up` with the given flags, generates through it, compares with the tokens in
# the reference file, stops it. The prompt is prefilled on the prefill worker
# (--local-prefill-tokens 0): the KV transfer is what is checked.
check_cluster() {  # name, reference file, up flags...
  local name=$1 reference=$2
  shift 2
  local ready_file=$out/$name.ready up_pid ready="" router http
  "$pdserve" up --model "$model" --prefill 1 --decode 1 --port 0 --local-prefill-tokens 0 "$@" >"$ready_file" \
    2>"$out/$name.cluster.log" &
  up_pid=$!
  for _ in $(seq 1200); do
    ready=$(grep -m1 '^READY grpc=' "$ready_file" || true)
    [ -n "$ready" ] && break
    kill -0 "$up_pid" 2>/dev/null || break
    sleep 0.1
  done
  local rc=1
  if [ -n "$ready" ]; then
    router=${ready#READY grpc=}
    router=${router%% *}
    http=${ready##*http=}
    generate_json "$out/$name.json" --router "$router" &&
      echo "reference: $(token_ids "$reference")" &&
      echo "cluster:   $(token_ids "$out/$name.json")" &&
      [ "$(token_ids "$reference")" = "$(token_ids "$out/$name.json")" ] && rc=0
    # The router polls workers for their gauges; give it a poll before reading them.
    sleep 1.5
    curl -s "http://$http/metrics" 2>/dev/null | grep -E '^pdserve:(worker_info|kv_staged_bytes_total)' ||
      echo "(no metrics: curl missing or router gone)"
  else
    echo "the cluster did not start; its log:"
    cat "$out/$name.cluster.log"
  fi
  kill -TERM "$up_pid" 2>/dev/null
  wait "$up_pid" 2>/dev/null
  return $rc
}

if ! generate_json "$out/reference.json" --device cpu 2>"$out/reference.log"; then
  echo "FAIL reference (the CPU run itself failed; see reference.log)" | tee -a "$report"
  exit 1
fi
check bos check_bos
check inprocess check_inprocess
cpu_ref=$out/reference.json
check push check_cluster push "$cpu_ref" --device "$device" --kv-mode push
check pull check_cluster pull "$cpu_ref" --device "$device" --kv-mode pull
check mixed check_cluster mixed "$cpu_ref" --prefill-device "$device" --decode-device cpu --kv-mode push
if [ "$device" = cpu ]; then
  check bf16kv check_cpu_refuses_bf16_kv
elif generate_json "$out/reference_bf16kv.json" --device "$device" --kv-dtype bf16 2>"$out/reference_bf16kv.log"; then
  check bf16kv check_cluster bf16kv "$out/reference_bf16kv.json" --device "$device" --kv-dtype bf16 --kv-mode push
else
  echo "FAIL bf16kv (the in-process bf16-KV run failed; see reference_bf16kv.log)" | tee -a "$report"
  failed=1
fi
exit $failed
