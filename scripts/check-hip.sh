#!/usr/bin/env bash
# Builds the GPU stack as HIP with CMake's HIP language (-DPDSERVE_WITH_HIP=ON, as a ROCm machine
# builds it): the kernels and the GPU backend library (HIP sources, warnings as errors) and the
# objects of gpu_backend_tests and gpu_bench (C++ over the HIP host API) — without linking the
# test and bench programs, which would rebuild the whole engine in a second tree. Shows that the
# single source stays portable; scripts/gpu-check.sh rocm builds and runs everything on a ROCm
# machine.
#
# Uses ROCm where `hipconfig --rocmpath` finds one with CMake's HIP package (a ROCm install in
# /opt/rocm). Debian 12's ROCm 5.2 (apt-get install -y hipcc, whose clang targets gfx90a and
# gfx940 at most) lays its files out under /usr where CMake 3.25 does not look, and its HIP CMake
# package puts -isystem /usr/include before the C++ library's headers; there a minimal package
# (the HIP runtime library as hip-lang::device) is written into the build tree and named as the
# ROCm root.
#   scripts/check-hip.sh [offload-arch ...]     (default: gfx90a; BUILD_DIR, default build-hip)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
command -v hipcc >/dev/null || { echo "check-hip: hipcc not found" >&2; exit 1; }
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(gfx90a)
build=${BUILD_DIR:-$root/build-hip}
mkdir -p "$build"
rocm=$(hipconfig --rocmpath 2>/dev/null || echo /opt/rocm)
# Warnings are errors in the HIP sources; the offload architectures are unused (and warned
# about) when clang links.
hip_flags=(-Werror -Wno-unused-command-line-argument)
args=()
if [ ! -f "$rocm/lib/cmake/hip-lang/hip-lang-config.cmake" ]; then
  shim=$build/rocm-shim
  library=$(find /usr/lib -name 'libamdhip64.so.*' -print -quit)
  [ -n "$library" ] || { echo "check-hip: no libamdhip64 beside hipcc" >&2; exit 1; }
  mkdir -p "$shim/lib/cmake/hip-lang"
  cat >"$shim/lib/cmake/hip-lang/hip-lang-config.cmake" <<CMAKE
# Written by scripts/check-hip.sh: Debian's HIP runtime as the package CMake's HIP language loads.
if(NOT TARGET hip-lang::device)
  add_library(hip-lang::amdhip64 SHARED IMPORTED)
  set_target_properties(hip-lang::amdhip64 PROPERTIES IMPORTED_LOCATION $library
    INTERFACE_COMPILE_DEFINITIONS "\$<\$<COMPILE_LANGUAGE:HIP>:__HIP_ROCclr__=1>")
  add_library(hip-lang::device INTERFACE IMPORTED)
  set_target_properties(hip-lang::device PROPERTIES INTERFACE_LINK_LIBRARIES hip-lang::amdhip64)
endif()
set(_CMAKE_HIP_DEVICE_RUNTIME_TARGET hip-lang::device)
CMAKE
  # hipcc's own flags for Debian's clang: where the HIP headers and device libraries are, and
  # the HIP version (without it clang assumes 3.5 and skips its HIP runtime wrapper header).
  # The clang hipcc itself drives (hipcc --offload-arch avoids its probe of the machine's GPUs).
  echo 'int x;' >"$build/probe.hip"
  clang=$(HIPCC_VERBOSE=1 hipcc --offload-arch=gfx90a -x hip --cuda-host-only -E "$build/probe.hip" -o /dev/null 2>&1 |
    sed -n 's/^hipcc-cmd: *\([^ ]*\).*/\1/p' | head -1 || true)
  [ -x "$clang" ] || { echo "check-hip: cannot tell which clang hipcc runs" >&2; exit 1; }
  version=$(hipconfig --version)
  args+=(-DCMAKE_HIP_COMPILER="$clang" -DCMAKE_HIP_COMPILER_ROCM_ROOT="$shim")
  hip_flags+=(--rocm-path=/usr "--hip-version=${version%%-*}"
    "--hip-device-lib-path=$(dirname "$(find /usr/lib -name ocml.bc -print -quit)")")
fi
arch_list=$(IFS=';'; echo "${archs[*]}")
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
cmake -S "$root" -B "$build" -G Ninja -DPDSERVE_WITH_HIP=ON -DCMAKE_HIP_ARCHITECTURES="$arch_list" \
  -DCMAKE_HIP_FLAGS="${hip_flags[*]}" "${args[@]}" >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
objects=(tests/gpu/CMakeFiles/gpu_backend_tests.dir/gpu_backend_test.cc.o
  tests/gpu/CMakeFiles/gpu_backend_tests.dir/gpu_kernels_test.cc.o bench/CMakeFiles/gpu_bench.dir/gpu_bench.cc.o)
ninja -C "$build" -j"${JOBS:-$(nproc)}" pdserve_gpu_backend "${objects[@]}"
echo "check-hip: pdserve_gpu_backend and the gpu_backend_tests and gpu_bench objects built for ${archs[*]}"
