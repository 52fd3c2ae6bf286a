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
  // !(in range) also refuses NaN.
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty must be in [-2, 2] (0 = off), got ", frequency_penalty));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty must be in [-2, 2] (0 = off), got ", presence_penalty));
  }
  if (logit_bias.size() > size_t(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias has ", logit_bias.size(), " entries; at most ", kMaxLogitBias));
  }
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("logit_bias token id ", id, " is negative"));
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", id, " must be in [-100, 100], got ", bias));
    }
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  if (logprobs < -1 || logprobs > kernels::kMaxLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [-1, ", kernels::kMaxLogprobs, "] (-1 = none), got ", logprobs));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > kernels::kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [-1, ", kernels::kMaxLogprobs,
                                                   "] (-1 = none), got ", prompt_logprobs));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : temperature_(params.temperature),
      top_k_(params.top_k),
      top_p_(params.top_p),
      repetition_penalty_(params.repetition_penalty),
      frequency_penalty_(params.frequency_penalty),
      presence_penalty_(params.presence_penalty),
      logprobs_(params.logprobs),
      rng_(params.seed >= 0 ? static_cast<uint64_t>(params.seed)
                            : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()) {}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

kernels::SampleRow Sampler::next_row() {
  kernels::SampleRow row{temperature_, top_k_, top_p_, 0.0};
  row.repetition_penalty = repetition_penalty_;
  row.frequency_penalty = frequency_penalty_;
  row.presence_penalty = presence_penalty_;
  row.logprobs = logprobs_;  // Of the sampled token (logprob_of -1).
  // Greedy tokens take no draw.
  if (temperature_ != 0.0f && top_k_ != 1) row.u = uniform();
  return row;
}

int Sampler::sample(const float* logits, int vocab) {
  return kernels::cpu::sample_token(logits, vocab, next_row(), &scratch_);
}

}  // namespace pdserve::engine
