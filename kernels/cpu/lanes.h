// Fixed-order dot products for the CPU reference kernels (matmul_xwt, paged_attention): each
// sum is split into kLanes partial sums, lane l taking the elements k % kLanes == l in order of
// k, and the lanes are added in one fixed tree. The lanes are independent, so they vectorize
// without any sum being reordered: a dot product gives the same float whatever the vector width
// of the machine, the tile it was computed in, or the batch around it (ops.h, matmul_xwt).
// Internal to kernels/cpu.
#pragma once

#include <cstdint>

namespace pdserve::kernels::cpu {

inline constexpr int kLanes = 8;

inline float reduce_lanes(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// The kLanes partial sums of one dot product as one vector value, so that accumulators live in
// registers (a float array indexed in a remainder loop is kept on the stack, and every step of
// the main loop then goes through memory). Element-wise: lane l is computed as it would be
// alone, whatever the vector width the target splits it into.
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

[[gnu::always_inline]] inline Lanes load_lanes(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// Adds the products a[k] * b[k] of the remainder [whole, n) to their lanes of `acc` and reduces.
[[gnu::always_inline]] inline float finish_lanes(Lanes acc, const float* a, const float* b, int whole, int n) {
  float lanes[kLanes];
  __builtin_memcpy(lanes, &acc, sizeof(lanes));
  for (int k = whole; k < n; ++k) lanes[k - whole] += a[k] * b[k];
  return reduce_lanes(lanes);
}

// a · b over n elements, in the lane order above.
[[gnu::always_inline]] inline float dot_lanes(const float* a, const float* b, int n) {
  Lanes acc = {};
  const int whole = n - n % kLanes;
  for (int k = 0; k < whole; k += kLanes) acc += load_lanes(a + k) * load_lanes(b + k);
  return finish_lanes(acc, a, b, whole, n);
}

// Functions over lanes are cloned for AVX2 (chosen at load time where the CPU has it): the lanes are independent and
// nothing is fused or reordered, so the wider vectors compute every element bit for bit as the
// baseline does, and machines of either kind agree. Not under ThreadSanitizer: the clones'
// ifunc resolver runs before its runtime is up and crashes the process.
#if defined(__SANITIZE_THREAD__)
#define PDSERVE_CPU_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PDSERVE_CPU_CLONES
#endif
#endif
#ifndef PDSERVE_CPU_CLONES
#define PDSERVE_CPU_CLONES [[gnu::target_clones("avx2", "default")]]
#endif

}  // namespace pdserve::kernels::cpu
