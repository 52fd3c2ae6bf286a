// Paged attention: a decode-shaped kernel (one query row per block, its warps splitting the
// keys), split-KV decode, and chunked causal prefill kernels (a tile of query rows shares every
// K/V tile it loads into shared memory): on CUDA cores in f32, and on tensor cores with bf16
// operands. All: online softmax in f32, GQA (query head h reads KV head h / q_per_kv), sliding
// window, and the index cache's block mask.
#include "kernels/gpu/kernel_util.h"

namespace pdserve::kernels::gpu {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / kWarpSize;
constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * kWarpSize;
constexpr int kTileRows = 16;  // Query rows (token, head of the group) per prefill block.
constexpr int kTileKeys = 16;  // Keys per shared-memory tile: 32 KB of K and V at head dim 256.
constexpr int kRowsPerWarp = kTileRows / kAttnWarps;

// Running softmax state of one query row, its accumulator spread over the warp's lanes
// (dim d = lane + i * kWarpSize).
struct RowState {
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerLane] = {};
};

template <typename T>
__device__ __forceinline__ const T* key_ptr(const kernels::PagedLayerView& kv, const int* table, int p, int kvh) {
  return reinterpret_cast<const T*>(kv.k) + int64_t(table[p / kv.block_size]) * kv.k_block_stride +
         (p % kv.block_size) * kv.k_token_stride + kvh * kv.k_head_stride;
}
template <typename T>
__device__ __forceinline__ const T* value_ptr(const kernels::PagedLayerView& kv, const int* table, int p, int kvh) {
  return reinterpret_cast<const T*>(kv.v) + int64_t(table[p / kv.block_size]) * kv.v_block_stride +
         (p % kv.block_size) * kv.v_token_stride + kvh * kv.v_head_stride;
}

// The run of tokens from `ra` (before t_end): same block table, consecutive positions — one
// sequence's chunk, [ra, end) — and the keys [lo, hi] its tokens see through `window` (0: all).
struct Run {
  int end, lo, hi;
};
__device__ __forceinline__ Run run_from(const kernels::TokenPlacement& tokens, int ra, int t_end, int window) {
  const int* table = tokens.block_tables[ra];
  int rb = ra + 1;
  while (rb < t_end && tokens.block_tables[rb] == table && tokens.positions[rb] == tokens.positions[rb - 1] + 1) ++rb;
  return {rb, window > 0 ? max(0, tokens.positions[ra] - window + 1) : 0, tokens.positions[rb - 1]};
}

// Folds one key (score s, value row v in storage T or f32) into the row's state.
template <typename V>
__device__ __forceinline__ void online_update(RowState& st, float s, const V* v, int vhd) {
  const int lane = threadIdx.x % kWarpSize;
  const float m_new = fmaxf(st.m, s);
  const float corr = expf(st.m - m_new), pe = expf(s - m_new);
  st.l = st.l * corr + pe;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < vhd) st.acc[i] = st.acc[i] * corr + pe * to_f32(v[d]);
  }
  st.m = m_new;
}

template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
decode_attention_kernel(float* out, const float* q, kernels::PagedLayerView kv, kernels::TokenPlacement tokens,
                        int n_q_heads, int q_per_kv, int window, float scale) {
  __shared__ float sm_m[kAttnWarps], sm_l[kAttnWarps];
  __shared__ float sm_acc[kAttnWarps][kMaxHeadDim];
  const int t = blockIdx.x, h = blockIdx.y, kvh = h / q_per_kv;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int hd = kv.head_dim, vhd = kv.v_head_dim;
  const int pos = tokens.positions[t];
  if (pos < 0) {  // Padding (kernels/abi.h): attends nothing. The whole block returns.
    for (int d = threadIdx.x; d < vhd; d += blockDim.x) out[(int64_t(t) * n_q_heads + h) * vhd + d] = 0.0f;
    return;
  }
  const int first = window > 0 ? max(0, pos - window + 1) : 0;
  const int* table = tokens.block_tables[t];
  const uint8_t* mask = tokens.block_mask ? tokens.block_mask + int64_t(t) * tokens.mask_stride : nullptr;
  const float* qh = q + (int64_t(t) * n_q_heads + h) * hd;
  float qr[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    qr[i] = d < hd ? qh[d] : 0.0f;
  }
  RowState st;
  for (int p = first + warp; p <= pos; p += kAttnWarps) {
    if (mask && !mask[p / kv.block_size]) continue;
    const T* kp = key_ptr<T>(kv, table, p, kvh);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < hd) dot += qr[i] * to_f32(kp[d]);
    }
    online_update(st, warp_sum(dot) * scale, value_ptr<T>(kv, table, p, kvh), vhd);
  }
  if (lane == 0) {
    sm_m[warp] = st.m;
    sm_l[warp] = st.l;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < vhd) sm_acc[warp][d] = st.acc[i];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m = fmaxf(m, sm_m[w]);
  float l = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) l += sm_l[w] * expf(sm_m[w] - m);
  float* oh = out + (int64_t(t) * n_q_heads + h) * vhd;
  for (int d = threadIdx.x; d < vhd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) o += sm_acc[w][d] * expf(sm_m[w] - m);
    oh[d] = o / l;
  }
}

