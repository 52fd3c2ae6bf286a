// A CPU emulation of CUDA's warp matrix functions (nvcuda::wmma of <mma.h>) for the one shape the
// kernels use, m16n16k16 with 16-bit inputs and f32 accumulators, so that a tensor-core kernel's
// own code runs in CI against the CPU reference (kernels/gpu/emulation/simt.h runs the lanes).
//
// Which lane holds which elements of a fragment is left unspecified by CUDA, and a kernel must
// rely on none: here lane l holds row l / 2 of the tile and, of B and accumulator tiles, the
// eight columns from (l % 2) · 8 — another distribution than a GPU's, so that a kernel reading
// fragment elements by position computes something else here. Loads and stores are not
// barriers: each lane reads and writes only its own elements, as on a GPU, so a kernel that
// loads what other lanes stored with no barrier between reads stale values here (an emulated
// shuffle is a warp barrier, though, which a GPU's is not: one between hides a missing
// __syncwarp). The
// documented preconditions abort with a message: 32-byte aligned pointers, ldm a multiple of
// 16 bytes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "kernels/gpu/emulation/simt.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emulated {

inline unsigned lane() {
  return pdserve::kernels::gpu::simt::linear_thread() % pdserve::kernels::gpu::simt::kWarpLanes;
}
inline unsigned row() { return lane() / 2; }
inline unsigned first_column() { return (lane() % 2) * 8; }

inline float widen(float x) { return x; }
inline float widen(gpu_emulated_bf16 x) { return __bfloat162float(x); }
inline float widen(gpu_emulated_f16 x) { return __half2float(x); }

template <typename T>
void check_operand(const T* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (ldm * sizeof(T)) % 16 != 0) {
    std::fprintf(stderr, "gpu emulation: a wmma pointer not 32-byte aligned or an ldm not a multiple of 16 bytes\n");
    std::abort();
  }
}

}  // namespace emulated

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment;

// A's row of this lane, all 16 k.
template <typename T, typename Layout>
struct fragment<matrix_a, 16, 16, 16, T, Layout> {
  static constexpr int num_elements = 16;
  T x[num_elements];
};
// B's eight columns of this lane, all 16 k: B[k][first_column() + j] at x[k * 8 + j].
template <typename T, typename Layout>
struct fragment<matrix_b, 16, 16, 16, T, Layout> {
  static constexpr int num_elements = 128;
  T x[num_elements];
};
// The lane's row, its eight columns.
template <typename T>
struct fragment<accumulator, 16, 16, 16, T, void> {
  static constexpr int num_elements = 8;
  T x[num_elements];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T value) {
  for (T& e : f.x) e = value;
}

template <typename T, typename Layout>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, Layout>& a, const T* p, unsigned ldm) {
  emulated::check_operand(p, ldm);
  const unsigned r = emulated::row();
  for (unsigned k = 0; k < 16; ++k) a.x[k] = std::is_same_v<Layout, row_major> ? p[r * ldm + k] : p[k * ldm + r];
}

template <typename T, typename Layout>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, Layout>& b, const T* p, unsigned ldm) {
  emulated::check_operand(p, ldm);
  const unsigned c0 = emulated::first_column();
  for (unsigned k = 0; k < 16; ++k)
    for (unsigned j = 0; j < 8; ++j)
      b.x[k * 8 + j] = std::is_same_v<Layout, row_major> ? p[k * ldm + c0 + j] : p[(c0 + j) * ldm + k];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& c, const float* p, unsigned ldm,
                             layout_t layout) {
  emulated::check_operand(p, ldm);
  const unsigned r = emulated::row(), c0 = emulated::first_column();
  for (unsigned j = 0; j < 8; ++j) c.x[j] = layout == mem_row_major ? p[r * ldm + c0 + j] : p[(c0 + j) * ldm + r];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& c, unsigned ldm,
                              layout_t layout) {
  emulated::check_operand(p, ldm);
  const unsigned r = emulated::row(), c0 = emulated::first_column();
  for (unsigned j = 0; j < 8; ++j) (layout == mem_row_major ? p[r * ldm + c0 + j] : p[(c0 + j) * ldm + r]) = c.x[j];
}

// d = a · b + c, products and sums in f32 (d may be c).
template <typename T, typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float sums[8];
  for (unsigned j = 0; j < 8; ++j) {
    float s = c.x[j];
    for (unsigned k = 0; k < 16; ++k) s += emulated::widen(a.x[k]) * emulated::widen(b.x[k * 8 + j]);
    sums[j] = s;
  }
  for (unsigned j = 0; j < 8; ++j) d.x[j] = sums[j];
}

}  // namespace nvcuda::wmma

// CUDA's __syncwarp: every lane of the warp is here, and sees what the others wrote before it.
inline void __syncwarp(unsigned = 0xffffffffu) { pdserve::kernels::gpu::simt::warp_barrier(); }
