// Writing new tokens' K/V into their paged blocks, and packing blocks to / unpacking them from a
// contiguous buffer (layout conversion for KV transfer). Layouts are whatever the
// PagedLayerView's strides say, so every layout of engine/kv_spec.h goes through one kernel.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

// One block per (token, head); threads over the head's dims.
template <typename T>
__global__ void paged_kv_write_kernel(kernels::PagedLayerView kv, const int* positions,
                                      const int* const* block_tables, const float* k,
                                      int64_t k_row_stride, const float* v, int64_t v_row_stride) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int pos = positions[t];
  if (pos < 0) return;  // Padding (kernels/abi.h).
  const int64_t block = block_tables[t][pos / kv.block_size];
  const int slot = pos % kv.block_size;
  T* kd = reinterpret_cast<T*>(kv.k) + block * kv.k_block_stride + slot * kv.k_token_stride + h * kv.k_head_stride;
  for (int d = threadIdx.x; d < kv.head_dim; d += blockDim.x)
    kd[d] = from_f32<T>(k[t * k_row_stride + int64_t(h) * kv.head_dim + d]);
  if (kv.v == nullptr) return;
  T* vd = reinterpret_cast<T*>(kv.v) + block * kv.v_block_stride + slot * kv.v_token_stride + h * kv.v_head_stride;
  for (int d = threadIdx.x; d < kv.v_head_dim; d += blockDim.x)
    vd[d] = from_f32<T>(v[t * v_row_stride + int64_t(h) * kv.v_head_dim + d]);
}

// One block per (listed block, slot); threads over heads x dims. `to_packed` picks direction.
template <typename T>
__global__ void block_copy_kernel(T* packed, kernels::PagedLayerView kv, const int* block_ids,
                                  int head_begin, int n_heads, int64_t packed_block_elems,
                                  bool to_packed) {
  const int i = blockIdx.x, slot = blockIdx.y, bs = kv.block_size;
  const int64_t block = block_ids[i];
  T* base = packed + i * packed_block_elems;
  const int k_elems = n_heads * kv.head_dim;
  for (int e = threadIdx.x; e < k_elems; e += blockDim.x) {
    const int h = e / kv.head_dim, d = e % kv.head_dim;
    T* paged = reinterpret_cast<T*>(kv.k) + block * kv.k_block_stride + slot * kv.k_token_stride +
               (head_begin + h) * kv.k_head_stride + d;
    T* flat = base + int64_t(slot) * k_elems + e;
    if (to_packed) *flat = *paged; else *paged = *flat;
  }
  if (kv.v == nullptr) return;
  const int v_elems = n_heads * kv.v_head_dim;
  for (int e = threadIdx.x; e < v_elems; e += blockDim.x) {
    const int h = e / kv.v_head_dim, d = e % kv.v_head_dim;
    T* paged = reinterpret_cast<T*>(kv.v) + block * kv.v_block_stride + slot * kv.v_token_stride +
               (head_begin + h) * kv.v_head_stride + d;
    T* flat = base + int64_t(bs) * k_elems + int64_t(slot) * v_elems + e;
    if (to_packed) *flat = *paged; else *paged = *flat;
  }
}

void block_copy(void* packed, const kernels::PagedLayerView& kv, const int* block_ids, int n_blocks, int head_begin,
                int n_heads, bool to_packed, gpuStream_t stream) {
  if (n_blocks <= 0 || n_heads <= 0) return;
  const int64_t elems = packed_block_bytes(kv, n_heads) / storage_bytes(kv.storage);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(block_copy_kernel<T>, dim3(n_blocks, kv.block_size), kBlockThreads, 0, stream, static_cast<T*>(packed),
               kv, block_ids, head_begin, n_heads, elems, to_packed);
  });
}

}  // namespace

void paged_kv_write(const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, const float* k,
                    int64_t k_row_stride, const float* v, int64_t v_row_stride, int n_kv_heads, gpuStream_t stream) {
  if (tokens.num_tokens <= 0 || n_kv_heads <= 0) return;
  const int dims = kv.head_dim > kv.v_head_dim ? kv.head_dim : kv.v_head_dim;
  const int threads = dims <= 64 ? 64 : (dims <= 128 ? 128 : 256);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(paged_kv_write_kernel<T>, dim3(tokens.num_tokens, n_kv_heads), threads, 0, stream, kv, tokens.positions,
               tokens.block_tables, k, k_row_stride, v, v_row_stride);
  });
}

int64_t packed_block_bytes(const kernels::PagedLayerView& kv, int n_heads) {
  const int64_t dims = kv.head_dim + (kv.v ? kv.v_head_dim : 0);
  return int64_t(kv.block_size) * n_heads * dims * storage_bytes(kv.storage);
}

void pack_blocks(void* packed, const kernels::PagedLayerView& kv, const int* block_ids, int n_blocks, int head_begin,
                 int n_heads, gpuStream_t stream) {
  block_copy(packed, kv, block_ids, n_blocks, head_begin, n_heads, true, stream);
}

void unpack_blocks(const kernels::PagedLayerView& kv, const void* packed, const int* block_ids, int n_blocks,
                   int head_begin, int n_heads, gpuStream_t stream) {
  block_copy(const_cast<void*>(packed), kv, block_ids, n_blocks, head_begin, n_heads, false, stream);
}

}  // namespace pdserve::kernels::gpu
