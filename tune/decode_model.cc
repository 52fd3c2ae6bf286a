#include "tune/decode_model.h"

#include <algorithm>
#include <cmath>

namespace pdserve::tune {

StatusOr<DecodeFixedPoint> solve_decode_fixed_point(const std::function<double(double)>& step_seconds,
                                                    const DecodeDemand& demand) {
  if (demand.lambda < 0 || demand.steps_per_request < 0)
    return absl::InvalidArgumentError("negative decode demand");
  if (demand.reservation_tokens <= 0) return absl::InvalidArgumentError("decode reservation must be positive");
  DecodeFixedPoint fp;
  const double kv_batch = double(demand.kv_tokens) / demand.reservation_tokens;
  fp.batch_max = std::min<double>(demand.max_running, kv_batch);
  const double work = demand.lambda * demand.steps_per_request;  // Sequence-steps per second.
  const auto excess = [&](double b) { return work * step_seconds(b) - b; };
  if (work == 0) {
    fp.step_s = step_seconds(0);
    return fp;
  }
  if (excess(fp.batch_max) > 0) {
    fp.feasible = false;
    fp.bound = kv_batch < demand.max_running ? DecodeBound::kKv : DecodeBound::kSlots;
    fp.batch = fp.batch_max;
    fp.step_s = step_seconds(fp.batch_max);
    return fp;
  }
  double lo = 0, hi = fp.batch_max;  // excess(lo) > 0 (a step takes time) ≥ excess(hi).
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (excess(mid) > 0 ? lo : hi) = mid;
  }
  fp.batch = hi;
  fp.step_s = step_seconds(hi);
  return fp;
}

double poisson_cdf(double mean, int k) {
  if (k < 0) return 0;
  if (mean <= 0) return 1;
  // Terms in the log domain, so a mean in the hundreds does not underflow e^−mean.
  double log_term = -mean, sum = 0;
  for (int i = 0; i <= k; ++i) {
    if (i > 0) log_term += std::log(mean / i);
    sum += std::exp(log_term);
  }
  return std::min(sum, 1.0);
}

int poisson_quantile(double mean, double q) {
  if (mean <= 0) return 0;
  double log_term = -mean, sum = 0;
  for (int k = 0;; ++k) {
    if (k > 0) log_term += std::log(mean / k);
    sum += std::exp(log_term);
    // Past mean + 40σ the remaining mass is below double precision.
    if (sum >= q || k > mean + 40 * std::sqrt(mean) + 40) return k;
  }
}

}  // namespace pdserve::tune
