// The sampling defaults of a Hugging Face generation_config.json — the keys vLLM's
// `--generation-config auto` takes from it (temperature, top_k, top_p, repetition_penalty,
// min_p, max_new_tokens) — checked and turned into GenerationDefaults.
#pragma once

#include <string>

#include "common/status.h"
#include "engine/generation_defaults.h"

namespace pdserve::engine {

// Parses generation_config.json text (`source` names it in errors). temperature >= 0, top_p in
// (0, 1], top_k >= 0 (0: off) and repetition_penalty > 0, finite, else InvalidArgument naming
// the key; null means absent. `do_sample: false` means greedy, as in transformers: the default
// temperature is 0 and the file's temperature, top_k and top_p are reported in not_applied
// (vLLM, which ignores do_sample, would sample with them). min_p (other than 0) and
// max_new_tokens, which pdserve does not apply, are reported in not_applied too.
StatusOr<GenerationDefaults> parse_generation_defaults(const std::string& text, const std::string& source);

// One line for the model's load log: the defaults and what is not applied; "" when empty.
std::string describe_generation_defaults(const GenerationDefaults& defaults);

}  // namespace pdserve::engine
