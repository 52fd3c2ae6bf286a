#!/usr/bin/env bash
# Builds a pdserve container image on a machine without registry access (the CPU image by
# default) and prints its size and the build time.
#
#   deploy/scripts/image-build.sh [--variant cpu|cuda|rocm] [--target release|debug] [--tag NAME]
#                                 [--no-cache] [--rebuild] [--save-size] [--keep-daemon] [--base-only]
#                                 [-- EXTRA DOCKER BUILD ARGS, e.g. --build-arg UCX_VERSION=1.20.1]
#
# What it does:
#   1. Finds a Docker engine that answers ($DOCKER_HOST, the default socket, or the private one
#      under $PDSERVE_DOCKER_WORKDIR, default <checkout>/../dockerd-data). If none does, installs
#      Debian's engine (docker.io) and debootstrap when missing and starts a private dockerd there
#      (vfs, no iptables, no bridge), which it stops again on exit unless --keep-daemon
#      (or PDSERVE_KEEP_DOCKERD=1).
#   2. cpu: creates the base image pdserve-base:bookworm once with `debootstrap --variant=minbase
#      bookworm` + `docker import` (skipped when the image exists).
#   3. DOCKER_BUILDKIT=1 /usr/bin/docker build --network host -f deploy/docker/Dockerfile.VARIANT
#      with the build context sent as a tar stream of the checkout's git-listed files (so build/,
#      .git and ignored files never go to the engine; see pd_context_tar in image-lib.sh).
#      BuildKit is required: the Dockerfiles use RUN --mount (a ccache cache mount, a bind mount
#      of the sources, apt cache mounts).
#      --rebuild re-runs the C++ build step with the warm ccache (a new REBUILD build arg);
#      --no-cache rebuilds every step and, in BuildKit, also empties the cache mounts (a cold build).
#   4. Prints the image size (docker image inspect .Size; with --save-size also `docker save | wc -c`)
#      and the build time.
#
# Tags: pdserve:VARIANT for the release target, pdserve:VARIANT-debug for the debug target.
# The GPU variants need their vendor base images (ARGs in the Dockerfiles) from a registry, so
# they only build where one can be reached.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/image-lib.sh"

variant=cpu target=release tag="" no_cache=() save_size=0 base_only=0 extra=() rebuild=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --no-cache) no_cache=(--no-cache); shift ;;
    --rebuild) rebuild=(--build-arg "REBUILD=$(date +%s.%N)"); shift ;;
    --save-size) save_size=1; shift ;;
    --keep-daemon) export PDSERVE_KEEP_DOCKERD=1; shift ;;
    --base-only) base_only=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pd_die "unknown argument $1 (see --help)" ;;
  esac
done
case "$variant" in cpu|cuda|rocm) ;; *) pd_die "--variant must be cpu, cuda or rocm" ;; esac
case "$target" in release|debug) ;; *) pd_die "--target must be release or debug" ;; esac
if [ -z "$tag" ]; then
  tag="pdserve:$variant"; [ "$target" = debug ] && tag="pdserve:$variant-debug"
fi
dockerfile="deploy/docker/Dockerfile.$variant"
[ "$base_only" = 1 ] || [ -f "$PD_REPO_ROOT/$dockerfile" ] || pd_die "$dockerfile not found"

trap pd_stop_dockerd EXIT
pd_ensure_engine
docker=$(pd_docker_client)
pd_log "engine: $("$docker" version --format 'Docker {{.Server.Version}}') at ${DOCKER_HOST:-the default socket} ($("$docker" info --format '{{.Driver}}') driver)"

base_args=()
if [ "$variant" = cpu ]; then
  pd_ensure_base
  base_args=(--build-arg "BASE_IMAGE=$PD_BASE_IMAGE")
  # The CPU image carries the bundled stories260K (1 MB) from the checkout's ../shared/models.
  bundled=${PDSERVE_MODELS_DIR:-$PD_REPO_ROOT/../shared/models}/stories260K
  if [ -f "$bundled/stories260K.bin" ]; then
    export PD_CONTEXT_MODEL_DIR
    PD_CONTEXT_MODEL_DIR=$(cd "$bundled" && pwd)
  else
    pd_log "warning: no bundled model at $bundled: the image will not carry stories260K"
  fi
fi
[ "$base_only" = 1 ] && exit 0

version=$(git -C "$PD_REPO_ROOT" describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)
revision=$(git -C "$PD_REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
source_url=$(git -C "$PD_REPO_ROOT" remote get-url origin 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

pd_log "building $tag from $dockerfile (target $target, version $version, revision ${revision:0:12})"
t0=$(date +%s)
log="$PD_WORKDIR/build-$variant-$target.log"
mkdir -p "$PD_WORKDIR"
set +e
pd_context_tar | DOCKER_BUILDKIT=1 "$docker" build --network host --progress=plain \
  -f "$dockerfile" --target "$target" -t "$tag" "${no_cache[@]}" "${rebuild[@]}" "${base_args[@]}" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" --build-arg "CREATED=$created" \
  ${PDSERVE_BUILD_JOBS:+--build-arg "BUILD_JOBS=$PDSERVE_BUILD_JOBS"} \
  "${extra[@]}" - 2>&1 | tee "$log"
statuses=("${PIPESTATUS[@]}")
set -e
rc=${statuses[1]}
[ "${statuses[0]}" = 0 ] || { [ "$rc" != 0 ] || rc=${statuses[0]}; pd_log "creating the build context (tar) failed"; }
seconds=$(( $(date +%s) - t0 ))
[ "$rc" = 0 ] || pd_die "docker build failed after ${seconds} s (exit $rc; log: $log)"

size=$("$docker" image inspect -f '{{.Size}}' "$tag")
echo "image $tag: $size bytes ($(( size / 1048576 )) MiB, docker image inspect .Size)"
if [ "$save_size" = 1 ]; then
  saved=$("$docker" save "$tag" | wc -c)
  echo "image $tag: $saved bytes ($(( saved / 1048576 )) MiB, docker save | wc -c)"
fi
echo "build time: ${seconds} s${PD_BASE_SECONDS:+ (base image created in ${PD_BASE_SECONDS} s before it)}"
# Dangling images (an earlier build of the same tag) hold full vfs copies of their layers.
"$docker" image prune -f >/dev/null 2>&1 || true
