#include "tune/queue_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pdserve::tune {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Past this many values a uniform distribution is summarized by this many strata.
constexpr int kMaxUniformPoints = 256;
}  // namespace

double pk_mean_wait(double lambda, const ServiceMoments& s) {
  const double rho = lambda * s.mean;
  if (rho >= 1) return kInf;
  return lambda * s.second / (2 * (1 - rho));
}

double md1_mean_wait(double lambda, double d) { return pk_mean_wait(lambda, {d, d * d}); }

double mm1_mean_wait(double lambda, double mean) { return pk_mean_wait(lambda, {mean, 2 * mean * mean}); }

double kingman_mean_wait(double lambda, const ServiceMoments& s, double arrival_cv2) {
  const double rho = lambda * s.mean;
  if (rho >= 1) return kInf;
  return (arrival_cv2 + s.cv2()) / 2 * rho / (1 - rho) * s.mean;
}

double arrival_cv2(const Workload& workload) {
  switch (workload.arrival) {
    case Arrival::kPoisson:
      return 1;
    case Arrival::kGamma:
      return workload.gamma_cv * workload.gamma_cv;
    case Arrival::kClosed:
      return 0;
  }
  return 1;
}

double WaitTail::cdf(double t) const {
  if (t < 0) return 0;
  if (rho <= 0 || mean_wait <= 0) return 1;
  if (rho >= 1 || std::isinf(mean_wait)) return 0;
  const double residual = mean_wait * (1 - rho) / rho;
  return 1 - rho * std::exp(-t * (1 - rho) / residual);
}

double WaitTail::quantile(double q) const {
  if (rho <= 0 || mean_wait <= 0) return 0;
  if (rho >= 1 || std::isinf(mean_wait)) return kInf;
  return wait_quantile(rho, mean_wait * (1 - rho) / rho, q);
}

double wait_quantile(double rho, double mean_residual, double q) {
  if (rho >= 1) return kInf;
  if (q <= 1 - rho) return 0;  // At least 1 − ρ of newcomers find the server idle.
  return mean_residual / (1 - rho) * std::log(rho / (1 - q));
}

double rho_max(double slack, double mean_residual) {
  if (slack <= 0) return 0;
  return slack / (slack + mean_residual);
}

StatusOr<std::vector<std::pair<int, double>>> length_points(const LengthDist& dist) {
  std::vector<std::pair<int, double>> points;
  switch (dist.kind) {
    case LengthDist::Kind::kFixed:
      if (dist.lo < 0) return absl::InvalidArgumentError("negative fixed length");
      points.emplace_back(dist.lo, 1.0);
      break;
    case LengthDist::Kind::kUniform: {
      if (dist.lo < 0 || dist.hi < dist.lo)
        return absl::InvalidArgumentError(absl::StrCat("bad uniform length range [", dist.lo, ", ", dist.hi, "]"));
      const int64_t values = int64_t(dist.hi) - dist.lo + 1;
      if (values <= kMaxUniformPoints) {
        for (int v = dist.lo; v <= dist.hi; ++v) points.emplace_back(v, 1.0 / double(values));
      } else {
        for (int i = 0; i < kMaxUniformPoints; ++i) {
          const int64_t offset = int64_t((i + 0.5) * double(values) / kMaxUniformPoints);
          points.emplace_back(int(dist.lo + offset), 1.0 / kMaxUniformPoints);
        }
      }
      break;
    }
    case LengthDist::Kind::kEmpirical:
      if (dist.samples.empty()) return absl::InvalidArgumentError("empirical length distribution without samples");
      for (int v : dist.samples) points.emplace_back(v, 1.0 / double(dist.samples.size()));
      break;
  }
  return points;
}

StatusOr<double> mean_length(const LengthDist& dist) {
  PD_ASSIGN_OR_RETURN(const auto points, length_points(dist));
  double mean = 0;
  for (const auto& [value, weight] : points) mean += weight * value;
  return mean;
}

double prefill_service_seconds(const PrefillLaw& law, int tokens, int chunk_tokens) {
  if (tokens <= 0) return 0;
  const int chunk = std::max(chunk_tokens, 1);
  const int full = tokens / chunk, rest = tokens % chunk;
  return full * law.step_seconds(chunk) + (rest > 0 ? law.step_seconds(rest) : 0);
}

StatusOr<ServiceMoments> prefill_moments(const PrefillLaw& law, const LengthDist& input, int chunk_tokens) {
  PD_ASSIGN_OR_RETURN(const auto points, length_points(input));
  ServiceMoments m;
  for (const auto& [tokens, weight] : points) {
    const double s = prefill_service_seconds(law, tokens, chunk_tokens);
    m.mean += weight * s;
    m.second += weight * s * s;
  }
  return m;
}

StatusOr<double> prefill_service_quantile(const PrefillLaw& law, const LengthDist& input, int chunk_tokens, double q) {
  PD_ASSIGN_OR_RETURN(auto points, length_points(input));
  // Service time grows with the prompt, so the quantile is that of the lengths.
  std::sort(points.begin(), points.end());
  double cumulative = 0;
  for (const auto& [tokens, weight] : points) {
    cumulative += weight;
    if (cumulative >= q - 1e-12) return prefill_service_seconds(law, tokens, chunk_tokens);
  }
  return prefill_service_seconds(law, points.back().first, chunk_tokens);
}

}  // namespace pdserve::tune