// Block (x: tile of tq tokens, y: KV head, z: chunk of gq heads of its group). Row r of the
// tile is token t0 + r / gq, query head kvh * q_per_kv + z * gq + r % gq; warp w owns rows
// w, w + kAttnWarps, ... The tile's tokens are processed as runs (same block table,
// consecutive positions: one sequence's chunk); each run streams its key range once through
// shared memory for all its rows.
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
prefill_attention_kernel(float* out, const float* q, kernels::PagedLayerView kv, kernels::TokenPlacement tokens,
                         int n_q_heads, int q_per_kv, int gq, int tq, int window, float scale) {
  __shared__ float ks[kTileKeys][kMaxHeadDim];
  __shared__ float vs[kTileKeys][kMaxHeadDim];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int hd = kv.head_dim, vhd = kv.v_head_dim, kvh = blockIdx.y;
  const int t0 = blockIdx.x * tq;
  const int t_end = min(t0 + tq, tokens.num_tokens);

  float qr[kRowsPerWarp][kDimsPerLane];
  RowState st[kRowsPerWarp];
  int row_token[kRowsPerWarp], row_head[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = rr * kAttnWarps + warp;
    const int g = blockIdx.z * gq + r % gq;
    const int t = t0 + r / gq;
    const bool active = r < tq * gq && t < t_end && g < q_per_kv;
    row_token[rr] = active ? t : -1;
    row_head[rr] = kvh * q_per_kv + g;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      qr[rr][i] = active && d < hd ? q[(int64_t(t) * n_q_heads + row_head[rr]) * hd + d] : 0.0f;
    }
  }

  for (int ra = t0; ra < t_end;) {
    const int* table = tokens.block_tables[ra];
    const auto [rb, lo, hi] = run_from(tokens, ra, t_end, window);
    for (int kt = lo; kt <= hi; kt += kTileKeys) {
      __syncthreads();  // The previous tile is no longer read.
      const int n_keys = min(kTileKeys, hi - kt + 1);
      for (int e = threadIdx.x; e < n_keys * hd; e += blockDim.x)
        ks[e / hd][e % hd] = to_f32(key_ptr<T>(kv, table, kt + e / hd, kvh)[e % hd]);
      for (int e = threadIdx.x; e < n_keys * vhd; e += blockDim.x)
        vs[e / vhd][e % vhd] = to_f32(value_ptr<T>(kv, table, kt + e / vhd, kvh)[e % vhd]);
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int t = row_token[rr];
        if (t < ra || t >= rb) continue;
        const int pos = tokens.positions[t];
        const int first = window > 0 ? max(0, pos - window + 1) : 0;
        const uint8_t* mask = tokens.block_mask ? tokens.block_mask + int64_t(t) * tokens.mask_stride : nullptr;
        for (int j = 0; j < n_keys; ++j) {
          const int p = kt + j;
          if (p < first || p > pos || (mask && !mask[p / kv.block_size])) continue;
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < kDimsPerLane; ++i) {
            const int d = lane + i * kWarpSize;
            if (d < hd) dot += qr[rr][i] * ks[j][d];
          }
          online_update(st[rr], warp_sum(dot) * scale, vs[j], vhd);
        }
      }
    }
    ra = rb;
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int t = row_token[rr];
    if (t < 0) continue;
    float* oh = out + (int64_t(t) * n_q_heads + row_head[rr]) * vhd;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < vhd) oh[d] = st[rr].acc[i] / st[rr].l;
    }
  }
}

