// Prompt affinity: how the samples of one prompt (SamplingParams.n, best_of) compute it once.
// The first sample, the leader, is placed like any request; when its prompt is computed (its
// first token) the router reports where, and the other samples, the followers, are placed
// there: the prompt's full blocks sit in that worker's prefix cache, so a follower's prefill
// computes only the prompt's last, partial block; and an abort of the samples' parent id reaches
// the followers not yet started. Plain structs between the parallel-samples
// front end (router/parallel_samples.h) and the router's placement.
#pragma once

#include <functional>
#include <string>

namespace pdserve::router {

// Worker addresses of one placement; empty for "none" (a prefill worker in aggregated mode is
// the aggregated worker itself).
struct PromptPlacement {
  std::string prefill_worker;
  std::string decode_worker;
};

struct PromptAffinity {
  // Where to place the request when those workers can take it (up, not failed for it, paired,
  // with room): chosen over less loaded ones, as the cached prompt saves more than the load
  // difference costs for a prompt computed a moment ago. Empty: placed by load alone.
  PromptPlacement prefer;
  // Called once, at the request's first output (its prompt is computed and cached by then),
  // with the workers that computed it; may be empty.
  std::function<void(const PromptPlacement&)> on_prompt_computed;
  // Whether the client aborted the request these samples fan out from (by its id): checked
  // once this sample is registered under its own id, so an abort that came while it waited for
  // its leader, or before it registered, still ends it with "abort". Null: never.
  std::function<bool()> parent_aborted;
};

}  // namespace pdserve::router
