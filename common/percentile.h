// The p-th percentile of a sample, interpolating linearly between order statistics (numpy's
// default, which vLLM reports): the one definition `pdserve bench`'s statistics and the tuner's
// fits, measurements and medians share.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace pdserve {

// p in 0..100 (clamped); 0 for no values. The median of an even count is the mean of the
// middle two.
inline double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * double(values.size() - 1);
  const size_t lo = size_t(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - double(lo));
}

}  // namespace pdserve
