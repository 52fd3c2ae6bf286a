#include "proto/engine_sampling.h"

#include <algorithm>

namespace pdserve {

engine::SamplingParams engine_sampling(const v1::SamplingParams& s) {
  engine::SamplingParams p;
  // Unset: the engine's neutral values (the router has applied the model's defaults already).
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  p.seed = s.has_seed() ? s.seed() : -1;
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.stop_strings.assign(s.stop().begin(), s.stop().end());
  p.ignore_eos = s.ignore_eos();
  p.frequency_penalty = s.frequency_penalty();
  p.presence_penalty = s.presence_penalty();
  p.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  p.min_tokens = s.min_tokens();
  p.logprobs = s.has_logprobs() ? s.logprobs() : -1;
  p.prompt_logprobs = s.has_prompt_logprobs() ? s.prompt_logprobs() : -1;
  p.skip_special_tokens = s.has_skip_special_tokens() ? s.skip_special_tokens() : true;
  return p;
}

v1::SamplingParams wire_sampling(const engine::SamplingParams& p) {
  v1::SamplingParams s;
  s.set_temperature(p.temperature);
  s.set_top_k(p.top_k);
  s.set_top_p(p.top_p);
  if (p.seed >= 0) s.set_seed(p.seed);
  s.set_max_tokens(p.max_tokens);
  for (int t : p.stop_token_ids) s.add_stop_token_ids(t);
  for (const std::string& x : p.stop_strings) s.add_stop(x);
  s.set_ignore_eos(p.ignore_eos);
  s.set_repetition_penalty(p.repetition_penalty);
  s.set_frequency_penalty(p.frequency_penalty);
  s.set_presence_penalty(p.presence_penalty);
  for (const auto& [id, bias] : p.logit_bias) (*s.mutable_logit_bias())[id] = bias;
  s.set_min_tokens(p.min_tokens);
  if (p.logprobs >= 0) s.set_logprobs(p.logprobs);
  if (p.prompt_logprobs >= 0) s.set_prompt_logprobs(p.prompt_logprobs);
  s.set_skip_special_tokens(p.skip_special_tokens);
  return s;
}

}  // namespace pdserve
