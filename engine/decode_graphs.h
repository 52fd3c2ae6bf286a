// DecodeGraphs: a rank's decode steps recorded once per batch bucket and replayed (issue 18's
// R6). A decode step launches some ten kernels a layer; on a GPU at small batches their launch
// cost is a large part of the step, and replaying a recorded graph (Backend::begin_capture) pays
// it once. A step of n decode tokens runs as the smallest bucket of at least n, its rows past n
// padding (a negative position, kernels/abi.h), so that a handful of graphs serve every batch.
// What this class keeps is the graphs and which buckets could not be recorded; the rank
// (engine/rank_runner.h) lays the step out in fixed buffers and says what to record.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "common/status.h"
#include "engine/backend.h"

namespace pdserve::engine {

// The batch sizes decode graphs are recorded for, up to `max_batch`: 1, 2, 4, 8, then every 8 to
// 64, every 16 to 128, every 32 beyond (vLLM's and SGLang's spacing: padding wastes at most an
// eighth of a step above 8 tokens, and a few dozen graphs cover 256).
// The smallest bucket of at least `tokens`, or 0 when `tokens` is not in 1..max_batch.
int decode_graph_bucket(int tokens, int max_batch);
// The largest bucket a rank records (fewer where its steps hold fewer tokens).
inline constexpr int kMaxDecodeGraphBatch = 256;

class DecodeGraphs {
 public:
  // The graph recorded for `bucket`, or null (none yet, or it could not be recorded).
  StepGraph* find(int bucket) const;
  // Whether recording `bucket` failed before: its steps run eagerly.
  bool refused(int bucket) const;
  // Records `body` (the step's kernel calls) on `backend` as `bucket`'s graph. On failure the
  // bucket is remembered as refused and the error returned (for the caller to log once); the
  // backend runs eagerly again either way.
  Status record(Backend& backend, int bucket, const std::function<void()>& body);
  // Drops `bucket`'s graph (its replay failed) and runs its steps eagerly from now on.
  void refuse(int bucket);
  // Drops every graph, as a buffer one may read has moved; refused buckets stay refused.
  void clear() { graphs_.clear(); }

 private:
  std::map<int, std::unique_ptr<StepGraph>> graphs_;
  std::set<int> refused_;
};

}  // namespace pdserve::engine
