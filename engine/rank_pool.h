// The threads of an engine's tensor-parallel ranks. The caller's thread is rank 0; ranks 1..N-1
// have a thread each that waits for the next batch. A forward pass returns once every rank has
// finished it (the ranks meet in a final barrier), so batches never overlap.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/rank_runner.h"

namespace pdserve::engine {

class RankPool {
 public:
  static StatusOr<std::unique_ptr<RankPool>> create(const ModelConfig& config,
                                                    const ModelWeightsF32& weights,
                                                    const KvCacheSpec& kv_spec, int num_blocks, int tp,
                                                    const KvArenaAllocator& arena_allocator = {});
  ~RankPool();

  // Runs `batch` on every rank; logits as RankRunner::forward.
  void forward(const ForwardBatch& batch, float* logits);
  int size() const { return int(runners_.size()); }
  RankRunner& rank(int r) { return *runners_[r]; }

 private:
  RankPool() = default;
  void worker(int rank);

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RankRunner>> runners_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  const ForwardBatch* batch_ = nullptr;
  float* logits_ = nullptr;
};

}  // namespace pdserve::engine
