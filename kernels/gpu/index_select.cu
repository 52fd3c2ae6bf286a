// Block selection from a key-only index cache (sparse attention): per token, score each earlier
// logical block by its best index-key match and mark the top_k plus the token's own block.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

// One block per token; dynamic shared memory holds one score per logical block (mask_stride).
template <typename T>
__global__ void index_select_kernel(uint8_t* block_mask, int mask_stride, const float* q_index,
                                    kernels::PagedLayerView view, const int* positions,
                                    const int* const* block_tables, int top_k) {
  PDSERVE_DYNAMIC_SHARED(float, scores);
  const int t = blockIdx.x, bs = view.block_size, hd = view.head_dim;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int own = positions[t] < 0 ? -1 : positions[t] / bs;  // -1: padding (kernels/abi.h), no block.
  const int* table = block_tables[t];
  const float* qi = q_index + int64_t(t) * hd;
  const T* keys = reinterpret_cast<const T*>(view.k);
  for (int b = warp; b < own; b += warps) {
    float best = -INFINITY;
    for (int slot = 0; slot < bs; ++slot) {
      const T* kj = keys + int64_t(table[b]) * view.k_block_stride + slot * view.k_token_stride;
      float dot = 0.0f;
      for (int d = lane; d < hd; d += kWarpSize) dot += qi[d] * to_f32(kj[d]);
      best = fmaxf(best, warp_sum(dot));
    }
    if (lane == 0) scores[b] = best;
  }
  uint8_t* mask = block_mask + int64_t(t) * mask_stride;
  for (int b = threadIdx.x; b < mask_stride; b += blockDim.x) mask[b] = 0;
  __syncthreads();
  // Block b is kept when fewer than top_k blocks beat it (higher score, or equal and earlier).
  for (int b = threadIdx.x; b < own; b += blockDim.x) {
    const float s = scores[b];
    int beaten_by = 0;
    for (int c = 0; c < own && beaten_by < top_k; ++c)
      if (scores[c] > s || (scores[c] == s && c < b)) ++beaten_by;
    if (beaten_by < top_k) mask[b] = 1;
  }
  if (threadIdx.x == 0 && own >= 0) mask[own] = 1;
}

}  // namespace

void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                         const kernels::PagedLayerView& index_view, const kernels::TokenPlacement& tokens, int top_k,
                         gpuStream_t stream) {
  if (tokens.num_tokens <= 0) return;
  const size_t smem = sizeof(float) * size_t(mask_stride);
  if (smem > 48 * 1024) kernel_limit_exceeded("index_select_blocks", "more than 12288 blocks per sequence");
  dispatch_storage(index_view.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(index_select_kernel<T>, tokens.num_tokens, kBlockThreads, smem, stream, block_mask, mask_stride, q_index,
               index_view, tokens.positions, tokens.block_tables, top_k);
  });
}

}  // namespace pdserve::kernels::gpu
