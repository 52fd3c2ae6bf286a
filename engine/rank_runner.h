// One tensor-parallel rank: its weight shard, its slice of the paged KV cache (one arena laid
// out by KvCacheLayout), and the forward pass over a batch of tokens from many sequences.
// Ranks of one engine run the same batch on their own threads and meet in the Communicator.
// Every buffer the kernels touch is the backend's memory (weights, KV arena, activations, the
// step's tokens, positions and block tables), so one forward pass serves the CPU backend, where
// that memory is host memory, and device backends, where only the wanted logits come back.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/backend_buffer.h"
#include "engine/communicator.h"
#include "engine/decode_graphs.h"
#include "engine/kv_cache_layout.h"
#include "engine/model_weights.h"

namespace pdserve::engine {

// The tokens of one engine step, flattened over sequences.
struct ForwardBatch {
  // A token -1 - r is the token the previous step sampled for its logit row r, which the host
  // has not read yet (asynchronous scheduling: RankRunner::launch, which shares rank 0's sampled
  // tokens with every rank).
  std::vector<int> tokens;
  std::vector<int> positions;
  std::vector<const int*> block_tables;  // Per token: its sequence's block table.
  std::vector<int> logit_rows;           // Tokens whose next-token logits are wanted.
  // Empty, or how to sample each logit row: then the ranks sample on the backend (the LM head's
  // shards gathered on rank 0) and only the tokens come back.
  std::vector<kernels::SampleRow> samples;
  // With samples: the ids that rows with a seen slot add to it this step (SampleRow::new_ids_*),
  // and how many slots the engine has handed out. Rank 0 keeps that many bitmaps of the
  // vocabulary in backend memory across steps, so a step uploads only the new ids.
  std::vector<int> seen_new_ids;
  int seen_slots = 0;
  // With samples: the step's logit edits (kernels::LogitEdits), which rows name by range.
  std::vector<kernels::LogitBias> biases;
  std::vector<int> banned;
  // Called after each layer's KV is written (see Engine::set_layer_hook), with
  // `completed_prefills` — the requests whose whole prompt is in the cache after this step.
  const std::function<void(int, int, const std::vector<std::string>&)>* layer_hook = nullptr;
  std::vector<std::string> completed_prefills;
};

// Where a forward pass leaves its result, in host memory: [logit_rows][vocab] logits, or for a
// batch with samples one token per logit row and, when `logprobs` is set (some row asks:
// SampleRow::logprobs >= 0), the rows' log-probabilities (those of rows not asking undefined).
struct StepOutput {
  float* logits = nullptr;
  int* tokens = nullptr;
  kernels::RowLogprobs* logprobs = nullptr;
};

// A step's metadata packed once for all ranks: [tokens][positions][logit rows][each distinct
// block table, as far as the step's tokens reach], and per token the index of its table's first
// entry.
struct StepMetadata {
  std::vector<int> ints;
  std::vector<int64_t> table_at;
  // The leading tokens that are each their sequence's only one (the engine puts decode tokens
  // first): attention runs them apart from the prompt chunks that follow.
  int single_tokens = 0;
  // 1 + the highest row of the previous step's sampled tokens that a placeholder token
  // (`-1 - row`, asynchronous scheduling) reads; 0 when the step has none.
  int64_t sampled_rows_read = 0;
  // Packs `batch` for a cache of `block_size`-token blocks.
  void pack(const ForwardBatch& batch, int block_size);
};

class RankRunner {
 public:
  // Allocates the rank's KV arena (`num_blocks` blocks) on `backend`, or takes it from
  // `arena_allocator` when set (host memory, so for a host-memory backend only; zero-filled
  // here and never freed by the runner). `shard`'s tensors are in `backend`'s memory. Scratch
  // for batches of up to `max_tokens` tokens is allocated here, so forward() never allocates.
  static StatusOr<std::unique_ptr<RankRunner>> create(const ModelConfig& config, RankShard shard,
                                                      const KvCacheSpec& kv_spec, int num_blocks,
                                                      int max_tokens, Backend* backend,
                                                      Communicator* comm,
                                                      const KvArenaAllocator& arena_allocator = {});
  ~RankRunner();

