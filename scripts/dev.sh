#!/usr/bin/env bash
# The project's two quick-start jobs, each runnable on a fresh Debian 12 machine:
#   scripts/dev.sh run    set up, build, start a local P/D cluster on the bundled model
#                         (stories260K) and stream a completion through its router
#   scripts/dev.sh test   set up, build, and run every test (ctest)
# BUILD_DIR (default build/) and JOBS (default: cores) may be set; for `run` also PROMPT,
# PREFILL_TP and DECODE_TP (default 1), KV_MODE (push, pull or pull-host — which gives the
# workers a 64 MiB host KV tier; default push) and PORT (the
# router's gRPC port, HTTP on PORT + 1; default: any free one). Extra arguments go to
# `pdserve generate`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}

"$root/scripts/setup.sh"
# The bundled model lives in ../shared/models beside the checkout; a model named on the command
# line is looked up there first (then in the user cache, then downloaded).
if [ -z "${PDSERVE_MODEL_PATH:-}" ] && [ -d "$root/../shared/models" ]; then
  export PDSERVE_MODEL_PATH="$root/../shared/models"
fi
# Share ccache hits between checkouts in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
# The CUDA backend is built (and its tests registered; they skip without a GPU) wherever nvcc
# is installed, for the default architectures, as docs/gpu.md tells users to build it
# (PDSERVE_CUDA=0 turns it off).
gpu=(-DPDSERVE_WITH_CUDA=OFF)
if [ "${PDSERVE_CUDA:-1}" != 0 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  gpu=(-DPDSERVE_WITH_CUDA=ON)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${gpu[@]}" >/dev/null

case "${1:-}" in
  run)
    shift
    ninja -C "$build" -j "$jobs" pdserve pdserve-prefill pdserve-decode pdserve-router
    pdserve="$build/tools/pdserve"
    out="$build/dev-run.ready" log="$build/dev-run.log"
    # The cluster: one prefill and one decode worker with the KV cache moved between them, and
    # the router in front. `up` stops its workers and router on SIGTERM (they also die with it).
    # The demo's short prompt would be prefilled on the decode worker by default (decode-local
    # prefill, 512 tokens): LOCAL_PREFILL_TOKENS=0 keeps it on the prefill worker, so KV moves.
    "$pdserve" up --model stories260K --prefill 1 --prefill-tp "${PREFILL_TP:-1}" --decode 1 \
      --decode-tp "${DECODE_TP:-1}" --kv-mode "${KV_MODE:-push}" --port "${PORT:-0}" \
      --local-prefill-tokens "${LOCAL_PREFILL_TOKENS:-0}" \
      $([ "${KV_MODE:-push}" = pull-host ] && echo --host-kv-bytes 67108864) >"$out" 2>"$log" &
    up=$!
    stop_cluster() {
      if kill -0 "$up" 2>/dev/null; then
        kill -TERM "$up" 2>/dev/null || true
        wait "$up" 2>/dev/null || true
      fi
    }
    trap stop_cluster EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ready=""
    for _ in $(seq 1200); do  # Up to 2 minutes.
      ready=$(grep -m1 '^READY grpc=' "$out" || true)
      [ -n "$ready" ] && break
      if ! kill -0 "$up" 2>/dev/null; then
        # 0: `up` stopped on a signal; 130/143: SIGINT/SIGTERM came before it took them. Either
        # way Ctrl-C (or a kill) stopped it, and its children with it.
        rc=0
        wait "$up" || rc=$?
        case $rc in 0 | 130 | 143) echo "interrupted; the cluster is stopped" >&2; exit 130 ;; esac
        cat "$log" >&2
        echo "error: the cluster did not start (exit $rc; log: $log)" >&2
        exit 1
      fi
      sleep 0.1
    done
    if [ -z "$ready" ]; then
      echo "error: the cluster was not ready after 2 minutes (log: $log)" >&2
      exit 1
    fi
    router=${ready#READY grpc=}
    router=${router%% *}
    echo "cluster up: router gRPC $router, HTTP ${ready##*http=} (logs: $log)" >&2
    args=(--router "$router" --prompt "${PROMPT:-Once upon a time}")
    case " $* " in *" --max-tokens "* | *" --max-tokens="*) ;; *) args+=(--max-tokens 200) ;; esac
    "$pdserve" generate "${args[@]}" "$@"
    ;;
  test)
    ninja -C "$build" -j "$jobs"
    shift
    cd "$build" && ctest --output-on-failure -j "$jobs" "$@"
    ;;
  *)
    echo "usage: $0 run|test [extra args]" >&2
    exit 2
    ;;
esac
