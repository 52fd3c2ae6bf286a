// Router::validate: the checks on a client request before any work (model name, prompt,
// sampling values, and limits on everything a client controls).
#include <algorithm>

#include "router/request_state.h"

namespace pdserve::router {
namespace {

// Limits on client-controlled request fields.
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int kMaxStopTokenIds = 256;
// No token of a real vocabulary spans more bytes, so a longer text cannot fit the context.
constexpr size_t kMaxBytesPerToken = 256;
constexpr size_t kMaxCacheSaltBytes = 256;

}  // namespace

StatusOr<std::vector<int>> Router::validate(const v1::GenerateRequest& r) const {
  if (!r.model().empty() && r.model() != model_.name &&
      std::find(model_.aliases.begin(), model_.aliases.end(), r.model()) == model_.aliases.end())
    return absl::NotFoundError(
        absl::StrCat("model '", r.model(), "' is not served here; this router serves '", model_.name, "'"));
  if (r.request_id().size() > 256) return absl::InvalidArgumentError("request_id is longer than 256 bytes");
  // Hashed into every block key of the request, on the router and on each worker.
  if (r.cache_salt().size() > kMaxCacheSaltBytes)
    return absl::InvalidArgumentError(absl::StrCat("cache_salt is longer than ", kMaxCacheSaltBytes, " bytes (got ",
                                                   r.cache_salt().size(), ")"));
  const v1::SamplingParams& s = r.sampling();
  // Limits on what a client controls, checked before any work: stop rules are checked on every
  // token, and tokenizing is paid for the whole text.
  if (s.stop_size() > kMaxStopStrings)
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.stop: at most ", kMaxStopStrings, " stop strings (got ", s.stop_size(), ")"));
  for (const std::string& stop : s.stop())
    if (stop.size() > kMaxStopStringBytes)
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop: a stop string is longer than ", kMaxStopStringBytes, " bytes"));
  if (s.stop_token_ids_size() > kMaxStopTokenIds)
    return absl::InvalidArgumentError(absl::StrCat("sampling.stop_token_ids: at most ", kMaxStopTokenIds, " ids (got ",
                                                   s.stop_token_ids_size(), ")"));
  const size_t max_prompt_bytes = size_t(model_.config.max_seq_len) * kMaxBytesPerToken;
  if (r.prompt_case() == v1::GenerateRequest::kText && r.text().size() > max_prompt_bytes)
    return absl::InvalidArgumentError(absl::StrCat("prompt text of ", r.text().size(),
                                                   " bytes cannot fit the context of ", model_.config.max_seq_len,
                                                   " tokens (at most ", max_prompt_bytes, " bytes)"));
  if (r.prompt_case() == v1::GenerateRequest::kTokenIds && r.token_ids().ids_size() > model_.config.max_seq_len)
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", r.token_ids().ids_size(),
                                                   " tokens is longer than the model's context of ",
                                                   model_.config.max_seq_len, " tokens"));
  if (s.logit_bias_size() > engine::SamplingParams::kMaxLogitBias)
    return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias: at most ", engine::SamplingParams::kMaxLogitBias,
                                                   " token ids (got ", s.logit_bias_size(), ")"));
  if (s.max_tokens() <= 0)
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens must be > 0 (got ", s.max_tokens(), ")"));
  // The engine seeds only a non-negative seed: a negative one would silently mean "random".
  if (s.has_seed() && s.seed() < 0)
    return absl::InvalidArgumentError(absl::StrCat("sampling.seed must be >= 0 (got ", s.seed(), "; unset: random)"));
  if (s.min_tokens() > s.max_tokens())
    return absl::InvalidArgumentError(absl::StrCat("sampling.min_tokens (", s.min_tokens(),
                                                   ") must be <= sampling.max_tokens (", s.max_tokens(), ")"));
  // Several samples of one prompt are the parallel-samples front end's (router/parallel_samples.h),
  // which calls generate() once per sample with n = 1: here n > 1 would be ignored.
  if (s.n() < 0 || s.n() > 1)
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.n = ", s.n(), ": n > 1 goes through the parallel-samples front end (n must be 0 or 1 here)"));
  // On the wire "none" is unset; an explicit negative count is a client's mistake, not "none".
  if (s.has_logprobs() && s.logprobs() < 0)
    return absl::InvalidArgumentError(absl::StrCat("sampling.logprobs must be >= 0 when set (got ", s.logprobs(), ")"));
  if (s.has_prompt_logprobs() && s.prompt_logprobs() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.prompt_logprobs must be >= 0 when set (got ", s.prompt_logprobs(), ")"));
  const engine::SamplingParams p = engine_sampling(s);
  if (Status st = p.validate(); !st.ok()) return absl::InvalidArgumentError(absl::StrCat("sampling: ", st.message()));
  const int vocab = model_.config.vocab_size;
  for (int t : p.stop_token_ids)
    if (t >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.stop_token_ids: ", t, " is outside the vocabulary [0, ", vocab, ")"));
  for (const auto& [t, bias] : p.logit_bias)
    if (t >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias: token id ", t, " is outside the vocabulary [0, ", vocab, ")"));

  std::vector<int> prompt;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      auto enc = model_.tokenizer->encode(r.text(), /*add_bos=*/true);
      if (!enc.ok()) return absl::InvalidArgumentError(absl::StrCat("prompt text: ", enc.status().message()));
      prompt = std::move(*enc);
      if (prompt.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens (the model has no BOS)");
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      prompt.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      if (prompt.empty()) return absl::InvalidArgumentError("prompt token_ids is empty");
      for (int t : prompt)
        if (t < 0 || t >= vocab)
          return absl::InvalidArgumentError(
              absl::StrCat("prompt token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
      break;
    default: return absl::InvalidArgumentError("no prompt: set text or token_ids");
  }
  if (int64_t(prompt.size()) > model_.config.max_seq_len)
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", prompt.size(),
                                                   " tokens is longer than the model's context of ",
                                                   model_.config.max_seq_len, " tokens"));
  return prompt;
}

}  // namespace pdserve::router
