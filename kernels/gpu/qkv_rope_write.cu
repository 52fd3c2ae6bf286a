// Attention's input stage in one launch: the Q/K biases, Qwen3's head norms and RoPE on the
// step's projection rows, roped Q into a compact buffer, K and V into the paged cache (issue 18's
// R7: one kernel where add_bias, rms_norm, rope and paged_kv_write took up to eight).
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

constexpr int kMaxHeadDim = 256;

// One block per (token, head), heads 0..n_q_heads-1 of Q then the KV heads (K, and V beside it);
// threads over the head's dims, the head staged in shared memory between the norm and the
// rotation (a pair's two elements belong to different threads).
template <typename T>
__global__ void qkv_rope_write_kernel(float* q_out, kernels::QkvRows rows, kernels::RopeTable rope,
                                      kernels::PagedLayerView kv, const int* positions,
                                      const int* const* block_tables) {
  __shared__ float head[kMaxHeadDim];
  __shared__ float scratch[kBlockThreads / kWarpSize];
  const int t = blockIdx.x, hd = kv.head_dim, half = hd / 2;
  const bool is_q = int(blockIdx.y) < rows.n_q_heads;
  const int h = is_q ? blockIdx.y : blockIdx.y - rows.n_q_heads;
  const float* src = is_q ? rows.q + t * rows.q_stride + int64_t(h) * hd : rows.k + t * rows.k_stride + int64_t(h) * hd;
  const float* bias = is_q ? rows.q_bias : rows.k_bias;
  const float* norm = is_q ? rows.q_norm : rows.k_norm;
  float ss = 0.0f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float x = bias ? src[d] + bias[int64_t(h) * hd + d] : src[d];
    head[d] = x;
    ss += x * x;
  }
  if (norm) {  // Uniform across the block: every thread takes part in the sum.
    ss = block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / hd + rows.norm_eps);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) head[d] = norm[d] * (scale * head[d]);
  }
  __syncthreads();
  const int pos = positions[t];
  if (pos < 0 && !is_q) return;  // Padding (kernels/abi.h): no K or V written.
  const int64_t block = is_q ? 0 : block_tables[t][pos / kv.block_size];
  const int slot = pos % kv.block_size;
  float* qd = q_out + (int64_t(t) * rows.n_q_heads + h) * hd;
  T* kd = reinterpret_cast<T*>(kv.k) + block * kv.k_block_stride + slot * kv.k_token_stride + h * kv.k_head_stride;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // cosf/sinf, never their fast intrinsics: the CPU kernel is the reference.
    const float angle = float(pos) * rope.inv_freq[i];
    const float c = cosf(angle) * rope.attention_scale, s = sinf(angle) * rope.attention_scale;
    const int a = rope.rotate_half ? i : 2 * i, b = rope.rotate_half ? i + half : 2 * i + 1;
    const float v0 = head[a], v1 = head[b];
    const float ra = v0 * c - v1 * s, rb = v0 * s + v1 * c;
    if (is_q) {
      qd[a] = ra;
      qd[b] = rb;
    } else {
      kd[a] = from_f32<T>(ra);
      kd[b] = from_f32<T>(rb);
    }
  }
  if (is_q || kv.v == nullptr) return;
  const float* vs = rows.v + t * rows.v_stride + int64_t(h) * kv.v_head_dim;
  T* vd = reinterpret_cast<T*>(kv.v) + block * kv.v_block_stride + slot * kv.v_token_stride + h * kv.v_head_stride;
  for (int d = threadIdx.x; d < kv.v_head_dim; d += blockDim.x)
    vd[d] = from_f32<T>(rows.v_bias ? vs[d] + rows.v_bias[int64_t(h) * kv.v_head_dim + d] : vs[d]);
}

}  // namespace

void qkv_rope_write(float* q_out, const kernels::QkvRows& rows, const kernels::RopeTable& rope,
                    const kernels::PagedLayerView& kv, const kernels::TokenPlacement& tokens, gpuStream_t stream) {
  const int heads = rows.n_q_heads + rows.n_kv_heads;
  if (tokens.num_tokens <= 0 || heads <= 0) return;
  if (kv.head_dim > kMaxHeadDim || kv.head_dim % 2 != 0)
    kernel_limit_exceeded("qkv_rope_write", "head_dim must be even and at most 256");
  const int dims = kv.head_dim > kv.v_head_dim ? kv.head_dim : kv.v_head_dim;
  const int threads = dims <= 64 ? 64 : 128;  // Whole warps (64 lanes on AMD); at most kBlockThreads.
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(qkv_rope_write_kernel<T>, dim3(tokens.num_tokens, heads), threads, 0, stream, q_out, rows, rope,
               kv, tokens.positions, tokens.block_tables);
  });
}

}  // namespace pdserve::kernels::gpu