  // Copies `batch`'s tokens, positions and block tables (`meta`, packed from it) into the
  // backend for the next forward(). Fails, touching nothing any rank shares, for a batch over
  // max_tokens or a failed copy; so a pool prepares every rank before any enters the
  // collectives.
  Status prepare(const ForwardBatch& batch, const StepMetadata& meta);
  // Runs the model over the prepared `batch`. Writes this rank's vocabulary columns of each
  // wanted row into out.logits (shared by all ranks) — or, for a batch with samples, rank 0
  // writes the tokens — and returns after every rank has. An error (a failed copy or kernel) still takes the rank through every
  // collective, so the other ranks never wait for it. The result is also kept for status(),
  // set before the final barrier: once any rank returned, every rank's is there.
  Status forward(const ForwardBatch& batch, const StepOutput& out);
  // forward() in two halves: launch() queues the prepared `batch` and returns without waiting for
  // it; collect() waits for the oldest step launched and not collected and, on rank 0, writes its
  // tokens (and its log-probabilities, if `logprobs` was set) into `out` (unless out.tokens is
  // null). At most two steps wait to be collected, so that the host builds and queues step N+1
  // while the backend runs step N, and reads step N's tokens while it runs step N+1 (whose decode
  // tokens may be step N's sampled ones: above TP 1 rank 0 broadcasts them to every rank, a
  // collective every rank's launch() joins). A batch with logit rows samples on the backend. A
  // step whose launch() failed is still launched, so that every rank of a pool has the same steps
  // out: withdraw_launch() takes it back (on every rank, when any failed).
  Status launch(const ForwardBatch& batch, bool logprobs);
  Status collect(const StepOutput& out);
  // Why launch() would refuse `batch` without launching it (OK: it would launch it).
  Status can_launch(const ForwardBatch& batch) const;
  // Takes back the newest launched step once the backend has run it; its results are dropped.
  void withdraw_launch();
  // Steps launched and not collected.
  int launched() const { return launched_; }
  Status status() const;
  // Steps run by replaying a recorded decode graph (RankShard::decode_graphs); any thread.
  uint64_t graph_replays() const { return graph_replays_.load(std::memory_order_relaxed); }
  // Decode graphs recorded, each bucket again after the buffers its graph writes grew; any thread.
  uint64_t graphs_recorded() const { return graphs_recorded_.load(std::memory_order_relaxed); }

  const KvCacheLayout& kv_layout() const { return layout_; }
  uint8_t* kv_arena() const { return arena_; }
  Backend& backend() const { return *backend_; }

 private:
  RankRunner(const ModelConfig& config, RankShard shard, KvCacheLayout layout, Backend* backend,
             Communicator* comm);
  Status reserve(int max_tokens);
  // The bucket `batch` runs as, a recorded decode graph's (engine/decode_graphs.h), or 0 to run it
  // eagerly: decode tokens only, each wanting its logits, at TP 1, completing no prompt.
  int graph_bucket(const ForwardBatch& batch, const StepMetadata& meta) const;
  // prepare()'s upload for a step run as `bucket`: its tokens, positions, logit rows and tables
  // padded to the bucket in the fixed graph buffers, which every replay of it reads.
  Status prepare_graph_step(const ForwardBatch& batch, const StepMetadata& meta, int bucket);
  // The model over the prepared step's `n` tokens, from the embedding to the logits GEMM's `rows`
  // rows; `layer_written`, if set, after each layer's KV is written.
  void run_layers(int n, int rows, const std::function<void(int)>& layer_written);
  // run_layers for a step run as `bucket`: by replaying its graph, or eagerly and then recording
  // the graph for the next such step (the eager run first sizes what kernels grow on first use,
  // as a recording may allocate nothing). A graph whose replay fails is dropped: eager from then.
  Status run_graph_step(int bucket);
  // A GEMM with the shard's weights (f32 or bf16 behind the same pointers).
  void matmul(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw);
  // act = silu(x·gateᵀ) · (x·upᵀ) with the fused [gate | up] weight `w` (2·hidden rows of `in`):
  // Backend::gate_up_silu_bf16 for bf16 weights, else the GEMM into `gate_up` and silu_mul.
  void gate_up_silu(float* act, float* gate_up, const float* x, const float* w, int rows, int hidden, int in);
  // The prepared step up to its results: the layers, then the logits into `logits` (host memory;
  // a batch without samples) or the sampled tokens queued for the host in the next slot of
  // sampled_ (with log-probabilities where `logprobs`) and, where `share_sampled` above TP 1,
  // broadcast into every rank's tokens_. Errors as forward's.
  Status run_step(const ForwardBatch& batch, float* logits, bool logprobs, bool share_sampled);
  // Waits for the oldest queued slot of sampled_ and copies its results into `out`.
  Status take_sampled(const StepOutput& out);
  // Uploads the RoPE table (engine/rope_scaling.h) of each distinct head dim into rope_tables_.
  Status upload_rope_tables();
  // paged_attention over `tokens`: its leading single tokens (single_tokens_) in a call of their
  // own, marked so, and the rest in another.
  void attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                 const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window, float scale);

