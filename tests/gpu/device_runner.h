// A forward pass whose every buffer lives in backend memory: weights uploaded once, activations
// and per-step metadata (tokens, positions, block tables) in backend allocations, only the
// wanted logits copied back. engine::RankRunner keeps activations in host vectors, which is
// right for the CPU backend only; this is the shape it takes for a device backend (see
// docs/gpu.md), used by the GPU tests and benchmark until RankRunner takes it over. It works on
// any Backend, so the CPU backend checks the harness itself on machines without a GPU.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/kv_cache_layout.h"
#include "engine/model_weights.h"
#include "engine/rank_runner.h"

namespace pdserve::testing {

// Backend memory released with the backend's deallocate.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { reset(); }
  // Makes room for at least `bytes` (contents are lost when it grows).
  Status reserve(engine::Backend* backend, size_t bytes);
  void reset();
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  engine::Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The model's tensors in backend memory: `host`'s fp32 tensors uploaded once (a tied
// classifier shares the embedding's copy), wrapped as a ModelWeightsF32 whose pointers are
// backend pointers, ready for engine::shard_weights.
struct DeviceWeights {
  std::vector<std::unique_ptr<BackendBuffer>> buffers;
  std::unique_ptr<engine::ModelWeightsF32> weights;
};
StatusOr<std::unique_ptr<DeviceWeights>> upload_weights(const engine::ModelConfig& config,
                                                        const engine::ModelWeightsF32& host,
                                                        engine::Backend* backend);

// Wraps tensors already in backend memory (one pointer per model_tensors entry, in its order;
// nullptr for an absent optional tensor) the same way, e.g. synthetic weights made on a GPU.
StatusOr<std::unique_ptr<engine::ModelWeightsF32>> wrap_device_tensors(
    const engine::ModelConfig& config, const std::vector<const float*>& tensors);

// The collectives of a single rank on `backend`: nothing to exchange (a gather copies).
std::unique_ptr<engine::Communicator> make_single_rank_communicator(engine::Backend* backend);

class DeviceRankRunner {
 public:
  static StatusOr<std::unique_ptr<DeviceRankRunner>> create(const engine::ModelConfig& config,
                                                            engine::RankShard shard,
                                                            const engine::KvCacheSpec& kv_spec,
                                                            int num_blocks, engine::Backend* backend,
                                                            engine::Communicator* comm);
  // As RankRunner::forward: `batch` in host memory (block tables too), `logits` a host
  // [logit_rows][vocab] array that receives this rank's vocabulary columns.
  Status forward(const engine::ForwardBatch& batch, float* logits);

 private:
  DeviceRankRunner(const engine::ModelConfig& config, engine::RankShard shard,
                   engine::KvCacheLayout layout, engine::Backend* backend, engine::Communicator* comm);
  Status reserve(int tokens, int logit_rows);
  // Uploads tokens, positions and block tables; returns the placement in backend pointers.
  StatusOr<kernels::cpu::TokenPlacement> upload_metadata(const engine::ForwardBatch& batch);

  engine::ModelConfig config_;
  engine::RankShard shard_;
  engine::KvCacheLayout layout_;
  engine::Backend* backend_;
  engine::Communicator* comm_;
  BackendBuffer arena_;
  std::vector<kernels::cpu::PagedLayerView> views_;
  BackendBuffer x_, xn_, q_, k_, v_, attn_, out_, gate_, up_, last_, logits_local_, q_index_, k_index_,
      block_mask_, meta_, table_ptrs_;
  std::vector<int> meta_host_;
  std::vector<const int*> table_ptrs_host_;
  std::vector<float> logits_host_;
};

}  // namespace pdserve::testing
