// The one conversion between the wire sampling parameters (pdserve.v1.SamplingParams) and the
// engine's (engine::SamplingParams), both ways. The router (validation, its stop rules), every
// worker role and the CLI call it, so a request means the same thing wherever it is looked at.
// It lives in its own library (pdserve_engine_sampling: the proto and the sampler, not the
// engine) so the router need not link the engine to read a request.
#pragma once

#include "engine/sampling/sampler.h"
#include "proto/pdserve.pb.h"

namespace pdserve {

// The engine's parameters for the wire's; not validated (SamplingParams::validate). Unset
// optional fields take the engine's neutral value: greedy, no top_k or top_p, no repetition
// penalty, a random seed, no logprobs or prompt_logprobs (-1), skip_special_tokens true. The
// logit_bias map becomes a vector sorted by token id (a map's order is unspecified on the wire).
// `n` has no engine counterpart: a front end fans a request out into n single ones.
engine::SamplingParams engine_sampling(const v1::SamplingParams& wire);

// The wire's parameters for the engine's: every field explicit (a seed of -1, "random", unset;
// logprobs and prompt_logprobs of -1 unset), so engine_sampling gives `p` back.
v1::SamplingParams wire_sampling(const engine::SamplingParams& p);

}  // namespace pdserve
