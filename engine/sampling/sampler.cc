#include "engine/sampling/sampler.h"

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
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty))) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0 and finite (1 = off), got ", repetition_penalty));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : temperature_(params.temperature),
      top_k_(params.top_k),
      top_p_(params.top_p),
      repetition_penalty_(params.repetition_penalty),
      rng_(params.seed >= 0 ? static_cast<uint64_t>(params.seed)
                            : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                                  std::random_device{}()) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

kernels::cpu::SampleRow Sampler::next_row() {
  kernels::cpu::SampleRow row{temperature_, top_k_, top_p_, 0.0};
  row.repetition_penalty = repetition_penalty_;
  // Greedy tokens take no draw.
  if (temperature_ != 0.0f && top_k_ != 1) row.u = uniform();
  return row;
}

int Sampler::sample(const float* logits, int vocab) {
  return kernels::cpu::sample_token(logits, vocab, next_row(), &scratch_);
}

}  // namespace pdserve::engine