// Split-KV, GQA-grouped decode attention (flash-decoding). Block (x: token, y: KV head x chunk
// of its group's query heads, z: split of the key range) loads each K and V row once for its
// `g` query heads (up to kMaxGroup) over keys [z * keys_per_split, (z + 1) * keys_per_split) of
// the token's visible range, keys_per_split the token's own (ops.h); the block's warps take keys
// round-robin, then merge. With one split the block writes the output; otherwise its
// unnormalised state (m, l, acc) goes to `part` for merge_splits_kernel (l = 0 past the token's
// range).
constexpr int kMaxGroup = 8;

template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
split_decode_attention_kernel(float* out, float* part, const float* q, kernels::PagedLayerView kv,
                              kernels::TokenPlacement tokens, int n_q_heads, int q_per_kv, int g, int window,
                              float scale, int min_keys_per_split) {
  __shared__ float sm_m[kAttnWarps][kMaxGroup], sm_l[kAttnWarps][kMaxGroup];
  __shared__ float sm_acc[kAttnWarps][kMaxGroup][kMaxHeadDim];
  const int chunks = (q_per_kv + g - 1) / g;
  const int t = blockIdx.x, kvh = blockIdx.y / chunks, h0 = kvh * q_per_kv + (blockIdx.y % chunks) * g;
  const int heads = min(g, kvh * q_per_kv + q_per_kv - h0);
  const int split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int hd = kv.head_dim, vhd = kv.v_head_dim;
  const int pos = tokens.positions[t];
  const int first = window > 0 ? max(0, pos - window + 1) : 0;
  const int keys_per_split = max(min_keys_per_split, (pos - first + 1 + splits - 1) / splits);
  const int lo = first + split * keys_per_split, hi = min(pos, lo + keys_per_split - 1);
  const int* table = tokens.block_tables[t];
  const uint8_t* mask = tokens.block_mask ? tokens.block_mask + int64_t(t) * tokens.mask_stride : nullptr;
  float qr[kMaxGroup][kDimsPerLane];
  RowState st[kMaxGroup];
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j)
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      qr[j][i] = j < heads && d < hd ? q[(int64_t(t) * n_q_heads + h0 + j) * hd + d] : 0.0f;
    }
  for (int p = lo + warp; p <= hi; p += kAttnWarps) {
    if (mask && !mask[p / kv.block_size]) continue;
    const T* kp = key_ptr<T>(kv, table, p, kvh);
    const T* vp = value_ptr<T>(kv, table, p, kvh);
    float kr[kDimsPerLane];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      kr[i] = d < hd ? to_f32(kp[d]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kMaxGroup; ++j) {
      if (j < heads) {  // Not a break: the loop must unroll to keep st[] and qr[] in registers.
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) dot += qr[j][i] * kr[i];
        online_update(st[j], warp_sum(dot) * scale, vp, vhd);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxGroup; ++j) {
    if (j >= heads) continue;
    if (lane == 0) {
      sm_m[warp][j] = st[j].m;
      sm_l[warp][j] = st[j].l;
    }
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < vhd) sm_acc[warp][j][d] = st[j].acc[i];
    }
  }
  __syncthreads();
  for (int j = 0; j < heads; ++j) {
    float m = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) m = fmaxf(m, sm_m[w][j]);
    float l = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm_l[w][j] > 0.0f) l += sm_l[w][j] * expf(sm_m[w][j] - m);
    const int64_t row = int64_t(t) * n_q_heads + h0 + j;
    float* dst = splits == 1 ? out + row * vhd : part + (row * splits + split) * vhd;
    // A split past the token's keys (l = 0) leaves its partial unwritten: the merge skips it.
    for (int d = threadIdx.x; d < vhd && (splits == 1 || l > 0.0f); d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kAttnWarps; ++w)
        if (sm_l[w][j] > 0.0f) o += sm_acc[w][j][d] * expf(sm_m[w][j] - m);
      dst[d] = splits > 1 ? o : (l > 0.0f ? o / l : 0.0f);  // l = 0: padding, no keys.
    }
    if (splits > 1 && threadIdx.x == 0) {
      float* ml = part + int64_t(gridDim.x) * n_q_heads * splits * vhd;
      ml[2 * (row * splits + split)] = m;
      ml[2 * (row * splits + split) + 1] = l;
    }
  }
}

