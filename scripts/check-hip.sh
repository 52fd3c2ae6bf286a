#!/usr/bin/env bash
# Compiles every kernel source of kernels/gpu and the GPU backend and collectives as HIP (the
# same files nvcc builds), warnings as errors, to show that the single source stays portable.
# Needs hipcc (Debian: apt-get install -y hipcc, whose clang targets gfx90a and gfx940 at most;
# ROCm 6+ hipcc also takes gfx942/gfx950).
#   scripts/check-hip.sh [offload-arch ...]     (default: gfx90a)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hipcc >/dev/null || { echo "check-hip: hipcc not found" >&2; exit 1; }
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(gfx90a)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=()
for a in "${archs[@]}"; do flags+=("--offload-arch=$a"); done
# The backend includes the ABI id CMake generates; any value compiles.
mkdir -p "$out/engine/backends/gpu"
echo '#define PDSERVE_GPU_ABI_ID "check-hip"' > "$out/engine/backends/gpu/gpu_abi_id.h"
status=0
# The kernels, and the backend and collectives (host code that includes the HIP runtime).
for src in kernels/gpu/*.cu engine/backends/gpu/gpu_backend.cc engine/backends/gpu/gpu_communicator.cc; do
  if hipcc "${flags[@]}" -x hip -std=c++17 -O2 -Wall -Werror -I. -I"$out" -c "$src" -o "$out/$(basename "$src").o"; then
    echo "ok    $src (${archs[*]})"
  else
    echo "FAIL  $src" >&2
    status=1
  fi
done
exit $status
