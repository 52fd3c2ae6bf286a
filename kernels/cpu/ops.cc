#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <cmath>

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

void rope(float* x, int rows, int64_t row_stride, int n_heads, int head_dim, const int* positions,
          float theta, bool rotate_half) {
  const int half = head_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const float pos = float(positions[r]);
    for (int i = 0; i < half; ++i) {
      // Frequency of pair i: theta^(-2i/head_dim), as both conventions define it.
      const float freq = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
      const float angle = pos * freq;
      const float c = std::cos(angle), s = std::sin(angle);
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

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void matmul_xwt(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw,
                bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, int(ldw),
              accumulate ? 1.0f : 0.0f, y, out);
}

void add_bias(float* y, const float* bias, int rows, int out) {
  for (int r = 0; r < rows; ++r) add_inplace(y + int64_t(r) * out, bias, out);
}

}  // namespace pdserve::kernels::cpu
