// Element-wise kernels: SwiGLU's silu(gate) * up, residual add, and the device-side
// random fill that synthetic models use instead of weight files.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

__global__ void silu_mul_kernel(float* out, const float* gate, const float* up, int64_t n, int cols,
                                int64_t in_stride) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = (i / cols) * in_stride + i % cols;
    out[i] = silu_times(gate[at], up[at]);
  }
}

__global__ void add_inplace_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(float* x, int64_t n, uint64_t seed, float stddev, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (stddev == 0.0f) {
      x[i] = value;
      continue;
    }
    const uint64_t h = splitmix64(seed * 0x100000001b3ull + uint64_t(i));
    // Two 24-bit uniforms in (0, 1] and [0, 1) -> one Box-Muller normal.
    const float u1 = (float((h >> 40) & 0xffffff) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = float((h >> 8) & 0xffffff) * (1.0f / 16777216.0f);
    x[i] = stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
  }
}

}  // namespace

void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride,
              gpuStream_t stream) {
  const int64_t n = int64_t(rows) * cols;
  if (n <= 0) return;
  gpu_launch(silu_mul_kernel, grid_for(n, kBlockThreads), kBlockThreads, 0, stream, out, gate, up, n, cols, in_stride);
}

void add_inplace(float* x, const float* y, int64_t n, gpuStream_t stream) {
  if (n <= 0) return;
  gpu_launch(add_inplace_kernel, grid_for(n, kBlockThreads), kBlockThreads, 0, stream, x, y, n);
}

void fill_random(float* x, int64_t n, uint64_t seed, float stddev, float value, gpuStream_t stream) {
  if (n <= 0) return;
  gpu_launch(fill_random_kernel, grid_for(n, kBlockThreads), kBlockThreads, 0, stream, x, n, seed, stddev, value);
}

}  // namespace pdserve::kernels::gpu
