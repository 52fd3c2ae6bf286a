// Seeded random inputs for kernel tests: the CPU kernel tests and the GPU kernel tests draw the
// same normal floats from the same seeds.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace pdserve::testing {

// n floats from N(0, scale²), the same for the same seed.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace pdserve::testing
