#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>

namespace pdserve::engine {

Status SamplingParams::validate() const {
  if (std::isnan(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0 (0 = greedy), got ", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", top_k));
  }
  if (max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be > 0, got ", max_tokens));
  }
  for (int id : stop_token_ids) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("stop token id ", id, " is negative"));
  }
  for (const std::string& stop : stop_strings) {
    if (stop.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : temperature_(params.temperature),
      top_k_(params.top_k),
      top_p_(params.top_p),
      rng_(params.seed >= 0 ? static_cast<uint64_t>(params.seed)
                            : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                  std::random_device{}()) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int Sampler::argmax(const float* logits, int vocab) {
  int best = -1;
  for (int i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    // Strictly greater keeps the lowest index on ties.
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

void Sampler::skip_draw() {
  if (temperature_ != 0.0f && top_k_ != 1) uniform();
}

int Sampler::sample(const float* logits, int vocab) {
  if (vocab <= 0) return 0;
  if (temperature_ == 0.0f || top_k_ == 1) return argmax(logits, vocab);

  const int best = argmax(logits, vocab);
  const float max_logit = logits[best];
  if (!std::isfinite(max_logit)) return best;
  probs_.resize(vocab);
  candidates_.clear();
  const double inv_temperature = 1.0 / temperature_;
  for (int i = 0; i < vocab; ++i) {
    const float logit = logits[i];
    // exp of a non-positive number cannot overflow; NaN and -inf get no mass.
    const float p = std::isnan(logit) ? 0.0f
                                      : static_cast<float>(std::exp((logit - max_logit) * inv_temperature));
    probs_[i] = p;
    if (p > 0.0f) candidates_.push_back(i);
  }
  // Most likely first; the lower index first among equals, so the order is deterministic.
  const auto more_likely = [this](int a, int b) {
    return probs_[a] != probs_[b] ? probs_[a] > probs_[b] : a < b;
  };
  size_t sorted = 0;  // candidates_[0, sorted) is in more_likely order.
  if (top_k_ > 0 && static_cast<size_t>(top_k_) < candidates_.size()) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + top_k_, candidates_.end(),
                      more_likely);
    candidates_.resize(top_k_);
    sorted = candidates_.size();
  }
  double total = 0.0;
  for (int id : candidates_) total += probs_[id];
  if (top_p_ < 1.0f) {
    const double target = static_cast<double>(top_p_) * total;
    double kept = 0.0;
    size_t count = 0;
    while (count < candidates_.size()) {
      if (count == sorted) {
        // The nucleus is usually a small fraction of a large vocabulary: sort a growing
        // prefix instead of everything. partial_sort's prefix is what a full sort would give.
        sorted = std::min(candidates_.size(), std::max<size_t>(64, 2 * sorted));
        std::partial_sort(candidates_.begin() + count, candidates_.begin() + sorted,
                          candidates_.end(), more_likely);
      }
      kept += probs_[candidates_[count++]];
      if (kept >= target) break;
    }
    candidates_.resize(count);
    total = kept;
  }
  double remaining = uniform() * total;
  for (int id : candidates_) {
    remaining -= probs_[id];
    if (remaining < 0.0) return id;
  }
  return candidates_.back();  // Rounding left a sliver past the last candidate.
}

}  // namespace pdserve::engine
