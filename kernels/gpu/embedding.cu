// Token embedding lookup (mirrors CpuBackend::embed).
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

template <typename T>
__global__ void embed_kernel(float* out, const T* table, const int* tokens, int dim, const int* sampled) {
  const int t = blockIdx.x;
  const int token = tokens[t] < 0 ? sampled[-1 - tokens[t]] : tokens[t];
  const T* row = table + int64_t(token) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[int64_t(t) * dim + i] = to_f32(row[i]);
}

}  // namespace

void embed(float* out, const void* table, Storage table_type, const int* tokens, int n, int dim, const int* sampled,
           gpuStream_t stream) {
  if (n <= 0) return;
  dispatch_storage(table_type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(embed_kernel<T>, n, kBlockThreads, 0, stream, out, static_cast<const T*>(table), tokens, dim, sampled);
  });
}

}  // namespace pdserve::kernels::gpu
