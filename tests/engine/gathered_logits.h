// Test helper: plain [rows][vocab] logits laid out as tensor-parallel ranks gather them
// (kernels::ShardedLogits), for the sampling tests of the CPU reference and the GPU kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/sampling.h"

namespace pdserve::testing {

// The gathered buffer for `logits` (its rows, vocab and shards; its data is ignored) holding
// `plain`; padding columns hold `pad`.
inline std::vector<float> gather_logits(const std::vector<float>& plain, const kernels::ShardedLogits& logits,
                                        float pad) {
  std::vector<float> gathered(size_t(logits.shards) * logits.rows * logits.shard_stride(), pad);
  kernels::ShardedLogits view = logits;
  view.data = gathered.data();
  for (int s = 0; s < logits.shards; ++s)
    for (int r = 0; r < logits.rows; ++r) {
      float* row = const_cast<float*>(view.row_of_shard(s, r));
      for (int c = logits.shard_begin(s); c < logits.shard_begin(s + 1); ++c)
        row[c - logits.shard_begin(s)] = plain[int64_t(r) * logits.vocab + c];
    }
  return gathered;
}

}  // namespace pdserve::testing
