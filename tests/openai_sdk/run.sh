#!/usr/bin/env bash
# The OpenAI Node SDK test (openai_sdk_test.mjs) against a fresh `pdserve up` P/D cluster
# (1 prefill + 1 decode worker) on stories260K.
#
#   tests/openai_sdk/run.sh BIN_DIR OUT [KV_MODE]
#
# BIN_DIR holds pdserve and the worker/router binaries; KV_MODE is push (default) or pull. The
# pinned SDK is installed first if need be (scripts/reference-tools.sh tests/openai_sdk). The
# cluster's log goes to OUT/cluster.log; the router's warnings (ignored fields) are in it.
set -euo pipefail
bin=${1:?usage: run.sh BIN_DIR OUT [KV_MODE]}
out=${2:?usage: run.sh BIN_DIR OUT [KV_MODE]}
mode=${3:-push}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$here/../..
model=${MODEL:-$root/../shared/models/stories260K}
eval "$("$root/scripts/reference-tools.sh" tests/openai_sdk)"
mkdir -p "$out"
"$bin/pdserve" up --model "$model" --prefill 1 --decode 1 --port 0 --kv-mode "$mode" >"$out/ready.txt" 2>"$out/cluster.log" &
up_pid=$!
trap 'kill "$up_pid" 2>/dev/null; wait "$up_pid" 2>/dev/null || true' EXIT
ready=""
# The cluster's READY line, for at most 120 s (a process start, not a test's timing).
for _ in $(seq 1200); do
  ready=$(grep -m1 '^READY grpc=' "$out/ready.txt" || true)
  [[ -n $ready ]] && break
  kill -0 "$up_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $ready ]]; then
  echo "openai_sdk: the cluster did not become ready; its log:" >&2
  tail -50 "$out/cluster.log" >&2
  exit 1
fi
http=${ready##*http=}
http=${http%% *}
node "$here/openai_sdk_test.mjs" "http://$http" 2>&1 | tee "$out/openai_sdk.txt"
