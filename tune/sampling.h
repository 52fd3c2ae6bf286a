// Deterministic random draws for the simulator: uniform, exponential and gamma variates and
// LengthDist samples from a 64-bit generator, computed here rather than by <random>'s
// distributions (whose algorithms differ between standard libraries), so a seed gives the same
// run, and the same report, on every build.
#pragma once

#include <cstdint>
#include <random>

#include "tune/types.h"

namespace pdserve::tune {

class Sampler {
 public:
  explicit Sampler(uint64_t seed);
  double uniform();                       // In [0, 1).
  double exponential(double mean);
  double gamma(double shape, double scale);  // Marsaglia–Tsang.
  int length(const LengthDist& dist);     // The distribution must be valid (length_points).

 private:
  double normal();
  std::mt19937_64 engine_;  // Its output sequence is fixed by the standard.
};

}  // namespace pdserve::tune
