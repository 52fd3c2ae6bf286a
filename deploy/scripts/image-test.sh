#!/usr/bin/env bash
# Containerised cluster test of the pdserve CPU image: a router, a prefill and a decode worker,
# each in its own container of the image (host network, read-only root file system with a tmpfs
# /tmp, UID 10001, the bundled model mounted read-only), the workers registering with the router.
# Then greedy generation through the router must equal in-process generation, BOS-only greedy
# output through the router must equal the published greedy_from_bos.txt, and an OpenAI
# completion over the router's HTTP port (curl from the host) must give the same text.
#
#   deploy/scripts/image-test.sh            # uses pdserve:cpu (PDSERVE_IMAGE=... for another)
#
# Exit 0: passed; 1: failed; 77: skipped (no Docker engine answers, or the image is absent).
# Run by hand it starts the private dockerd of image-build.sh when no engine answers (and stops it
# again) and builds the image when it is absent. Under ctest (PDSERVE_IMAGE_TEST_FROM_CTEST=1,
# set by deploy/docker/tests.cmake) it does neither, and skips instead, unless PDSERVE_IMAGE_TESTS=1.
#
# Environment: PDSERVE_IMAGE (pdserve:cpu), PDSERVE_MODELS_DIR (the folder holding stories260K/;
# default $PDSERVE_SOURCE_DIR/../shared/models, else <checkout>/../shared/models), BUILD_DIR (a host
# build whose tools/pdserve is compared too, when present; default <checkout>/build),
# PDSERVE_TEST_UCX_TLS (tcp: the containers share the host's name and boot id but not their IPC
# and PID namespaces, so UCX's shared-memory transports must stay off, as between two pods).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/image-lib.sh"

SKIP=77
IMAGE=${PDSERVE_IMAGE:-pdserve:cpu}
UCX_TLS_TEST=${PDSERVE_TEST_UCX_TLS:-tcp}
BUILD_DIR=${BUILD_DIR:-$PD_REPO_ROOT/build}
from_ctest=${PDSERVE_IMAGE_TEST_FROM_CTEST:-0}
may_act=1
[ "$from_ctest" = 1 ] && [ "${PDSERVE_IMAGE_TESTS:-0}" != 1 ] && may_act=0
PROMPT="Once upon a time"
MAX_TOKENS=64

skip() { echo "SKIPPED: $*"; exit $SKIP; }
fail() { echo "FAILED: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

if [ -n "${PDSERVE_MODELS_DIR:-}" ]; then
  models=$PDSERVE_MODELS_DIR
elif [ -n "${PDSERVE_SOURCE_DIR:-}" ] && [ -d "$PDSERVE_SOURCE_DIR/../shared/models" ]; then
  models=$PDSERVE_SOURCE_DIR/../shared/models
else
  models=$PD_REPO_ROOT/../shared/models
fi
[ -f "$models/stories260K/stories260K.bin" ] || fail "the bundled model is not at $models/stories260K (set PDSERVE_MODELS_DIR)"
models=$(cd "$models" && pwd)
MODEL=/models/stories260K/stories260K.bin

command -v curl >/dev/null || fail "curl is needed on the host"
# json FILE FILTER: a jq path (.a.b, .a[0].b, .a | length) of FILE, compact; text_json FILE: FILE's
# text without its trailing newlines, as a JSON string.
if command -v jq >/dev/null; then
  json() { jq -c "$2" "$1"; }
  text_json() { jq -Rsc 'sub("\\n+$"; "")' "$1"; }
elif command -v python3 >/dev/null; then
  json() { python3 - "$1" "$2" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
path, length = sys.argv[2], False
if path.endswith("| length"):
    path, length = path[:-len("| length")].strip(), True
for k in re.findall(r"[^.\[\]]+", path):
    d = d[int(k)] if k.isdigit() else d.get(k)
print(len(d) if length else json.dumps(d, separators=(",", ":"), ensure_ascii=False))
PY
  }
  text_json() { python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().rstrip("\n"), ensure_ascii=False))' "$1"; }
else
  fail "jq or python3 is needed on the host"
fi

