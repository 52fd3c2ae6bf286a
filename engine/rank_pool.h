// The threads of an engine's tensor-parallel ranks. The caller's thread is rank 0; ranks 1..N-1
// have a thread each that waits for the next batch. A forward pass returns once every rank has
// finished it (the ranks meet in a final barrier), so batches never overlap; a launched step
// returns once every rank has queued it. Each rank has its own backend (rank r on device r for a
// device backend) and its shard of the weights in it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/engine.h"
#include "engine/rank_runner.h"
#include "engine/shard_upload.h"

namespace pdserve::engine {

class RankPool {
 public:
  // `weights` are host tensors; a device backend gets each rank's shard uploaded. Of `options`,
  // the ranks take tp, backend, backend_factory, weight_dtype, gemm_precision, max_batch_tokens
  // (the most tokens of a forward pass) and kv_arena_allocator.
  static StatusOr<std::unique_ptr<RankPool>> create(const ModelConfig& config,
                                                    const ModelWeightsF32& weights,
                                                    const KvCacheSpec& kv_spec, int num_blocks,
                                                    const EngineOptions& options);
  ~RankPool();

  // Runs `batch` on every rank; results as RankRunner::forward. On an error none are valid. A
  // batch above TP 1 with a placeholder token (a sampled token not read yet) is refused: only a
  // launched step shares its sampled tokens with the other ranks.
  Status forward(const ForwardBatch& batch, const StepOutput& out);
  // RankRunner::launch and collect on every rank: `batch` is prepared and queued by each rank's
  // thread, and its results taken by a later collect() (rank 0's tokens; every rank's errors).
  // A launch that fails on any rank is withdrawn from every rank before it returns, so a failed
  // step leaves none out (the steps launched before it stay).
  Status launch(const ForwardBatch& batch, bool logprobs);
  Status collect(const StepOutput& out);
  int size() const { return int(runners_.size()); }
  RankRunner& rank(int r) { return *runners_[r]; }
  // Weight bytes in device memory per rank (0 on a host-memory backend, which uses them in place).
  uint64_t uploaded_weight_bytes() const { return uploaded_.empty() ? 0 : uploaded_[0]->bytes; }

 private:
  RankPool() = default;
  void worker(int rank);
  void wake();  // Releases the rank threads (for batch_ or stop_).
  // Wakes the rank threads to launch batch_, launches it on rank 0, and waits until every rank has
  // queued it; each rank's launch status in launch_status_.
  void launch_on_every_rank(bool logprobs);

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<UploadedShard>> uploaded_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<RankRunner>> runners_;
  std::vector<std::thread> threads_;
  // Bumped for each batch (batch_, out_ written first) and once more to stop; rank threads spin
  // on it, then sleep (spin_barrier.h), so back-to-back steps wake them without a syscall.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  int spins_ = 0;  // spin_budget(tp).
  bool stop_ = false;
  const ForwardBatch* batch_ = nullptr;
  bool launch_ = false;  // The rank threads launch batch_ (RankRunner::launch) instead of forward().
  bool launch_logprobs_ = false;
  std::vector<Status> launch_status_;  // Per rank, of the last launch.
  // Ranks 1..N-1 that have queued the current launch; the caller waits on it.
  std::atomic<int> queued_{0};
  std::atomic<int> queue_waiters_{0};
  StepOutput out_;
  StepMetadata meta_;  // The current batch's, packed once for every rank.
};

}  // namespace pdserve::engine
