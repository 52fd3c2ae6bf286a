# Helpers of the bench scripts that run a `pdserve up` cluster (chaos.sh, multiturn.sh,
# pull_host.sh, serving_compare.sh, tiers.sh), sourced after their `set -euo pipefail`: sets
# `root`, `pdserve` ($PDSERVE, else the build's) and PDSERVE_MODEL_PATH (unless set: the shared
# models beside the checkout).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pdserve=${PDSERVE:-$root/build/tools/pdserve}
if [ -z "${PDSERVE_MODEL_PATH:-}" ] && [ -d "$root/../shared/models" ]; then
  export PDSERVE_MODEL_PATH="$root/../shared/models"
fi
up_pid=""

# split_flags ARGS...: the `pdserve up` flags before `--` into the array `topology`, the bench
# flags after it into `bench`.
split_flags() {
  topology=() bench=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do topology+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  bench=("$@")
}

# start_up WORK NAME ARGS...: starts `$pdserve up ARGS` in the background (its output in
# WORK/up.out and WORK/up.err), waits for its READY line, and sets `up_pid`, `router` (gRPC) and
# `http`; exits with its errors and "NAME did not start" when it did not.
start_up() {
  local work=$1 name=$2
  shift 2
  : >"$work/up.out"  # Not the last run's READY line, whenever the child opens it.
  "$pdserve" up "$@" >"$work/up.out" 2>"$work/up.err" &
  up_pid=$!
  for _ in $(seq 600); do grep -q '^READY grpc=' "$work/up.out" && break; sleep 0.2; done
  router=$(sed -n 's/^READY grpc=\([^ ]*\).*/\1/p' "$work/up.out")
  http=$(sed -n 's/^READY .*http=\([^ ]*\).*/\1/p' "$work/up.out")
  [ -n "$router" ] || { cat "$work/up.err" >&2; echo "$name did not start" >&2; exit 1; }
}

# stop_up: stops the cluster start_up started, if any (SIGINT, as Ctrl-C would).
stop_up() {
  [ -n "$up_pid" ] && kill -INT "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null
  up_pid=""
}