  ModelConfig config_;
  RankShard shard_;
  KvCacheLayout layout_;
  Backend* backend_;
  Communicator* comm_;
  uint8_t* arena_ = nullptr;
  bool owns_arena_ = false;  // From backend_ (freed here), not from a KvArenaAllocator.
  std::vector<kernels::PagedLayerView> views_;
  int max_tokens_ = 0;
  int mask_stride_ = 0;  // Logical blocks of a full-length sequence.
  // Backend memory: activations for max_tokens_, the step's metadata, the logits rows, and for
  // sampling on the backend the gathered logits, the rows' parameters, scratch and tokens.
  // proj_ holds a layer's projections (QKV, then gate and up), q_ its roped queries, act_ the
  // MLP's activations.
  BackendBuffer x_, xn_, proj_, q_, attn_, out_, act_, last_, logits_local_, q_index_, k_index_, block_mask_, meta_,
      table_ptrs_, logits_gathered_, sample_rows_, sample_scratch_, tokens_;
  // The RoPE tables, one per distinct head dim, in backend memory; each layer's, as attention's
  // input stage takes it, in layer_rope_.
  BackendBuffer rope_tables_;
  std::vector<kernels::RopeTable> layer_rope_;
  kernels::TokenPlacement placement_;  // Into meta_ and table_ptrs_, from prepare().
  int single_tokens_ = 0;                   // StepMetadata::single_tokens, from prepare().
  const int* step_ints_ = nullptr;          // The step's [tokens][positions][logit rows][tables].
  // Decode graphs: the bucket prepare() chose (0: eager), the largest, the graph steps' fixed
  // inputs (ints as meta_'s, table pointers as table_ptrs_'s) and host staging for them.
  int step_bucket_ = 0;
  int graph_max_batch_ = 0;
  BackendBuffer graph_ints_, graph_table_ptrs_;
  std::vector<int> graph_ints_host_;
  DecodeGraphs graphs_;
  std::atomic<uint64_t> graph_replays_{0}, graphs_recorded_{0};
  std::vector<const int*> table_ptrs_host_;
  mutable std::mutex status_mu_;
  Status status_;  // Of the last forward(), guarded by status_mu_.
  std::vector<float> logits_host_;
  // A step's results on their way to the host, one slot a step: two, so that step N+1's copy is
  // queued while the host still reads step N's. Each rank marks and checks its own steps; rank 0
  // also copies the sampled tokens, into host memory pinned on a device backend.
  struct SampledSlot {
    PinnedHostBuffer tokens;          // Rank 0: int[max_tokens_]
    PinnedHostBuffer logprobs;        // Rank 0: kernels::RowLogprobs[max_tokens_]
    std::unique_ptr<QueueMark> mark;  // Recorded after the slot's copies.
    int rows = 0;
    bool with_logprobs = false;
    Status status;  // What queuing the step reported.
  };
  std::array<SampledSlot, 2> sampled_;
  // The slot of the oldest step not collected (of a forward pass: its own, just filled).
  SampledSlot& oldest_out() { return sampled_[next_slot_ ^ (launched_ == 2 ? 0 : 1)]; }
  int next_slot_ = 0;  // The slot the next step fills.
  int launched_ = 0;   // Slots filled by launch() and not yet collected.
  // Rank 0, sampling on the backend: the penalties' bitmaps and output counts
  // (ForwardBatch::seen_slots of each, kept across steps), the step's new ids, logit edits and
  // the rows' log-probabilities.
  BackendBuffer seen_bits_, seen_counts_, seen_new_ids_, biases_, banned_, logprobs_;
};

}  // namespace pdserve::engine