t_start=$(now)
trap 'cleanup' EXIT
containers=()
cleanup() {
  local rc=$?
  if [ ${#containers[@]} -gt 0 ]; then
    if [ "$rc" != 0 ] && [ "$rc" != "$SKIP" ]; then
      for c in "${containers[@]}"; do
        echo "---- docker logs $c (last 30 lines)"; "$docker" logs --tail 30 "$c" 2>&1 || true
      done
    fi
    "$docker" rm -f "${containers[@]}" >/dev/null 2>&1 || true
  fi
  [ -n "${work:-}" ] && rm -rf "$work"
  pd_stop_dockerd
  exit "$rc"
}

# ---- the engine and the image
if ! pd_find_engine; then
  [ "$may_act" = 1 ] || skip "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-default}, nor $PD_WORKDIR/docker.sock); set PDSERVE_IMAGE_TESTS=1 to start one, or run deploy/scripts/image-build.sh --keep-daemon"
  pd_ensure_engine
fi
docker=$(pd_docker_client)
if ! pd_image_exists "$IMAGE"; then
  [ "$may_act" = 1 ] || skip "image $IMAGE is absent (build it with deploy/scripts/image-build.sh, or set PDSERVE_IMAGE_TESTS=1)"
  [ "$IMAGE" = pdserve:cpu ] || fail "image $IMAGE is absent"
  "$PD_SCRIPTS_DIR/image-build.sh"
fi
echo "engine: $("$docker" version --format '{{.Server.Version}}') at ${DOCKER_HOST:-the default socket}; image $IMAGE $("$docker" image inspect -f '{{.Id}} {{index .Config.Labels "org.opencontainers.image.version"}}' "$IMAGE")"

work=$(mktemp -d)
run_opts=(--network host --read-only --tmpfs /tmp:rw,size=64m --user 10001:10001
          -v "$models:/models:ro" -e "UCX_TLS=$UCX_TLS_TEST" -e PDSERVE_LOG_LEVEL=info)
name=pdserve-imagetest-$$

# ---- free ports on the host (host networking): distinct, nothing listening
used=" "
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    case "$used" in *" $p "*) continue ;; esac
    if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ] && ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      used="$used$p "; echo "$p"; return 0
    fi
  done
  fail "no free port found"
}
router_port=$(free_port); http_port=$(free_port); prefill_port=$(free_port); decode_port=$(free_port)

has_probe=0
if "$docker" run --rm "${run_opts[@]}" "$IMAGE" pdserve-prefill --help 2>/dev/null | grep -q -- '--probe-port'; then
  has_probe=1
  prefill_probe=$(free_port); decode_probe=$(free_port)