// out[t][h] from the splits' states: a split that saw no key has l = 0 and adds nothing (and a
// padding token, none of whose splits saw one, gets zeros).
__global__ void __launch_bounds__(kAttnThreads)
merge_splits_kernel(float* out, const float* part, int n_tokens, int n_q_heads, int splits, int vhd) {
  const int64_t row = int64_t(blockIdx.x) * n_q_heads + blockIdx.y;
  const float* ml = part + int64_t(n_tokens) * n_q_heads * splits * vhd + 2 * row * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s)
    if (ml[2 * s + 1] > 0.0f) m = fmaxf(m, ml[2 * s]);
  float l = 0.0f;
  for (int s = 0; s < splits; ++s)
    if (ml[2 * s + 1] > 0.0f) l += ml[2 * s + 1] * expf(ml[2 * s] - m);
  for (int d = threadIdx.x; d < vhd; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < splits; ++s)
      if (ml[2 * s + 1] > 0.0f) o += part[(row * splits + s) * vhd + d] * expf(ml[2 * s] - m);
    out[row * vhd + d] = l > 0.0f ? o / l : 0.0f;
  }
}

#if defined(PDSERVE_GPU_WMMA)
// Tensor-core prefill attention (FlashAttention-2's schedule on CUDA's warp matrix functions):
// the rows of prefill_attention_kernel's tile (token, query head of the group), 64 a block and
// 16 a warp, against K/V tiles of kMmaKeys keys in shared memory. S = Q·Kᵀ and O += P·V run on
// tensor cores with bf16 operands (Q, K, V and the probabilities P rounded to nearest even) and
// f32 accumulation; the online softmax is f32, two lanes a row, each over half the tile's keys.
// Fragments' element layout is unspecified, so S goes through shared memory to the softmax, and
// O lives there too (scaled by each tile's correction, then loaded as the accumulator of P·V).
constexpr int kMmaRows = kAttnWarps * 16;
constexpr int kMmaKeys = 32;

// 128-byte lines, so that the dynamic shared memory is aligned for wmma's 32-byte loads.
struct alignas(128) SharedLine {
  unsigned char bytes[128];
};

// Where the kernel's arrays lie in its dynamic shared memory, for head dims hd and vhd (each
// rounded up to 16, the rest zeros): row strides padded by 16 bytes (fewer bank conflicts; every
// 16-row block of a bf16 array still starts 32-byte aligned).
struct MmaShared {
  int dp, vp;                                   // Head dims rounded up to 16.
  int q_ld, k_ld, v_ld, s_ld, p_ld, o_ld;       // Row strides, in elements.
  int q_at, k_at, v_at, s_at, p_at, o_at, bytes;  // Byte offsets (128-aligned) and total size.
};
__host__ __device__ inline MmaShared mma_shared(int hd, int vhd) {
  MmaShared m{};
  m.dp = (hd + 15) / 16 * 16;
  m.vp = (vhd + 15) / 16 * 16;
  m.q_ld = m.k_ld = m.dp + 8;
  m.v_ld = m.vp + 8;
  m.s_ld = kMmaKeys + 4;
  m.p_ld = kMmaKeys + 8;
  m.o_ld = m.vp + 4;
  int at = 0;
  auto place = [&at](int bytes) {
    const int here = at;
    at += (bytes + 127) / 128 * 128;
    return here;
  };
  m.q_at = place(kMmaRows * m.q_ld * 2);
  m.k_at = place(kMmaKeys * m.k_ld * 2);
  m.v_at = place(kMmaKeys * m.v_ld * 2);
  m.s_at = place(kMmaRows * m.s_ld * 4);
  m.p_at = place(kMmaRows * m.p_ld * 2);
  m.o_at = place(kMmaRows * m.o_ld * 4);
  m.bytes = at;
  return m;
}

// One row of a K or V tile into shared memory by one warp: the `n` elements at `src` (storage
// T; none where src is null) rounded to bf16 into dst[0, n), zeros to dst[padded) (padded a
// multiple of 16, dst 16-byte aligned). A bf16 row whose length and address allow it moves 16
// bytes a lane and load.
template <typename T>
__device__ __forceinline__ void tile_row(gpu_bf16* dst, const T* src, int n, int padded, int lane) {
  if constexpr (std::is_same_v<T, gpu_bf16>) {
    if (src != nullptr && n % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
      const uint4 zeros = {0u, 0u, 0u, 0u};
      for (int d = lane * 8; d < padded; d += kWarpSize * 8)
        *reinterpret_cast<uint4*>(dst + d) = d < n ? *reinterpret_cast<const uint4*>(src + d) : zeros;
      return;
    }
  }
  for (int d = lane; d < padded; d += kWarpSize)
    dst[d] = from_f32<gpu_bf16>(src != nullptr && d < n ? to_f32(src[d]) : 0.0f);
}

