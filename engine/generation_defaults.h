// The sampling defaults a model's generation_config.json recommends (temperature, top_p, top_k,
// repetition_penalty), which a request that leaves those fields unset gets — what vLLM does
// with `--generation-config auto`. Kept with the ModelConfig so that the router, the workers
// (ModelInfo) and `pdserve generate` all see the same ones.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace pdserve::engine {

struct GenerationDefaults {
  // Each is set only when the file gives it (and do_sample does not turn it off).
  std::optional<float> temperature;  // 0: greedy.
  std::optional<int> top_k;          // 0: off.
  std::optional<float> top_p;
  std::optional<float> repetition_penalty;
  // Keys the file sets that pdserve does not apply, each with why ("min_p 0.05: ..."), so that
  // the model's loading and ModelInfo say so instead of dropping them silently.
  std::vector<std::string> not_applied;

  bool empty() const { return !temperature && !top_k && !top_p && !repetition_penalty && not_applied.empty(); }
};

}  // namespace pdserve::engine
