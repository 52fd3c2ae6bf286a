// Greedy sampling on the device: the index of each row's largest logit (lowest on ties, as the
// CPU argmax), so that only one int per row crosses to the host.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

__global__ void argmax_kernel(int* out, const float* x, int n) {
  __shared__ float best_v[kBlockThreads];
  __shared__ int best_i[kBlockThreads];
  const float* row = x + int64_t(blockIdx.x) * n;
  float v = -INFINITY;
  int idx = n;  // Larger than any real index, so a real one always wins a tie with it.
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (row[i] > v || idx == n) {
      v = row[i];
      idx = i;
    }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int oi = best_i[threadIdx.x + s];
      if (oi < n && (best_i[threadIdx.x] == n || ov > best_v[threadIdx.x] ||
                     (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] < n ? best_i[0] : 0;
}

}  // namespace

void argmax(int* out, const float* x, int rows, int n, gpuStream_t stream) {
  if (rows <= 0) return;
  argmax_kernel<<<rows, kBlockThreads, 0, stream>>>(out, x, n);
}

}  // namespace pdserve::kernels::gpu
