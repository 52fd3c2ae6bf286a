#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/lanes.h"
#include "kernels/cpu/ops.h"

namespace pdserve::kernels::cpu {
namespace {

// The view's K and V parts as f32: the reference's caches are f32 (a 16-bit view is a GPU
// kernel's), and a caller handing it another storage made a programming error.
std::pair<float*, float*> f32_parts(const PagedLayerView& kv, const char* kernel) {
  if (kv.storage != Storage::kF32) {
    std::fprintf(stderr, "pdserve cpu kernel %s: a KV view of %d-byte elements; the reference takes f32\n", kernel,
                 storage_bytes(kv.storage));
    std::abort();
  }
  return {static_cast<float*>(kv.k), static_cast<float*>(kv.v)};
}

}  // namespace

void paged_kv_write(const PagedLayerView& kv, const TokenPlacement& tokens, const float* k,
                    int64_t k_row_stride, const float* v, int64_t v_row_stride, int n_kv_heads) {
  const auto [k_base, v_base] = f32_parts(kv, "paged_kv_write");
  for (int t = 0; t < tokens.num_tokens; ++t) {
    const int pos = tokens.positions[t];
    const int block = tokens.block_tables[t][pos / kv.block_size];
    const int slot = pos % kv.block_size;
    for (int h = 0; h < n_kv_heads; ++h) {
      float* kd = k_base + block * kv.k_block_stride + slot * kv.k_token_stride + h * kv.k_head_stride;
      std::memcpy(kd, k + t * k_row_stride + int64_t(h) * kv.head_dim, sizeof(float) * kv.head_dim);
      if (v_base == nullptr) continue;
      float* vd = v_base + block * kv.v_block_stride + slot * kv.v_token_stride + h * kv.v_head_stride;
      std::memcpy(vd, v + t * v_row_stride + int64_t(h) * kv.v_head_dim, sizeof(float) * kv.v_head_dim);
    }
  }
}

void qkv_rope_write(float* q_out, const QkvRows& rows, const RopeTable& rope, const PagedLayerView& kv,
                    const TokenPlacement& tokens) {
  const int hd = kv.head_dim, vd = kv.v_head_dim, nq = rows.n_q_heads, nkv = rows.n_kv_heads;
  const int64_t q_width = int64_t(nq) * hd, k_width = int64_t(nkv) * hd, v_width = int64_t(nkv) * vd;
  // One token's K and V on their way into the cache: kept per thread (each rank's), so that a
  // step's layers allocate nothing.
  thread_local std::vector<float> k, v;
  k.resize(size_t(k_width));
  v.resize(size_t(v_width));
  // A head's bias, norm and rotation, as the separate kernels compute them on a one-row batch.
  auto finish = [&](float* x, int heads, const float* bias, const float* norm, int position) {
    if (bias) add_bias(x, bias, 1, heads * hd);
    if (norm) rms_norm(x, x, norm, heads, hd, rows.norm_eps);
    cpu::rope(x, 1, int64_t(heads) * hd, heads, hd, &position, rope.inv_freq, rope.attention_scale, rope.rotate_half);
  };
  for (int t = 0; t < tokens.num_tokens; ++t) {
    const int position = tokens.positions[t];
    float* q = q_out + t * q_width;
    std::copy_n(rows.q + t * rows.q_stride, q_width, q);
    finish(q, nq, rows.q_bias, rows.q_norm, position);
    std::copy_n(rows.k + t * rows.k_stride, k_width, k.data());
    finish(k.data(), nkv, rows.k_bias, rows.k_norm, position);
    std::copy_n(rows.v + t * rows.v_stride, v_width, v.data());
    if (rows.v_bias) add_bias(v.data(), rows.v_bias, 1, int(v_width));
    TokenPlacement one = tokens;
    one.num_tokens = 1;
    one.positions += t;
    one.block_tables += t;
    paged_kv_write(kv, one, k.data(), k_width, v.data(), v_width, nkv);
  }
}

namespace {

// The lane sums of q · K[row] (finish_lanes' lanes: the remainder added in scalar, in order).
[[gnu::always_inline]] inline Lanes key_lanes(const float* q, const float* k, int n) {
  Lanes acc = {};
  const int whole = n - n % kLanes;
  for (int d = 0; d < whole; d += kLanes) acc += load_lanes(q + d) * load_lanes(k + d);
  return whole == n ? acc : add_remainder(acc, q, k, whole, n);
}

}  // namespace

PDSERVE_CPU_CLONES void paged_attention(float* out, const float* q, const PagedLayerView& kv,
                                        const TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                                        float scale) {
  const auto [k_base, v_base] = f32_parts(kv, "paged_attention");
  std::vector<float> scores;
  // Per position the offsets of its K and V rows (head 0), -1 where the mask hides it: walked
  // block by block once per token, not divided out per key and head.
  std::vector<int64_t> k_at, v_at;
  for (int t = 0; t < tokens.num_tokens; ++t) {
    const int pos = tokens.positions[t];
    const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
    const int count = pos - first + 1;
    const int* table = tokens.block_tables[t];
    const uint8_t* mask = tokens.block_mask ? tokens.block_mask + int64_t(t) * tokens.mask_stride : nullptr;
    scores.resize(count);
    k_at.resize(count);
    v_at.resize(count);
    for (int j = 0, block = first / kv.block_size, slot = first % kv.block_size; j < count; ++j) {
      const bool visible = mask == nullptr || mask[block] != 0;
      k_at[j] = visible ? table[block] * kv.k_block_stride + slot * kv.k_token_stride : -1;
      v_at[j] = visible ? table[block] * kv.v_block_stride + slot * kv.v_token_stride : -1;
      if (++slot == kv.block_size) slot = 0, ++block;
    }
    for (int h = 0; h < n_q_heads; ++h) {
      const int kvh = h / q_per_kv;
      const float* qh = q + int64_t(t) * n_q_heads * kv.head_dim + int64_t(h) * kv.head_dim;
      const float* kh = k_base + kvh * kv.k_head_stride;
      // Scores eight keys at a time (reduce_lanes_x8), then one by one; each is the
      // dot_lanes(q, K[j]) * scale of a key alone.
      int j = 0;
      for (; j + kLanes <= count; j += kLanes) {
        Lanes acc[kLanes];
        for (int s = 0; s < kLanes; ++s) {
          const int64_t at = k_at[j + kReduceSlotKey[s]];
          acc[s] = at < 0 ? Lanes{} : key_lanes(qh, kh + at, kv.head_dim);
        }
        const Lanes dots = reduce_lanes_x8(acc);
        for (int i = 0; i < kLanes; ++i) scores[j + i] = k_at[j + i] < 0 ? -INFINITY : dots[i] * scale;
      }
      for (; j < count; ++j)
        scores[j] = k_at[j] < 0 ? -INFINITY : dot_lanes(qh, kh + k_at[j], kv.head_dim) * scale;
      float max_score = -INFINITY;
      for (int i = 0; i < count; ++i) max_score = std::max(max_score, scores[i]);
      float sum = 0.0f;
      for (int i = 0; i < count; ++i) {
        scores[i] = std::exp(scores[i] - max_score);
        sum += scores[i];
      }
      for (int i = 0; i < count; ++i) scores[i] /= sum;  // The weights.
      // out = Σ_j w_j V[j] in order of j, eight columns at a time in registers.
      float* oh = out + int64_t(t) * n_q_heads * kv.v_head_dim + int64_t(h) * kv.v_head_dim;
      const float* vh = v_base + kvh * kv.v_head_stride;
      int d = 0;
      for (; d + kLanes <= kv.v_head_dim; d += kLanes) {
        Lanes o = {};
        for (int i = 0; i < count; ++i)
          if (v_at[i] >= 0) o += scores[i] * load_lanes(vh + v_at[i] + d);
        __builtin_memcpy(oh + d, &o, sizeof(o));
      }
      for (; d < kv.v_head_dim; ++d) {
        float o = 0.0f;
        for (int i = 0; i < count; ++i)
          if (v_at[i] >= 0) o += scores[i] * vh[v_at[i] + d];
        oh[d] = o;
      }
    }
  }
}

void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                         const PagedLayerView& index_view, const TokenPlacement& tokens, int top_k) {
  const float* keys = f32_parts(index_view, "index_select_blocks").first;
  const int bs = index_view.block_size, hd = index_view.head_dim;
  std::vector<std::pair<float, int>> block_scores;
  for (int t = 0; t < tokens.num_tokens; ++t) {
    const int pos = tokens.positions[t];
    const int* table = tokens.block_tables[t];
    const float* qi = q_index + int64_t(t) * hd;
    uint8_t* mask = block_mask + int64_t(t) * mask_stride;
    std::fill(mask, mask + mask_stride, 0);
    const int own = pos / bs;
    block_scores.clear();
    for (int b = 0; b < own; ++b) {
      float best = -INFINITY;
      for (int slot = 0; slot < bs; ++slot) {
        const float* kj = keys + table[b] * index_view.k_block_stride + slot * index_view.k_token_stride;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += qi[d] * kj[d];
        best = std::max(best, dot);
      }
      block_scores.push_back({best, b});
    }
    const int keep = std::min<int>(top_k, int(block_scores.size()));
    std::partial_sort(block_scores.begin(), block_scores.begin() + keep, block_scores.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    for (int i = 0; i < keep; ++i) mask[block_scores[i].second] = 1;
    mask[own] = 1;
  }
}

}  // namespace pdserve::kernels::cpu
