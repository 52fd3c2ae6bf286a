// RMSNorm: alone, on rows gathered by index (the logits rows), and fused with the residual add
// that precedes it in every block.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

// One block per row of `out`, normalising row row_ids[r] of x (row r when row_ids is null).
// `residual` non-null: x += residual first (written back), then the norm.
__global__ void rms_norm_kernel(float* out, float* x, const int* row_ids, const float* residual,
                                const float* weight, int dim, float eps) {
  __shared__ float scratch[kBlockThreads / kWarpSize];
  float* row = x + int64_t(row_ids ? row_ids[blockIdx.x] : blockIdx.x) * dim;
  float* y = out + int64_t(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = row[i];
    if (residual) {
      v += residual[int64_t(blockIdx.x) * dim + i];
      row[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(ss / dim + eps);
  // Same operation order as the CPU kernel: weight * (scale * x).
  for (int i = threadIdx.x; i < dim; i += blockDim.x) y[i] = weight[i] * (scale * row[i]);
}

}  // namespace

void rms_norm(float* out, const float* in, const float* weight, int rows, int dim, float eps,
              gpuStream_t stream) {
  if (rows <= 0) return;
  // The kernel only writes `x` when given a residual; in-place (out == in) is fine.
  gpu_launch(rms_norm_kernel, rows, kBlockThreads, 0, stream, out, const_cast<float*>(in), nullptr, nullptr, weight,
             dim, eps);
}

void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* weight, int rows, int dim,
                     float eps, gpuStream_t stream) {
  if (rows <= 0) return;
  gpu_launch(rms_norm_kernel, rows, kBlockThreads, 0, stream, out, const_cast<float*>(in), row_ids, nullptr, weight,
             dim, eps);
}

void add_rms_norm(float* out, float* x, const float* residual, const float* weight, int rows,
                  int dim, float eps, gpuStream_t stream) {
  if (rows <= 0) return;
  gpu_launch(rms_norm_kernel, rows, kBlockThreads, 0, stream, out, x, nullptr, residual, weight, dim, eps);
}

}  // namespace pdserve::kernels::gpu
