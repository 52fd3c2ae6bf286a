#!/usr/bin/env bash
# Static checks of the container image files, offline and without a Docker engine (ctest
# deploy_image_lint): the scripts parse, and every Dockerfile keeps the properties the images
# promise (multi-stage builder/runtime/debug/release with release last, non-root UID 10001,
# programs under /opt/pdserve, the OCI labels with version/revision from build args, the
# PDSERVE_BUILD_TESTS=OFF Ninja build with a ccache cache mount, no `# syntax=` line (the
# engine's built-in frontend; nothing to pull), the runtime check; for the GPU images UCX from
# source with the vendor transport, verbs and rdmacm found through PKG_CONFIG_PATH, and for ROCm an
# rdma-core >= 61.0 with the ionic provider). hadolint runs too where it is installed.
# Prints one line per check and "N passed, N failed".
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
docker_dir=$(cd "$here/../docker" && pwd)
passed=0 failed=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@" >/dev/null 2>&1; then passed=$((passed + 1)); echo "ok   $what"
  else failed=$((failed + 1)); echo "FAIL $what"; fi
}
has() { grep -qE -- "$2" "$1"; }
hasnt() { ! grep -qE -- "$2" "$1"; }
last_stage_is() { [ "$(grep -E '^FROM ' "$1" | tail -1 | awk '{print $NF}')" = "$2" ]; }

for s in "$here"/image-*.sh "$docker_dir"/scripts/*.sh; do
  case "$s" in *.sh) ;; *) continue ;; esac
  if head -1 "$s" | grep -q bash || [ "$(basename "$s")" = image-lib.sh ]; then
    check "bash -n $(basename "$s")" bash -n "$s"
  else
    check "sh -n $(basename "$s")" sh -n "$s"
  fi
done

for variant in cpu cuda rocm; do
  f=$docker_dir/Dockerfile.$variant
  d="Dockerfile.$variant"
  check "$d exists" test -f "$f" || continue
  check "$d: no '# syntax=' directive (built-in frontend, nothing pulled)" hasnt "$f" '^# *syntax='
  for stage in builder runtime debug release; do
    check "$d: stage $stage" has "$f" "^FROM .* AS $stage\$"
  done
  check "$d: release is the last stage (default target)" last_stage_is "$f" release
  check "$d: runs as UID 10001" has "$f" '^USER 10001(:10001)?$'
  check "$d: programs in /opt/pdserve" has "$f" 'cmake --install /tmp/build --prefix /opt/pdserve'
  check "$d: -DPDSERVE_BUILD_TESTS=OFF -G Ninja" has "$f" '-G Ninja .*-DPDSERVE_BUILD_TESTS=OFF'
  check "$d: ccache cache mount" has "$f" 'RUN --mount=type=cache,target=/root/.ccache|--mount=type=cache,target=/root/.ccache'
  check "$d: release build type" has "$f" '^ARG CMAKE_BUILD_TYPE=(Release|RelWithDebInfo)$'
  for label in title description source version revision licenses; do
    check "$d: label org.opencontainers.image.$label" has "$f" "org\\.opencontainers\\.image\\.$label="
  done
  check "$d: version and revision from build args" has "$f" '^ARG VERSION=' 
  check "$d: revision build arg" has "$f" '^ARG REVISION='
  check "$d: runtime check (libraries, no compiler)" has "$f" 'check-runtime\.sh'
  check "$d: debug stage has ibv_devinfo/perftest/rdma tools" has "$f" 'perftest'
  check "$d: BuildKit dockerignore beside it" test -f "$f.dockerignore"
  # The builder bind-mounts only the folders the root CMakeLists.txt adds: a new one must be added.
  for sub in $(sed -n 's/^ *add_subdirectory(\([A-Za-z0-9_]*\)).*/\1/p' "$here/../../CMakeLists.txt"); do
    [ "$sub" = deploy ] && sub=deploy/CMakeLists.txt
    check "$d: the build mounts $sub (add_subdirectory in CMakeLists.txt)" has "$f" "--mount=type=bind,source=$sub,target=/src/$sub "
  done
  if [ "$variant" != cpu ]; then
    check "$d: base images are ARGs" has "$f" '^ARG [A-Z_]*(DEVEL|DEV|RUNTIME)_IMAGE='
    check "$d: UCX from source with verbs and rdmacm" has "$f" 'build-from-source\.sh ucx /opt/ucx'
    check "$d: UCX --with-verbs" has "$f" '--with-verbs'
    check "$d: UCX --with-rdmacm" has "$f" '--with-rdmacm'
    check "$d: pkg-config finds the built UCX" has "$f" 'PKG_CONFIG_PATH=/opt/ucx/lib/pkgconfig'
    check "$d: single UCX check" has "$f" 'more than one UCX'
  fi
done
check "Dockerfile.cuda: UCX --with-cuda" has "$docker_dir/Dockerfile.cuda" '--with-cuda='
check "Dockerfile.cuda: -DPDSERVE_WITH_CUDA=ON" has "$docker_dir/Dockerfile.cuda" '-DPDSERVE_WITH_CUDA=ON'
check "Dockerfile.rocm: UCX --with-rocm" has "$docker_dir/Dockerfile.rocm" '--with-rocm='
check "Dockerfile.rocm: -DPDSERVE_WITH_HIP=ON" has "$docker_dir/Dockerfile.rocm" '-DPDSERVE_WITH_HIP=ON'
check "Dockerfile.rocm: rdma-core with the ionic provider" has "$docker_dir/Dockerfile.rocm" 'REQUIRE="ionic'
rdma_version=$(sed -n 's/^ARG RDMA_CORE_VERSION=//p' "$docker_dir/Dockerfile.rocm")
check "Dockerfile.rocm: rdma-core $rdma_version >= 61.0 (first release with ionic)" \
  awk -v v="$rdma_version" 'BEGIN { exit !(v + 0 >= 61) }'

if command -v hadolint >/dev/null 2>&1; then
  for variant in cpu cuda rocm; do
    check "hadolint Dockerfile.$variant" hadolint --ignore DL3008 --ignore DL4006 "$docker_dir/Dockerfile.$variant"
  done
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
