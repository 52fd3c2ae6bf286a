// One tensor-parallel rank: its weight shard, its slice of the paged KV cache (one arena laid
// out by KvCacheLayout), and the forward pass over a batch of tokens from many sequences.
// Ranks of one engine run the same batch on their own threads and meet in the Communicator.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/kv_cache_layout.h"
#include "engine/model_weights.h"

namespace pdserve::engine {

// The tokens of one engine step, flattened over sequences.
struct ForwardBatch {
  std::vector<int> tokens;
  std::vector<int> positions;
  std::vector<const int*> block_tables;  // Per token: its sequence's block table.
  std::vector<int> logit_rows;           // Tokens whose next-token logits are wanted.
  // Called after each layer's KV is written (see Engine::set_layer_hook), with
  // `completed_prefills` — the requests whose whole prompt is in the cache after this step.
  const std::function<void(int, int, const std::vector<std::string>&)>* layer_hook = nullptr;
  std::vector<std::string> completed_prefills;
};

class RankRunner {
 public:
  // Allocates the rank's KV arena (`num_blocks` blocks) on `backend`, or takes it from
  // `arena_allocator` when set (then zero-filled here and never freed by the runner).
  static StatusOr<std::unique_ptr<RankRunner>> create(const ModelConfig& config, RankShard shard,
                                                      const KvCacheSpec& kv_spec, int num_blocks,
                                                      Backend* backend, Communicator* comm,
                                                      const KvArenaAllocator& arena_allocator = {});
  ~RankRunner();

  // Runs the model over `batch`. Writes this rank's vocabulary columns of each wanted row into
  // `logits` ([logit_rows][vocab], shared by all ranks) and returns after every rank has.
  void forward(const ForwardBatch& batch, float* logits);

  const KvCacheLayout& kv_layout() const { return layout_; }
  uint8_t* kv_arena() const { return arena_; }

 private:
  RankRunner(const ModelConfig& config, RankShard shard, KvCacheLayout layout, Backend* backend,
             Communicator* comm);
  void resize_scratch(int tokens);

  ModelConfig config_;
  RankShard shard_;
  KvCacheLayout layout_;
  Backend* backend_;
  Communicator* comm_;
  uint8_t* arena_ = nullptr;
  bool owns_arena_ = false;  // From backend_ (freed here), not from a KvArenaAllocator.
  std::vector<kernels::cpu::PagedLayerView> views_;
  // Activations, resized to the largest batch seen.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, out_, gate_, up_, last_, logits_local_, q_index_, k_index_;
  std::vector<uint8_t> block_mask_;
};

}  // namespace pdserve::engine
