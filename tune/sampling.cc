#include "tune/sampling.h"

#include <cmath>

#include "common/splitmix64.h"

namespace pdserve::tune {

// Seeds pass through splitmix64 first, so nearby seeds (1, 2, 3) start far apart.
Sampler::Sampler(uint64_t seed) { engine_.seed(splitmix64(seed)); }

double Sampler::uniform() { return double(engine_() >> 11) * 0x1.0p-53; }

double Sampler::exponential(double mean) { return -mean * std::log1p(-uniform()); }

double Sampler::normal() {
  // Box–Muller; 1 − u keeps the logarithm's argument in (0, 1].
  const double u = 1 - uniform(), v = uniform();
  return std::sqrt(-2 * std::log(u)) * std::cos(2 * M_PI * v);
}

double Sampler::gamma(double shape, double scale) {
  if (shape < 1) {
    // Γ(k) = Γ(k + 1)·U^(1/k) for k < 1.
    const double u = 1 - uniform();
    return gamma(shape + 1, scale) * std::pow(u, 1 / shape);
  }
  const double d = shape - 1.0 / 3, c = 1 / std::sqrt(9 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1 - uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
  }
}

int Sampler::length(const LengthDist& dist) {
  switch (dist.kind) {
    case LengthDist::Kind::kFixed:
      return dist.lo;
    case LengthDist::Kind::kUniform:
      return dist.lo + int(engine_() % uint64_t(int64_t(dist.hi) - dist.lo + 1));
    case LengthDist::Kind::kEmpirical:
      return dist.samples[engine_() % dist.samples.size()];
  }
  return dist.lo;
}

}  // namespace pdserve::tune