fi
echo "ports: router grpc $router_port http $http_port, prefill $prefill_port, decode $decode_port$([ $has_probe = 1 ] && echo ", probes $prefill_probe $decode_probe" || echo " (the image's workers have no --probe-port)")"

# ---- the cluster
t_cluster=$(now)
start() {  # start NAME PROGRAM ARGS...
  local n="$name-$1"; shift
  containers+=("$n")
  "$docker" run -d --name "$n" "${run_opts[@]}" "$IMAGE" "$@" >/dev/null
}
start router pdserve-router --model "$MODEL" --host 127.0.0.1 --port "$router_port" --http-port "$http_port" --kv-mode push
worker_args() {  # worker_args ROLE PORT PROBE
  echo --model "$MODEL" --host 127.0.0.1 --port "$2" --id "$1-0" \
    --router "127.0.0.1:$router_port" --advertise "127.0.0.1:$2"
  [ "$has_probe" = 1 ] && echo --probe-port "$3"
  return 0
}
# shellcheck disable=SC2046
start prefill pdserve-prefill $(worker_args prefill "$prefill_port" "${prefill_probe:-}")
# shellcheck disable=SC2046
start decode pdserve-decode $(worker_args decode "$decode_port" "${decode_probe:-}")

http_code() { curl -s -o "$work/body" -w '%{http_code}' --max-time 5 "$@" || true; }
wait_200() {  # wait_200 WHAT URL SECONDS
  local deadline=$(( $(date +%s) + $3 )) code
  while :; do
    code=$(http_code "$2")
    [ "$code" = 200 ] && return 0
    for c in "${containers[@]}"; do
      [ "$("$docker" inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" = true ] || fail "container $c exited while waiting for $1"
    done
    [ "$(date +%s)" -lt "$deadline" ] || fail "$1 ($2) is not 200 after $3 s (last: $code $(head -c 200 "$work/body" 2>/dev/null))"
    sleep 0.2
  done
}
wait_200 "router /health" "http://127.0.0.1:$http_port/health" 90
echo "router /health 200 after $(since "$t_cluster") s"
if [ "$has_probe" = 1 ]; then
  wait_200 "prefill /readyz" "http://127.0.0.1:$prefill_probe/readyz" 60
  wait_200 "decode /readyz" "http://127.0.0.1:$decode_probe/readyz" 60
  for p in "$prefill_probe" "$decode_probe"; do
    [ "$(http_code "http://127.0.0.1:$p/livez")" = 200 ] || fail "worker /livez on $p is not 200"
  done
  echo "workers /readyz and /livez 200 after $(since "$t_cluster") s"
fi

# ---- generation: through the router vs in process
generate() {  # generate OUT ARGS...: pdserve generate in a container of the image
  local out=$1; shift
  local t0; t0=$(now)
  "$docker" run --rm "${run_opts[@]}" "$IMAGE" pdserve generate "$@" --temperature 0 --json >"$out" 2>"$out.err" \
    || { cat "$out.err"; fail "pdserve generate $* failed"; }
  echo "  pdserve generate $* : $(since "$t0") s (container start included)"
}
generate "$work/router.json" --router "127.0.0.1:$router_port" --prompt "$PROMPT" --max-tokens "$MAX_TOKENS"
generate "$work/local.json" --model "$MODEL" --prompt "$PROMPT" --max-tokens "$MAX_TOKENS"
router_tokens=$(json "$work/router.json" .token_ids); local_tokens=$(json "$work/local.json" .token_ids)
router_text=$(json "$work/router.json" .text); local_text=$(json "$work/local.json" .text)
[ "$router_tokens" != null ] && [ "$router_tokens" != "[]" ] || fail "no tokens through the router: $(cat "$work/router.json")"
[ "$router_tokens" = "$local_tokens" ] || fail "tokens differ: router $router_tokens, in process $local_tokens"
[ "$router_text" = "$local_text" ] || fail "text differs: router $router_text, in process $local_text"
echo "router == in-process generation: $(json "$work/router.json" '.token_ids | length') tokens, text $router_text"

if [ -x "$BUILD_DIR/tools/pdserve" ]; then
  if "$BUILD_DIR/tools/pdserve" generate --model "$models/stories260K/stories260K.bin" --prompt "$PROMPT" \
      --max-tokens "$MAX_TOKENS" --temperature 0 --json >"$work/host.json" 2>/dev/null; then
    if [ "$(json "$work/host.json" .token_ids)" = "$local_tokens" ]; then
      echo "the host build ($BUILD_DIR/tools/pdserve) generates the same tokens"
    else
      echo "note: the host build ($BUILD_DIR/tools/pdserve) generates other tokens than the image (a build of another revision?)"
    fi
  fi
fi

# BOS alone (--prompt ""), 256 tokens: the published greedy output of the model.
generate "$work/bos.json" --router "127.0.0.1:$router_port" --prompt "" --max-tokens 256
published=$(text_json "$models/stories260K/greedy_from_bos.txt")
bos_text=$(json "$work/bos.json" .text)
[ "$bos_text" = "$published" ] || fail "BOS-only greedy output through the router differs from greedy_from_bos.txt: $bos_text"
echo "router BOS-only greedy output == greedy_from_bos.txt ($(json "$work/bos.json" '.token_ids | length') tokens)"

# The image's own bundled model, by name, with no model volume and no network (as the chart's CPU
# preset runs it): BOS-only greedy output is the published one.
"$docker" run --rm --network none --read-only --tmpfs /tmp:rw,size=64m --user 10001:10001 "$IMAGE" \
  pdserve generate --model stories260K --prompt "" --max-tokens 256 --temperature 0 --json \
  >"$work/bundled.json" 2>"$work/bundled.err" \
  || { cat "$work/bundled.err"; fail "the image's bundled stories260K does not run (built without ../shared/models?)"; }
[ "$(json "$work/bundled.json" .text)" = "$published" ] \
  || fail "the image's bundled stories260K: BOS-only greedy output differs from greedy_from_bos.txt"
echo "the image's bundled stories260K (no volume, no network): BOS-only greedy output == greedy_from_bos.txt"

# ---- OpenAI completion over HTTP, curl from the host
curl -s --max-time 10 -o "$work/models.json" "http://127.0.0.1:$http_port/v1/models" || fail "GET /v1/models failed"
model_id=$(json "$work/models.json" '.data[0].id' | tr -d '"')
t0=$(now)
code=$(curl -s -o "$work/completion.json" -w '%{http_code}' --max-time 60 \
  -H 'Content-Type: application/json' "http://127.0.0.1:$http_port/v1/completions" \
  -d "{\"model\":\"$model_id\",\"prompt\":\"$PROMPT\",\"max_tokens\":$MAX_TOKENS,\"temperature\":0}")
[ "$code" = 200 ] || fail "POST /v1/completions: HTTP $code $(cat "$work/completion.json")"
completion_text=$(json "$work/completion.json" '.choices[0].text')
[ "$completion_text" = "$local_text" ] || fail "OpenAI completion text differs: $completion_text vs $local_text"
echo "POST /v1/completions (model $model_id): 200 in $(since "$t0") s, same text as in process"

# ---- `pdserve check` (the smoke test the chart's test pod runs), where the image has it
if "$docker" run --rm "${run_opts[@]}" "$IMAGE" pdserve check --help >/dev/null 2>&1; then
  t0=$(now)
  "$docker" run --rm "${run_opts[@]}" "$IMAGE" pdserve check --router "127.0.0.1:$router_port" \
    --http "127.0.0.1:$http_port" --wait-s 10 >"$work/check.out" 2>&1 \
    || { cat "$work/check.out"; fail "pdserve check failed"; }
  echo "pdserve check --router --http (in a container): passed in $(since "$t0") s"
fi

# ---- every container still up, then the timings
for c in "${containers[@]}"; do
  [ "$("$docker" inspect -f '{{.State.Running}}' "$c")" = true ] || fail "container $c is not running at the end"
done
echo "cluster test passed in $(since "$t_start") s (cluster up to the end: $(since "$t_cluster") s)"
