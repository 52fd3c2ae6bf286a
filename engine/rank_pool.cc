#include "engine/rank_pool.h"

#include <cblas.h>

namespace pdserve::engine {

StatusOr<std::unique_ptr<RankPool>> RankPool::create(const ModelConfig& config,
                                                     const ModelWeightsF32& weights,
                                                     const KvCacheSpec& kv_spec, int num_blocks, int tp,
                                                     const KvArenaAllocator& arena_allocator) {
  PD_RETURN_IF_ERROR(config.validate_tp(tp));
  auto pool = std::unique_ptr<RankPool>(new RankPool());
  // Ranks are the parallelism when there are several; BLAS threads would only contend.
  if (tp > 1) openblas_set_num_threads(1);
  pool->comms_ = make_shared_memory_group(tp);
  for (int r = 0; r < tp; ++r) {
    pool->backends_.push_back(make_cpu_backend());
    PD_ASSIGN_OR_RETURN(RankShard shard, shard_weights(config, weights, r, tp));
    PD_ASSIGN_OR_RETURN(auto runner, RankRunner::create(config, std::move(shard), kv_spec, num_blocks,
                                                        pool->backends_[r].get(), pool->comms_[r].get(),
                                                        arena_allocator));
    pool->runners_.push_back(std::move(runner));
  }
  for (int r = 1; r < tp; ++r) pool->threads_.emplace_back(&RankPool::worker, pool.get(), r);
  return pool;
}

RankPool::~RankPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankPool::forward(const ForwardBatch& batch, float* logits) {
  {
    std::lock_guard lock(mu_);
    batch_ = &batch;
    logits_ = logits;
    ++generation_;
  }
  cv_.notify_all();
  runners_[0]->forward(batch, logits);
}

void RankPool::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    const ForwardBatch* batch;
    float* logits;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      batch = batch_;
      logits = logits_;
    }
    runners_[rank]->forward(*batch, logits);
  }
}

}  // namespace pdserve::engine
