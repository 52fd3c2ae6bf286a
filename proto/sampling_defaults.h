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

}  // namespace pdserve