// The grid and row mapping of prefill_attention_kernel (gq heads of a group by tq tokens a tile).
template <typename T>
__global__ void __launch_bounds__(kAttnThreads)
prefill_attention_mma_kernel(float* out, const float* q, kernels::PagedLayerView kv, kernels::TokenPlacement tokens,
                             int n_q_heads, int q_per_kv, int gq, int tq, int window, float scale) {
  namespace wmma = nvcuda::wmma;
  using Frag16 = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  PDSERVE_DYNAMIC_SHARED(SharedLine, shared);
  __shared__ int row_token[kMmaRows], row_head[kMmaRows];
  unsigned char* base = reinterpret_cast<unsigned char*>(shared);
  const MmaShared L = mma_shared(kv.head_dim, kv.v_head_dim);
  gpu_bf16* qs = reinterpret_cast<gpu_bf16*>(base + L.q_at);
  gpu_bf16* ks = reinterpret_cast<gpu_bf16*>(base + L.k_at);
  gpu_bf16* vs = reinterpret_cast<gpu_bf16*>(base + L.v_at);
  float* ss = reinterpret_cast<float*>(base + L.s_at);
  gpu_bf16* ps = reinterpret_cast<gpu_bf16*>(base + L.p_at);
  float* os = reinterpret_cast<float*>(base + L.o_at);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int hd = kv.head_dim, vhd = kv.v_head_dim, kvh = blockIdx.y;
  const int t0 = blockIdx.x * tq;
  const int t_end = min(t0 + tq, tokens.num_tokens);

  for (int r = threadIdx.x; r < kMmaRows; r += blockDim.x) {
    const int g = blockIdx.z * gq + r % gq;
    const int t = t0 + r / gq;
    row_token[r] = r < tq * gq && t < t_end && g < q_per_kv ? t : -1;
    row_head[r] = kvh * q_per_kv + g;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kMmaRows * L.dp; e += blockDim.x) {
    const int r = e / L.dp, d = e % L.dp, t = row_token[r];
    qs[r * L.q_ld + d] =
        from_f32<gpu_bf16>(t >= 0 && d < hd ? q[(int64_t(t) * n_q_heads + row_head[r]) * hd + d] : 0.0f);
  }
  for (int e = threadIdx.x; e < kMmaRows * L.vp; e += blockDim.x) os[(e / L.vp) * L.o_ld + e % L.vp] = 0.0f;

  // This lane's row (shared with the next or previous lane) and half of each key tile.
  const int my_row = warp * 16 + lane / 2, half = lane % 2;
  const int my_t = row_token[my_row];
  const int my_pos = my_t >= 0 ? tokens.positions[my_t] : -1;
  const int my_first = window > 0 ? max(0, my_pos - window + 1) : 0;
  const uint8_t* my_mask =
      my_t >= 0 && tokens.block_mask ? tokens.block_mask + int64_t(my_t) * tokens.mask_stride : nullptr;
  float m_run = -INFINITY, l_run = 0.0f;
  const gpu_bf16* q_warp = qs + warp * 16 * L.q_ld;
  float* s_warp = ss + warp * 16 * L.s_ld;
  const gpu_bf16* p_warp = ps + warp * 16 * L.p_ld;
  float* o_warp = os + warp * 16 * L.o_ld;

  for (int ra = t0; ra < t_end;) {
    const int* table = tokens.block_tables[ra];
    const auto [rb, lo, hi] = run_from(tokens, ra, t_end, window);
    const bool my_run = my_t >= ra && my_t < rb;
    for (int kt = lo; kt <= hi; kt += kMmaKeys) {
      __syncthreads();  // Every warp is done with the previous tile's K, V and its own O.
      const int n_keys = min(kMmaKeys, hi - kt + 1);
      // A warp a row. Zeros past the run's keys and the head dims: a zero V row times P = 0 adds
      // nothing.
      for (int j = warp; j < kMmaKeys; j += kAttnWarps) {
        const bool key = j < n_keys;
        tile_row(ks + j * L.k_ld, key ? key_ptr<T>(kv, table, kt + j, kvh) : nullptr, hd, L.dp, lane);
        tile_row(vs + j * L.v_ld, key ? value_ptr<T>(kv, table, kt + j, kvh) : nullptr, vhd, L.vp, lane);
      }
      __syncthreads();

      // S = Q·Kᵀ for the warp's 16 rows.
      Frag16 s_acc[kMmaKeys / 16];
#pragma unroll
      for (int n = 0; n < kMmaKeys / 16; ++n) wmma::fill_fragment(s_acc[n], 0.0f);
      for (int c = 0; c < L.dp / 16; ++c) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, gpu_bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, q_warp + c * 16, L.q_ld);
#pragma unroll
        for (int n = 0; n < kMmaKeys / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, gpu_bf16, wmma::col_major> b;
          wmma::load_matrix_sync(b, ks + n * 16 * L.k_ld + c * 16, L.k_ld);
          wmma::mma_sync(s_acc[n], a, b, s_acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kMmaKeys / 16; ++n)
        wmma::store_matrix_sync(s_warp + n * 16, s_acc[n], L.s_ld, wmma::mem_row_major);
      __syncwarp();

      // Online softmax of this lane's half row: P (bf16) for the tile, O's rows rescaled.
      constexpr int kHalfKeys = kMmaKeys / 2;
      float sv[kHalfKeys];
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kHalfKeys; ++i) {
        const int j = half * kHalfKeys + i, p = kt + j;
        const bool visible = my_run && j < n_keys && p >= my_first && p <= my_pos &&
                             !(my_mask && !my_mask[p / kv.block_size]);
        sv[i] = visible ? ss[my_row * L.s_ld + j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, sv[i]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_new = fmaxf(m_run, tile_max);
      // No visible key yet: nothing to rescale (and -inf - -inf would be NaN).
      const float corr = m_new == -INFINITY ? 1.0f : expf(m_run - m_new);
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kHalfKeys; ++i) {
        const float pe = sv[i] == -INFINITY ? 0.0f : expf(sv[i] - m_new);
        ps[my_row * L.p_ld + half * kHalfKeys + i] = from_f32<gpu_bf16>(pe);
        tile_sum += pe;
      }
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
      // l sums the unrounded probabilities, O the bf16 ones (as FlashAttention-2 does): a bias
      // within P's rounding.
      l_run = l_run * corr + tile_sum;
      m_run = m_new;
      for (int d = half; d < L.vp; d += 2) os[my_row * L.o_ld + d] *= corr;
      __syncwarp();

      // O += P·V, a 16-column slice of O at a time.
      for (int c = 0; c < L.vp / 16; ++c) {
        Frag16 o_acc;
        wmma::load_matrix_sync(o_acc, o_warp + c * 16, L.o_ld, wmma::mem_row_major);
#pragma unroll
        for (int n = 0; n < kMmaKeys / 16; ++n) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, gpu_bf16, wmma::row_major> pa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, gpu_bf16, wmma::row_major> vb;
          wmma::load_matrix_sync(pa, p_warp + n * 16, L.p_ld);
          wmma::load_matrix_sync(vb, vs + n * 16 * L.v_ld + c * 16, L.v_ld);
          wmma::mma_sync(o_acc, pa, vb, o_acc);
        }
        wmma::store_matrix_sync(o_warp + c * 16, o_acc, L.o_ld, wmma::mem_row_major);
      }
    }
    ra = rb;
  }

  __syncwarp();  // O's last stores are other lanes'.
  if (my_t < 0) return;
  float* oh = out + (int64_t(my_t) * n_q_heads + row_head[my_row]) * vhd;
  for (int d = half; d < vhd; d += 2) oh[d] = l_run > 0.0f ? os[my_row * L.o_ld + d] / l_run : 0.0f;
}
#endif  // PDSERVE_GPU_WMMA

