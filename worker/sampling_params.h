// Conversion of the wire sampling parameters (pdserve.v1.SamplingParams) to the engine's,
// shared by every role so that a request samples the same way whichever worker runs it.
#pragma once

#include "common/status.h"
#include "engine/sampling/sampler.h"
#include "proto/pdserve.pb.h"

namespace pdserve::worker {

// The engine's parameters; InvalidArgument naming the bad field.
StatusOr<engine::SamplingParams> to_engine_params(const v1::SamplingParams& params);

}  // namespace pdserve::worker
