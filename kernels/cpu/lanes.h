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

// `acc` with the products a[k] * b[k] of the remainder [whole, n) added to their lanes.
[[gnu::always_inline]] inline Lanes add_remainder(Lanes acc, const float* a, const float* b, int whole, int n) {
  float lanes[kLanes];
  __builtin_memcpy(lanes, &acc, sizeof(lanes));
  for (int k = whole; k < n; ++k) lanes[k - whole] += a[k] * b[k];
  __builtin_memcpy(&acc, lanes, sizeof(lanes));
  return acc;
}

// Adds the remainder's products to their lanes of `acc` (add_remainder) and reduces.
[[gnu::always_inline]] inline float finish_lanes(Lanes acc, const float* a, const float* b, int whole, int n) {
  float lanes[kLanes];
  acc = add_remainder(acc, a, b, whole, n);
  __builtin_memcpy(lanes, &acc, sizeof(lanes));
  return reduce_lanes(lanes);
}

// a · b over n elements, in the lane order above.
[[gnu::always_inline]] inline float dot_lanes(const float* a, const float* b, int n) {
  Lanes acc = {};
  const int whole = n - n % kLanes;
  for (int k = 0; k < whole; k += kLanes) acc += load_lanes(a + k) * load_lanes(b + k);
  return finish_lanes(acc, a, b, whole, n);
}

// The dot products of eight keys at once, each exactly as finish_lanes reduces it: acc[s] holds
// the lane sums of key kReduceSlotKey[s], and lane i of the result is key i's sum. The tree of
// reduce_lanes, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), is taken one level at a time
// across pairs of keys, so eight sums cost fourteen shuffles and seven adds instead of seven
// scalar adds each. The slot order undoes the lanes' interleaving (it is its own inverse).
inline constexpr int kReduceSlotKey[kLanes] = {0, 4, 2, 6, 1, 5, 3, 7};

[[gnu::always_inline]] inline Lanes reduce_lanes_x8(const Lanes* acc) {
  Lanes pairs[4];  // Keys 2i, 2i+1 of the slots: (l0+l4, l1+l5, l2+l6, l3+l7) of each.
  for (int i = 0; i < 4; ++i)
    pairs[i] = __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  Lanes quads[2];  // Each key's two halves of the tree, (l0+l4)+(l2+l6) and (l1+l5)+(l3+l7).
  for (int i = 0; i < 2; ++i)
    quads[i] = __builtin_shufflevector(pairs[2 * i], pairs[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(pairs[2 * i], pairs[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(quads[0], quads[1], 0, 8, 2, 10, 4, 12, 6, 14) +
         __builtin_shufflevector(quads[0], quads[1], 1, 9, 3, 11, 5, 13, 7, 15);
}

// Functions over lanes are cloned for x86-64-v4 (AVX-512: 32 vector registers, so the GEMM's 4x4
// tiles keep their accumulators in registers) and AVX2, chosen at load time by what the CPU has
// (GCC's resolver; clang 14/15's never picks the x86-64-v4 clone and runs the AVX2 one): the
// lanes are independent and nothing is fused or reordered, so every clone computes every
// element bit for bit as the baseline does, and machines of every kind agree. x86-64-v4 has FMA,
// which GCC would contract a*b+c into by default: the sources built with these clones must have
// -ffp-contract=off (kernels/CMakeLists.txt defines PDSERVE_FP_CONTRACT_OFF beside it).
#if !defined(PDSERVE_FP_CONTRACT_OFF)
#error "kernels/cpu/lanes.h needs -ffp-contract=off (and PDSERVE_FP_CONTRACT_OFF): see its clones"
#endif
// Not under ThreadSanitizer: the clones' ifunc resolver runs before its runtime is up and crashes
// the process.
#if defined(__SANITIZE_THREAD__)
#define PDSERVE_CPU_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PDSERVE_CPU_CLONES
#endif
#endif
#ifndef PDSERVE_CPU_CLONES
#define PDSERVE_CPU_CLONES [[gnu::target_clones("arch=x86-64-v4", "avx2", "default")]]
#endif

}  // namespace pdserve::kernels::cpu