void check_dims(const char* kernel, const kernels::PagedLayerView& kv) {
  if (kv.head_dim > kMaxHeadDim || kv.v_head_dim > kMaxHeadDim)
    kernel_limit_exceeded(kernel, "head dim above 256");
}

// The most keys a token at a position up to max_position sees through `window` (0: all).
int visible_keys(int max_position, int window) {
  return window > 0 && window < max_position + 1 ? window : max_position + 1;
}

}  // namespace

void paged_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                     const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                     gpuStream_t stream) {
  if (tokens.num_tokens <= 0) return;
  check_dims("paged_attention", kv);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(decode_attention_kernel<T>, dim3(tokens.num_tokens, n_q_heads), kAttnThreads, 0, stream, out, q, kv,
               tokens, n_q_heads, q_per_kv, window, scale);
  });
}

int decode_splits(int max_position, int window) {
  // Enough blocks to fill a large GPU at batch 1 (132 SMs / 8 KV heads ~ 16 splits), keys per
  // split no fewer than 128 so that a split's fixed cost stays small.
  const int splits = (visible_keys(max_position, window) + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  return splits < 1 ? 1 : (splits > kMaxDecodeSplits ? kMaxDecodeSplits : splits);
}

size_t split_decode_scratch_floats(int num_tokens, int n_q_heads, int v_head_dim, int splits) {
  return splits <= 1 ? 0 : size_t(num_tokens) * n_q_heads * splits * (v_head_dim + 2);
}

void split_decode_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                            const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                            int splits, int min_keys_per_split, float* scratch, gpuStream_t stream) {
  if (tokens.num_tokens <= 0) return;
  check_dims("split_decode_attention", kv);
  if (splits < 1 || splits > kMaxDecodeSplits) kernel_limit_exceeded("split_decode_attention", "splits out of range");
  if (min_keys_per_split < 1) kernel_limit_exceeded("split_decode_attention", "fewer than one key a split");
  const int g = q_per_kv < kMaxGroup ? q_per_kv : kMaxGroup;
  const int chunks = (q_per_kv + g - 1) / g;
  const dim3 grid(tokens.num_tokens, (n_q_heads / q_per_kv) * chunks, splits);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(split_decode_attention_kernel<T>, grid, kAttnThreads, 0, stream, out, scratch, q, kv, tokens,
               n_q_heads, q_per_kv, g, window, scale, min_keys_per_split);
  });
  if (splits > 1)
    gpu_launch(merge_splits_kernel, dim3(tokens.num_tokens, n_q_heads), kAttnThreads, 0, stream, out, scratch,
               tokens.num_tokens, n_q_heads, splits, kv.v_head_dim);
}

