// Paged KV cache kernels on CPU: writing new tokens' K/V into their blocks and causal
// attention over blocks. The caller describes one layer's cache on one rank as plain strides
// (derived from engine::KvCacheLayout), so any layout the per-layer spec allows — separate or
// interleaved K/V, token- or head-major blocks — is read through the same code. The views'
// storage is f32 (the reference's numerics); other storages are the GPU kernels'.
#pragma once

#include <cstdint>

#include "kernels/abi.h"

namespace pdserve::kernels::cpu {

// Stores K (and V) rows of `n_kv_heads` heads for each token into its block and slot.
void paged_kv_write(const PagedLayerView& kv, const TokenPlacement& tokens, const float* k,
                    int64_t k_row_stride, const float* v, int64_t v_row_stride, int n_kv_heads);

// Attention's input stage of one layer, in one pass over the step's tokens: each Q and K head
// gets its bias, its head norm and RoPE at the token's position (add_bias, rms_norm and rope of
// kernels/cpu/ops.h, in that order, with their results); roped Q goes to q_out, compact rows of
// n_q_heads*head_dim, and K and V (V with its bias) into the token's block and slot as
// paged_kv_write stores them. Q and K heads are kv.head_dim wide, V heads kv.v_head_dim.
void qkv_rope_write(float* q_out, const QkvRows& rows, const RopeTable& rope, const PagedLayerView& kv,
                    const TokenPlacement& tokens);

// out[t][h] = softmax(q[t][h] · K[j] * scale) · V[j] over the positions j the token sees:
// (positions[t] - window, positions[t]] (window 0 = from 0). Query head h reads KV head
// h / q_per_kv. q rows hold n_q_heads*head_dim, out rows n_q_heads*v_head_dim.
void paged_attention(float* out, const float* q, const PagedLayerView& kv,
                     const TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                     float scale);

// For each token, scores every logical block it can see by the best match between its index
// query (q_index row t, `index_view.head_dim` wide) and the index keys of the block's visible
// positions, and marks in `block_mask` (row stride `mask_stride`) the `top_k` best blocks —
// ties to the earlier block — plus the token's own block. This is how a sparse-attention layer
// uses its key-only index cache: what the cache holds decides what the layer attends to.
void index_select_blocks(uint8_t* block_mask, int mask_stride, const float* q_index,
                         const PagedLayerView& index_view, const TokenPlacement& tokens, int top_k);

}  // namespace pdserve::kernels::cpu
