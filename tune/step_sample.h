// One engine step as a worker reports it to the tuner (tune.md §6.3, like Dynamo's
// ForwardPassMetrics): what the step computed and how long it took. Its own header so that
// the worker side can produce samples without depending on the fitter.
#pragma once

#include <cstdint>

namespace pdserve::tune {

struct StepSample {
  int64_t prefill_tokens = 0;  // Prompt tokens computed in the step (all chunks together).
  int prefill_seqs = 0;        // Sequences the step prefilled (a chunk counts).
  int decode_seqs = 0;         // Sequences the step decoded one token for.
  int64_t kv_tokens = 0;       // Σ KV tokens of the decoded sequences.
  double wall_s = 0;           // Wall time of the step.
};

}  // namespace pdserve::tune
