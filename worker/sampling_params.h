// The wire sampling parameters (pdserve.v1.SamplingParams) as the engine's, validated: what
// every role runs a request with, so that it samples the same way whichever worker runs it.
// The conversion itself is proto/engine_sampling.h (shared with the router).
#pragma once

#include "common/status.h"
#include "engine/sampling/sampler.h"
#include "proto/pdserve.pb.h"

namespace pdserve::worker {

// The engine's parameters; InvalidArgument naming the bad field. `resumed_tokens`: a migrated
// request's output so far (engine::GenerationRequest::resumed_tokens), which min_tokens counts
// but max_tokens does not: min_tokens may exceed max_tokens by up to that many.
StatusOr<engine::SamplingParams> to_engine_params(const v1::SamplingParams& params, int resumed_tokens = 0);

}  // namespace pdserve::worker
