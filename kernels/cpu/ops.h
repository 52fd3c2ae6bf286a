// The CPU reference kernels (fp32): the numerics every other backend is tested against, in
// the manner of llama.cpp's test-backend-ops. Free functions over plain pointers so that GPU
// kernels can mirror their signatures one to one.
#pragma once

#include <cstdint>

namespace pdserve::kernels::cpu {

// out[r] = in[r] / rms(in[r]) * weight, for `rows` rows of `dim`.
void rms_norm(float* out, const float* in, const float* weight, int rows, int dim, float eps);

// out[r] = rms_norm(in[row_ids[r]]) for `rows` rows of `dim`: rows picked out of a larger
// matrix and normed in one call, with the bits of copying them out and norming the copies.
void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* weight, int rows, int dim,
                     float eps);

// x += residual, then out = rms_norm(x): add_inplace and rms_norm row by row (the row still in
// cache for the norm), with the same results.
void add_rms_norm(float* out, float* x, const float* residual, const float* weight, int rows, int dim, float eps);

// Rotates each head of `rows` rows in place by RoPE at the row's position. Row r starts at
// x + r*row_stride and holds `n_heads` heads of `head_dim`. Pair i turns by position *
// inv_freq[i] (head_dim/2 entries: engine/rope_scaling.h's table, scaling included), its cos and
// sin multiplied by `attention_scale` (yarn; 1 otherwise). `rotate_half` pairs (i, i+hd/2)
// (Hugging Face) instead of adjacent (2i, 2i+1) (llama2.c/Meta).
void rope(float* x, int rows, int64_t row_stride, int n_heads, int head_dim, const int* positions,
          const float* inv_freq, float attention_scale, bool rotate_half);

// SwiGLU's product: out[r][c] = silu(gate[r][c]) * up[r][c] for `rows` rows of `cols`, out
// compact and gate's and up's rows `in_stride` apart (the halves of a fused gate_up GEMM's rows,
// or buffers of their own). out may be gate when in_stride is cols.
void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride);

// x[i] += y[i].
void add_inplace(float* x, const float* y, int64_t n);

// y[rows][out] = x[rows][in] · w^T, with w an [out][in] matrix whose rows are `ldw` apart
// (a column slice of a wider matrix has ldw > in). Accumulates into y when `accumulate`.
// Batch-invariant: y[r][o] is the same float, bit for bit, whatever `rows` is and whatever the
// other rows hold, so a sequence's greedy tokens never depend on what it was batched with, nor
// on whether a position was computed in a prefill or a decode step (BLAS libraries choose their
// kernels, and so their summation orders, by matrix shape: ties between top logits then flip).
void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw,
                bool accumulate = false);

// matmul_xwt's columns [begin, end) of y alone (the others untouched), with the same bits: the
// threads of one rank split a product's columns between them.
void matmul_xwt_columns(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw, int begin,
                        int end, bool accumulate = false);

// y[r][o] += bias[o].
void add_bias(float* y, const float* bias, int rows, int out);

}  // namespace pdserve::kernels::cpu
