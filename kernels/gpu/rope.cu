// Rotary position embedding in place, adjacent-pair (llama2.c) or rotate-half (Hugging Face).
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

// One thread per (row, head, pair).
__global__ void rope_kernel(float* x, int rows, int64_t row_stride, int n_heads, int head_dim,
                            const int* positions, const float* inv_freq, float attention_scale,
                            bool rotate_half) {
  const int half = head_dim / 2;
  const int64_t total = int64_t(rows) * n_heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int i = int(idx % half);
    const int h = int((idx / half) % n_heads);
    const int r = int(idx / (int64_t(half) * n_heads));
    // cosf/sinf, never their fast intrinsics: the CPU kernel is the reference.
    const float angle = float(positions[r]) * inv_freq[i];
    const float c = cosf(angle) * attention_scale, s = sinf(angle) * attention_scale;
    float* head = x + r * row_stride + int64_t(h) * head_dim;
    float* a = rotate_half ? head + i : head + 2 * i;
    float* b = rotate_half ? head + i + half : head + 2 * i + 1;
    const float v0 = *a, v1 = *b;
    *a = v0 * c - v1 * s;
    *b = v0 * s + v1 * c;
  }
}

}  // namespace

void rope(float* x, int rows, int64_t row_stride, int n_heads, int head_dim, const int* positions,
          const float* inv_freq, float attention_scale, bool rotate_half, gpuStream_t stream) {
  const int64_t total = int64_t(rows) * n_heads * (head_dim / 2);
  if (total <= 0) return;
  gpu_launch(rope_kernel, grid_for(total, kBlockThreads), kBlockThreads, 0, stream, x, rows, row_stride, n_heads,
             head_dim, positions, inv_freq, attention_scale, rotate_half);
}

}  // namespace pdserve::kernels::gpu
