// StepWindow: the engine's last steps, one StepSample each (what the step computed and how
// long it took), numbered in step order. The tuner fits its step-time laws to these samples
// (docs/workers.md: WorkerInfo.steps), so they are the real steps of a real worker, not a
// benchmark's guess; a bounded ring, so a long-running worker keeps only the newest.
// Not thread-safe: the engine guards it (Engine::steps_after).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdserve::engine {

struct StepSample {
  uint64_t seq = 0;            // 1, 2, ... in step order (set by StepWindow::record).
  int64_t prefill_tokens = 0;  // Prompt tokens computed in the step (prefill chunks).
  int prefill_seqs = 0;        // Sequences with a prompt chunk in the step.
  int decode_seqs = 0;         // Sequences that decoded one token.
  int64_t kv_tokens = 0;       // The decoded sequences' context lengths (new token included), summed.
  double wall_s = 0;           // The forward pass and sampling.
};

class StepWindow {
 public:
  static constexpr size_t kDefaultCapacity = 8192;
  // capacity > 0.
  explicit StepWindow(size_t capacity = kDefaultCapacity);

  // Numbers `sample` (seq = total() + 1) and keeps it, dropping the oldest when full.
  void record(StepSample sample);
  // Samples recorded so far (the seq of the newest).
  uint64_t total() const { return total_; }
  // The kept samples with seq > `seq`, oldest first.
  std::vector<StepSample> after(uint64_t seq) const;

 private:
  std::vector<StepSample> ring_;  // Sample seq s sits at (s - 1) % capacity.
  uint64_t total_ = 0;
};

}  // namespace pdserve::engine
