// The CLI flags for the sampling parameters that have no model default: the output penalties
// (--frequency-penalty, --presence-penalty), --logit-bias, --min-tokens, --logprobs,
// --prompt-logprobs and --no-skip-special-tokens. `pdserve generate` and `pdserve bench` both
// add them, so the two spell and check them the same way.
#pragma once

#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/string_view.h"
#include "common/status.h"
#include "engine/sampling/sampler.h"

namespace pdserve::tools {

// "ID:BIAS[,ID:BIAS...]" as (id, bias) pairs sorted by id; InvalidArgument for a malformed
// entry, a negative id or an id given twice. The bias range and the count are
// SamplingParams::validate's (the router checks the ids against the vocabulary).
StatusOr<std::vector<std::pair<int, float>>> parse_logit_bias(absl::string_view spec);

// Adds the flags to `cmd`; they write into `*params`, which must outlive the parse.
void add_output_sampling_flags(CLI::App* cmd, engine::SamplingParams* params);

}  // namespace pdserve::tools