void prefill_attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                       const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale,
                       gpuStream_t stream) {
  if (tokens.num_tokens <= 0) return;
  check_dims("prefill_attention", kv);
  const int gq = q_per_kv < kTileRows ? q_per_kv : kTileRows;
  const int tq = kTileRows / gq;
  const dim3 grid((tokens.num_tokens + tq - 1) / tq, n_q_heads / q_per_kv, (q_per_kv + gq - 1) / gq);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gpu_launch(prefill_attention_kernel<T>, grid, kAttnThreads, 0, stream, out, q, kv, tokens, n_q_heads,
                                                                   q_per_kv, gq, tq, window, scale);
  });
}

void prefill_attention_bf16(float* out, const float* q, const kernels::PagedLayerView& kv,
                            const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                            float scale, gpuStream_t stream) {
#if defined(PDSERVE_GPU_WMMA)
  if (tokens.num_tokens <= 0) return;
  check_dims("prefill_attention_bf16", kv);
  const MmaShared L = mma_shared(kv.head_dim, kv.v_head_dim);
  const int gq = q_per_kv < kMmaRows ? q_per_kv : kMmaRows;
  const int tq = kMmaRows / gq;
  const dim3 grid((tokens.num_tokens + tq - 1) / tq, n_q_heads / q_per_kv, (q_per_kv + gq - 1) / gq);
  dispatch_storage(kv.storage, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // Per launch: the opt-in is the current device's, and a rank thread may drive any device.
    if (allow_dynamic_shared(prefill_attention_mma_kernel<T>, size_t(L.bytes)) != gpuSuccess) {
      (void)gpuGetLastError();  // Answered here: not a failed kernel for the next synchronize.
      prefill_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, stream);
      return;
    }
    gpu_launch(prefill_attention_mma_kernel<T>, grid, kAttnThreads, size_t(L.bytes), stream, out, q, kv, tokens,
               n_q_heads, q_per_kv, gq, tq, window, scale);
  });
#else
  prefill_attention(out, q, kv, tokens, n_q_heads, q_per_kv, window, scale, stream);
#endif
}

}  // namespace pdserve::kernels::gpu
