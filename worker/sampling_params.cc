#include "worker/sampling_params.h"

namespace pdserve::worker {

StatusOr<engine::SamplingParams> to_engine_params(const v1::SamplingParams& in) {
  engine::SamplingParams p;
  // Unset: greedy, no top_k, no penalty (the router has applied the model's defaults already).
  if (in.has_temperature()) p.temperature = in.temperature();
  if (in.has_top_k()) p.top_k = in.top_k();
  if (in.has_repetition_penalty()) p.repetition_penalty = in.repetition_penalty();
  if (in.has_top_p()) p.top_p = in.top_p();
  if (in.has_seed()) p.seed = in.seed();
  p.max_tokens = in.max_tokens();
  p.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  p.stop_strings.assign(in.stop().begin(), in.stop().end());
  p.ignore_eos = in.ignore_eos();
  PD_RETURN_IF_ERROR(p.validate());
  return p;
}

}  // namespace pdserve::worker
