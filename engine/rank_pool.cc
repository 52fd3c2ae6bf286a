#include "engine/rank_pool.h"

#include "engine/gpu_module.h"
#include "engine/spin_barrier.h"

namespace pdserve::engine {
namespace {

// The collectives of the ranks `backends` of `backend` kind: shared memory between host buffers
// (the emulated GPU's memory is host memory), NCCL/RCCL between GPUs, on the ranks' streams. One
// rank needs none, whatever its memory.
StatusOr<std::vector<std::unique_ptr<Communicator>>> make_group(const std::string& backend,
                                                                const std::vector<std::unique_ptr<Backend>>& backends) {
  const int tp = int(backends.size());
  if (backend == "cpu" || backend == "emulated" || tp == 1) return make_shared_memory_group(tp);
#if defined(PDSERVE_GPU_KIND)
  if (backend == PDSERVE_GPU_KIND) {
    PD_ASSIGN_OR_RETURN(const GpuBackendApi* gpu, load_gpu_module(backend));
    std::vector<Backend*> ranks;
    for (const auto& b : backends) ranks.push_back(b.get());
    return gpu->make_group(ranks);
  }
#endif
  return absl::UnimplementedError(absl::StrCat("no collectives for TP ", tp, " on the ", backend, " backend"));
}

}  // namespace

StatusOr<std::unique_ptr<RankPool>> RankPool::create(const ModelConfig& config,
                                                     const ModelWeightsF32& weights,
                                                     const KvCacheSpec& kv_spec, int num_blocks,
                                                     const EngineOptions& options) {
  const int tp = options.tp;
  PD_RETURN_IF_ERROR(config.validate_tp(tp));
  auto pool = std::unique_ptr<RankPool>(new RankPool());
  for (int r = 0; r < tp; ++r) {
    PD_ASSIGN_OR_RETURN(auto backend,
                        options.backend_factory
                            ? options.backend_factory(r)
                            : make_backend(options.backend, r, {options.cpu_threads, tp * options.cpu_threads}));
    pool->backends_.push_back(std::move(backend));
  }
  PD_ASSIGN_OR_RETURN(pool->comms_, make_group(options.backend, pool->backends_));
  for (int r = 0; r < tp; ++r) {
    Backend* backend = pool->backends_[r].get();
    PD_ASSIGN_OR_RETURN(RankShard shard, shard_weights(config, weights, r, tp));
    if (!backend->host_memory() || options.weight_dtype != DType::kF32) {
      if (backend->host_memory())
        return absl::InvalidArgumentError(absl::StrCat("the ", backend->name(), " backend computes with f32 weights, not ",
                                                       dtype_name(options.weight_dtype)));
      PD_ASSIGN_OR_RETURN(auto uploaded, upload_shard(config, shard, backend, options.weight_dtype));
      shard = uploaded->shard;
      pool->uploaded_.push_back(std::move(uploaded));
    }
    shard.gemm_precision = options.gemm_precision;
    shard.decode_graphs = options.decode_graphs;
    PD_ASSIGN_OR_RETURN(auto runner, RankRunner::create(config, std::move(shard), kv_spec, num_blocks,
                                                        options.max_batch_tokens, backend, pool->comms_[r].get(),
                                                        options.kv_arena_allocator));
    pool->runners_.push_back(std::move(runner));
  }
  pool->spins_ = spin_budget(tp * options.cpu_threads);
  for (int r = 1; r < tp; ++r) pool->threads_.emplace_back(&RankPool::worker, pool.get(), r);
  return pool;
}

RankPool::~RankPool() {
  stop_ = true;
  wake();
  for (std::thread& t : threads_) t.join();
  runners_.clear();  // Before the shards and backends they use.
  uploaded_.clear();
}

Status RankPool::forward(const ForwardBatch& batch, const StepOutput& out) {
  // Every rank prepared before any enters a collective: a rank that could not would leave the
  // others waiting in it.
  meta_.pack(batch, runners_[0]->kv_layout().block_size());
  if (size() > 1 && meta_.sampled_rows_read > 0)
    return absl::InvalidArgumentError(
        absl::StrCat("token ", -meta_.sampled_rows_read,
                     " is a sampled token not read yet: above TP 1 only a launched step's "
                     "tokens reach every rank"));
  for (auto& runner : runners_) PD_RETURN_IF_ERROR(runner->prepare(batch, meta_));
  batch_ = &batch;
  out_ = out;
  launch_ = false;
  wake();
  Status status = runners_[0]->forward(batch, out);
  // Every rank set its status before the final barrier that rank 0 has passed.
  for (int r = 1; r < size(); ++r) status.Update(runners_[r]->status());
  return status;
}

Status RankPool::launch(const ForwardBatch& batch, bool logprobs) {
  // What a rank would refuse without taking a slot, refused for all (each rank has as many out).
  PD_RETURN_IF_ERROR(runners_[0]->can_launch(batch));
  meta_.pack(batch, runners_[0]->kv_layout().block_size());
  for (auto& runner : runners_) PD_RETURN_IF_ERROR(runner->prepare(batch, meta_));
  batch_ = &batch;
  launch_on_every_rank(logprobs);
  Status status;
  for (const Status& s : launch_status_) status.Update(s);
  if (!status.ok())  // Out on every rank; the caller fails the step now.
    for (auto& runner : runners_) runner->withdraw_launch();
  return status;
}

void RankPool::launch_on_every_rank(bool logprobs) {
  launch_status_.resize(size());
  launch_ = true;
  launch_logprobs_ = logprobs;
  queued_.store(0);
  wake();
  launch_status_[0] = runners_[0]->launch(*batch_, logprobs);
  // Until the others have queued it too: the next step's prepare rewrites what they read.
  for (int queued = queued_.load(); queued < size() - 1; queued = queued_.load())
    spin_then_wait(queued_, queued, queue_waiters_, spins_);
}

Status RankPool::collect(const StepOutput& out) {
  Status status = runners_[0]->collect(out);
  for (int r = 1; r < size(); ++r) status.Update(runners_[r]->collect({}));
  return status;
}

void RankPool::wake() {
  generation_.fetch_add(1);
  wake_sleepers(generation_, sleepers_);
}

void RankPool::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    spin_then_wait(generation_, seen, sleepers_, spins_);
    seen = generation_.load();
    if (stop_) return;
    if (launch_) {
      launch_status_[rank] = runners_[rank]->launch(*batch_, launch_logprobs_);
      queued_.fetch_add(1);
      wake_sleepers(queued_, queue_waiters_);
    } else {
      (void)runners_[rank]->forward(*batch_, out_);  // Its status is read through status().
    }
  }
}

}  // namespace pdserve::engine
