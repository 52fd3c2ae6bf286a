// The model's sampling defaults on the wire (ModelInfo.sampling_defaults) and the one function
// that applies them to a request: explicit fields win, unset ones take the model's default.
// The router's Generate (gRPC and OpenAI HTTP) and `pdserve generate` in process all call
// apply_sampling_defaults, so every entry point samples a request the same way and the workers
// get explicit values.
#pragma once

#include "engine/generation_defaults.h"
#include "proto/pdserve.pb.h"

namespace pdserve {

// ModelInfo's form of a model's GenerationDefaults.
v1::SamplingDefaults sampling_defaults_proto(const engine::GenerationDefaults& defaults);

// Sets each of temperature, top_k, top_p and repetition_penalty that `params` leaves unset and
// `defaults` has; fields set in `params` are kept.
void apply_sampling_defaults(const v1::SamplingDefaults& defaults, v1::SamplingParams* params);

// Sets each of those fields to its "off" value (temperature 0, top_k 0, top_p 1,
// repetition_penalty 1: engine::SamplingParams' defaults), so no model default applies: for
// requests whose output is checked against an engine run with plain parameters (`pdserve
// bench --verify-model`, the tuner's gate).
void set_neutral_sampling(v1::SamplingParams* params);

}  // namespace pdserve
