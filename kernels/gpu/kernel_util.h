// Helpers shared by the kernel sources of kernels/gpu (not part of the kernels' API): choosing
// the template instance for a run-time storage type, grid sizing, and the device expressions
// that several kernels must compute alike (SwiGLU's silu_times).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/ops.h"

namespace pdserve::kernels::gpu {

// Runs `body` (a generic lambda taking a T* tag) with T the C++ type of `storage`.
template <typename F>
void dispatch_storage(Storage storage, F&& body) {
  switch (storage) {
    case Storage::kF32: body(static_cast<float*>(nullptr)); return;
    case Storage::kF16: body(static_cast<gpu_f16*>(nullptr)); return;
    case Storage::kBF16: body(static_cast<gpu_bf16*>(nullptr)); return;
  }
}

inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  // Grid-stride loops cover the rest; enough blocks to fill any current GPU several times.
  return unsigned(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// SwiGLU's silu(gate) · up, one expression for every kernel that computes it (silu_mul and the
// fused gate-up GEMV give the same bits).
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// A caller broke a kernel's documented limit: a programming error, not a run-time condition.
[[noreturn]] inline void kernel_limit_exceeded(const char* kernel, const char* what) {
  std::fprintf(stderr, "pdserve gpu kernel %s: %s\n", kernel, what);
  std::abort();
}

}  // namespace pdserve::kernels::gpu
