#include "kernels/cpu/ops.h"

#include <cmath>

#include "kernels/cpu/lanes.h"

namespace pdserve::kernels::cpu {

void rms_norm(float* out, const float* in, const float* weight, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* x = in + int64_t(r) * dim;
    float* y = out + int64_t(r) * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
    const float scale = 1.0f / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) y[i] = weight[i] * (scale * x[i]);
  }
}

void gather_rms_norm(float* out, const float* in, const int* row_ids, const float* weight, int rows, int dim,
                     float eps) {
  for (int r = 0; r < rows; ++r) rms_norm(out + int64_t(r) * dim, in + int64_t(row_ids[r]) * dim, weight, 1, dim, eps);
}

void add_rms_norm(float* out, float* x, const float* residual, const float* weight, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    float* xr = x + int64_t(r) * dim;
    const float* res = residual + int64_t(r) * dim;
    for (int i = 0; i < dim; ++i) xr[i] += res[i];
    rms_norm(out + int64_t(r) * dim, xr, weight, 1, dim, eps);
  }
}

void rope(float* x, int rows, int64_t row_stride, int n_heads, int head_dim, const int* positions,
          const float* inv_freq, float attention_scale, bool rotate_half) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = float(positions[r]);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[i];
      const float c = std::cos(angle) * attention_scale, s = std::sin(angle) * attention_scale;
      for (int h = 0; h < n_heads; ++h) {
        float* head = x + r * row_stride + int64_t(h) * head_dim;
        float* a = rotate_half ? head + i : head + 2 * i;
        float* b = rotate_half ? head + i + half : head + 2 * i + 1;
        const float v0 = *a, v1 = *b;
        *a = v0 * c - v1 * s;
        *b = v0 * s + v1 * c;
      }
    }
  }
}

void silu_mul(float* out, const float* gate, const float* up, int rows, int cols, int64_t in_stride) {
  for (int r = 0; r < rows; ++r) {
    const float* g = gate + r * in_stride;
    const float* u = up + r * in_stride;
    float* y = out + int64_t(r) * cols;
    for (int c = 0; c < cols; ++c) y[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

namespace {

// Rows (of x) and columns (rows of w) per tile: each loaded element of w serves kTileRows rows,
// each of x tile_cols(R) columns. A single row (decode's GEMV) streams w from memory: 8 rows of
// w at a time read about 1.5x faster than 4 (measured on the 2-core dev machine: ~36 vs ~24
// GB/s on one core); several rows of x share each loaded w in 4x4 tiles (16 accumulators: all
// of AVX2's vector registers, so some spill there; AVX-512's 32 hold them: lanes.h's clones).
constexpr int kTileRows = 4;
constexpr int tile_cols(int rows) { return rows == 1 ? 8 : 4; }

// y[r][o] for R rows of x and C columns, with exactly the operations of every other tile shape:
// the value of one output element never depends on its neighbours in the call.
template <int R, int C>
[[gnu::always_inline]] inline void dot_tile(float* y, int64_t ldy, const float* x, const float* w, int in, int64_t ldw, bool accumulate) {
  Lanes acc[R][C] = {};
  const int whole = in - in % kLanes;
  for (int k = 0; k < whole; k += kLanes) {
    Lanes wk[C];
    for (int c = 0; c < C; ++c) wk[c] = load_lanes(w + int64_t(c) * ldw + k);
    for (int r = 0; r < R; ++r) {
      const Lanes xk = load_lanes(x + int64_t(r) * in + k);
      for (int c = 0; c < C; ++c) acc[r][c] += xk * wk[c];
    }
  }
  if constexpr (R * C % kLanes == 0) {
    // Eight outputs reduced at once (reduce_lanes_x8: the same tree, so the same bits as
    // finish_lanes on each), after the remainder's products join their lanes.
    Lanes* flat = &acc[0][0];
    if (whole != in)
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = add_remainder(acc[r][c], x + int64_t(r) * in, w + int64_t(c) * ldw, whole, in);
    for (int g = 0; g < R * C; g += kLanes) {
      Lanes slots[kLanes];
      for (int s = 0; s < kLanes; ++s) slots[s] = flat[g + kReduceSlotKey[s]];
      const Lanes sums = reduce_lanes_x8(slots);
      for (int i = 0; i < kLanes; ++i) {
        float& out = y[(g + i) / C * ldy + (g + i) % C];
        out = accumulate ? out + sums[i] : sums[i];
      }
    }
  } else {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        const float sum = finish_lanes(acc[r][c], x + int64_t(r) * in, w + int64_t(c) * ldw, whole, in);
        y[r * ldy + c] = accumulate ? y[r * ldy + c] + sum : sum;
      }
  }
}

// Columns [begin, end) of R rows of y (row stride `out`).
template <int R>
[[gnu::always_inline]] inline void dot_rows(float* y, const float* x, const float* w, int out, int begin, int end,
                                            int in, int64_t ldw, bool accumulate) {
  int o = begin;
  constexpr int C = tile_cols(R);
  for (; o + C <= end; o += C) dot_tile<R, C>(y + o, out, x, w + int64_t(o) * ldw, in, ldw, accumulate);
  for (; o < end; ++o) dot_tile<R, 1>(y + o, out, x, w + int64_t(o) * ldw, in, ldw, accumulate);
}

}  // namespace

PDSERVE_CPU_CLONES void matmul_xwt_columns(float* y, const float* x, const float* w, int rows, int out, int in,
                                           int64_t ldw, int begin, int end, bool accumulate) {
  int r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    dot_rows<kTileRows>(y + int64_t(r) * out, x + int64_t(r) * in, w, out, begin, end, in, ldw, accumulate);
  for (; r < rows; ++r) dot_rows<1>(y + int64_t(r) * out, x + int64_t(r) * in, w, out, begin, end, in, ldw, accumulate);
}

void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw, bool accumulate) {
  matmul_xwt_columns(y, x, w, rows, out, in, ldw, 0, out, accumulate);
}

void add_bias(float* y, const float* bias, int rows, int out) {
  for (int r = 0; r < rows; ++r) add_inplace(y + int64_t(r) * out, bias, out);
}

}  // namespace pdserve::kernels::cpu
