// The in-process inference engine: a model on N tensor-parallel ranks (a thread each, and on
// the CPU backend cpu_threads - 1 helpers each), a paged KV cache, and a continuous-batching
// scheduler. Requests join and leave between steps; prompts prefill in chunks under a per-step
// token budget while other sequences decode; each generated token is reported through the
// request's callback. This is the engine both the prefill and decode workers wrap, and the
// reference every distributed topology must equal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "engine/block_allocator.h"
#include "engine/kv_cache_layout.h"
#include "engine/model_loader.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"
#include "engine/sampling/sampler.h"
#include "engine/sampling/stop_checker.h"
#include "engine/step_window.h"

namespace pdserve::engine {

class Backend;
class HostKvTier;
class KvTiers;
class QueueMark;
class RankPool;
class ModelWeightsF32;

// The prefix cache (docs/prefix_caching.md): full prompt and output blocks stay cached after
// their request ends, keyed by their content, and a later request with the same leading
// tokens (in the same namespace) starts from them instead of computing them.
struct PrefixCacheOptions {
  bool enabled = true;
  // Mixed into every key (--kv-hash-secret-file): keys are unpredictable without it.
  std::string secret;
  // Gets the cache's KV events; may be null. Must outlive the engine.
  KvEventSink* event_sink = nullptr;
  // Tests: replaces chain_key, e.g. with one that makes every key equal (collision safety).
  BlockKeyFn key_fn;
};

struct EngineOptions {
  int tp = 1;
  // Threads each rank of the CPU backend computes with (its own and cpu_threads - 1 helpers that
  // split GEMM columns and attention's tokens; the same tokens whatever the count). 1 elsewhere:
  // a GPU backend's kernels run on the device.
  int cpu_threads = 1;
  // The ranks' compute backend (make_backend's kind): "cpu", or "cuda" / "hip" (rank r on GPU r
  // of those CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES show; NCCL / RCCL between ranks).
  std::string backend = "cpu";
  // Tests: makes rank r's backend instead of make_backend(backend, r) (collectives and the
  // memory budget still follow `backend`'s kind).
  std::function<StatusOr<std::unique_ptr<Backend>>(int rank)> backend_factory;
  // GEMM weights in device memory: f32, or bf16 (half the memory and the bytes a decode step
  // reads; exact for bf16 checkpoints, a rounding of f32 ones). The CPU backend takes f32 only.
  DType weight_dtype = DType::kF32;
  // How the GEMMs take their activations (engine/dtype.h): kExact (f32; the CPU's tokens for a
  // bf16 checkpoint) or kBf16 (rounded to bf16, so the vendor bf16 GEMMs and tensor cores can run
  // them; bf16 weights only, within a tolerance of kExact).
  GemmPrecision gemm_precision = GemmPrecision::kExact;
  // Decode steps recorded once per batch bucket as GPU graphs and replayed (engine/decode_graphs.h):
  // one launch a step instead of one a kernel. The eager step's bits where the GEMMs are the
  // portable ones (a vendor GEMM may pick another kernel for the padded row count). GPU backends
  // at TP 1 only.
  bool decode_graphs = false;
  // The paged KV cache's elements: f32, or bf16 (half the bytes attention reads and the cache
  // holds, so twice the blocks in the same memory; each K and V element rounded to nearest even
  // once, where it is written). The CPU backend keeps f32 KV only. Producer and consumer of a
  // KV transfer must agree (the KV spec's fingerprint includes it).
  DType kv_dtype = DType::kF32;
  // Where tokens are sampled: kAuto samples on the backend when its memory is not the host's
  // (only the tokens cross, not [batch][vocab] logits), else on the host; kHost and kBackend
  // force one (tests compare them). The tokens are the same either way (kernels/cpu/sampling.h).
  enum class SampleOn { kAuto, kHost, kBackend };
  SampleOn sample_on = SampleOn::kAuto;
  // Asynchronous scheduling (vLLM's async scheduling, SGLang's overlap scheduler): the engine
  // queues step N+1 before it reads step N's tokens, so that the host's scheduling, stop checks
  // and streaming run while the device computes. A decode token whose value the host has not
  // read yet is fed from the device's sampled tokens. The tokens are those of the synchronous
  // schedule; what differs: a sequence that stops at step N (a stop token or string) still
  // computes one wasted token in step N+1, and a step that would preempt a sequence waits for
  // the step before it. Penalised rows' tokens join their seen slots on the backend
  // (kernels::SampleRow::add_sampled), so their steps overlap too; above TP 1 rank 0 broadcasts
  // the sampled tokens to the other ranks. Takes sampling on the backend.
  bool async_scheduling = false;
  int block_size = 16;
  // KV cache size per rank: bytes, or else a fraction of the device's memory (less the rank's
  // weights on a device backend, as vLLM's gpu_memory_utilization), or else enough for
  // max_running full-length sequences capped at 512 MiB.
  uint64_t kv_cache_bytes = 0;
  double memory_utilization = 0.0;
  int max_batch_tokens = 512;  // Tokens per step (decode tokens + prefill chunks).
  int max_running = 256;       // Sequences in flight.
  // Where each rank's KV arena lives. Empty (the default): the rank's backend allocates it.
  // Otherwise it is called once per rank with the arena's size (kv_layout(rank).total_bytes())
  // and returns at least that many bytes, which the engine zero-fills and never frees: they
  // belong to the allocator's owner and must outlive the engine. Used to compute straight into
  // memory a kvtransfer transport allocated (KvRankEndpoint with allocate_arena), which UCX's
  // shared-memory transports let peers copy into directly (docs/kvtransfer.md). Host memory:
  // for the CPU backend only.
  KvArenaAllocator kv_arena_allocator;
  // Times each step's forward pass and sampling (StepSample::wall_s); tests inject their own.
  const Clock* clock = &RealClock::instance();
  // Steps the step window keeps (Engine::steps_after).
  size_t step_window = StepWindow::kDefaultCapacity;
  PrefixCacheOptions prefix_cache;
  // The host tier (engine/host_kv_tier.h, --host-kv-bytes): bytes of host memory per rank for
  // blocks the device cache gives up; 0: none. Needs the prefix cache (its keys).
  uint64_t host_kv_bytes = 0;
  // The filesystem tier (engine/fs_kv_tier.h, --kv-offload-dir): a directory of chunk files of
  // kv_offload_chunk_blocks blocks each, stored from the host tier and loaded through it, at most
  // kv_offload_dir_bytes (0: no limit). Empty: none. Needs the host tier.
  std::string kv_offload_dir;
  uint64_t kv_offload_dir_bytes = 0;
  int kv_offload_chunk_blocks = 16;
  // How long one admission may wait for chunk files (--kv-load-timeout-ms; 0: no limit), from
  // when it asked for them. Files are read on the tiers' loader thread while the request waits
  // PENDING (the running sequences keep stepping); past the deadline the request keeps the
  // contiguous prefix read so far and computes the rest. Measured on `clock`.
  Duration kv_load_timeout{0};
};

// How a request's KV cache crosses between a prefill and a decode engine.
struct KvHandoff {
  // Prefill side: stop after the first token and hand the prompt's blocks to the caller (in
  // the finishing TokenEvent) instead of freeing them; the caller frees them with
  // Engine::release_blocks once the transfer no longer needs them.
  bool prefill_only = false;
  // prefill_only: called on the scheduler thread when the request is admitted — before any of
  // its KV is computed — with the blocks that will hold it (the prompt's first). The caller
  // owns them from then on: they come back in the finishing TokenEvent whatever the outcome
  // (abort and errors included), so that a transfer started from the layer hook never reads
  // blocks the engine gave to someone else.
  std::function<void(const std::vector<int>& blocks)> on_admitted;
  // Decode side: the prompt's KV is already in these blocks (from Engine::reserve_cached_blocks,
  // filled by kvtransfer), and `first_token` is what the prefill side sampled. The request
  // starts decoding at once; the engine owns the blocks from then on.
  std::vector<int> preloaded_blocks;
  int first_token = -1;
  // Decode side: the client already has `first_token` and its text (the router streamed it
  // from the prefill side's answer). It goes through the stop rules as usual, but no event
  // carries it: the stream starts with the token after it (or only finishes the request).
  bool first_token_streamed = false;
};

struct GenerationRequest {
  std::string id;
  std::vector<int> prompt;  // Token ids, BOS included when wanted.
  SamplingParams params;
  KvHandoff handoff;
  // A migrated request (its first worker failed mid-stream): the last `resumed_tokens` tokens
  // of `prompt` are output that an earlier run already generated and streamed. The sampler
  // skips their random draws and the stop rules see them (text held back as a possible stop
  // string stays held back), so the run goes on exactly where the earlier one stopped; their
  // text is not streamed again. params.max_tokens counts the tokens still to generate, but
  // params.min_tokens all of the output, the resumed tokens included (as the frequency and
  // presence penalties count them). The resumed tokens are part of the prompt for
  // params.prompt_logprobs (the router does not ask for those on re-placement).
  int resumed_tokens = 0;
  // The request's prefix-cache namespace: it shares cached blocks only with requests of the
  // same salt (vLLM's cache_salt; isolates tenants from each other's timing side channel).
  std::string cache_salt;
};

// A token's log-probability and its most likely alternatives (kernels::RowLogprobs).
struct TokenLogprob {
  int token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top;  // Most likely first.
};

// One step's news for one request.
struct TokenEvent {
  std::string id;
  int token = -1;        // The new token (-1 when the event only finishes the request).
  std::string text;      // Text safe to show now (complete UTF-8, stop strings held back).
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  Status error;          // Set when the request failed.
  std::vector<int> blocks;  // prefill_only: the prompt's blocks, now the caller's.
  // params.logprobs >= 0: of `token`; unset on events without one (a stop token is not output),
  // and on the decode side of a P/D split for the handed-over first token (the prefill side's
  // event carries it).
  std::optional<TokenLogprob> logprob;
  // params.prompt_logprobs >= 0, on the request's first event: one per prompt token from the
  // second on (the first has none), in order. Only the engine that computes the prompt has
  // them: a preloaded request's come from its prefill side.
  std::vector<TokenLogprob> prompt_logprobs;
  // Prompt tokens whose KV came from the prefix cache instead of being computed (on every
  // event; 0 for a preloaded request, whose KV came from elsewhere).
  int cached_tokens = 0;
};
using TokenCallback = std::function<void(const TokenEvent&)>;

struct GenerationResult {
  std::vector<int> prompt_token_ids;
  std::vector<int> token_ids;  // Generated, without the stop token.
  std::string text;
  // With params.logprobs >= 0, one per token_ids entry; with params.prompt_logprobs >= 0, one
  // per prompt token from the second on.
  std::vector<TokenLogprob> logprobs, prompt_logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  int cached_tokens = 0;  // TokenEvent::cached_tokens.
};

struct EngineStats {
  int num_blocks = 0;
  int free_blocks = 0;       // Blocks a request can take: free or evictable.
  int evictable_blocks = 0;  // Cached blocks no request holds (the LRU list).
  int cached_blocks = 0;     // Blocks the prefix cache names (evictable or in use).
  int block_size = 0;
  int waiting = 0;
  int running = 0;
  uint64_t kv_bytes_per_rank = 0;
  // Since the engine started, over the steps that ran a forward pass (StepSample's sums):
  uint64_t steps = 0;
  uint64_t prefill_tokens = 0;  // Prompt tokens computed.
  uint64_t decode_tokens = 0;   // Tokens decoded, one per decoding sequence and step.
  double step_seconds = 0;      // Forward passes and sampling.
  uint64_t graph_steps = 0;     // Steps run by replaying a recorded decode graph (decode_graphs).
  uint64_t graphs_recorded = 0;  // Decode graphs recorded (again when the logits buffers grew).
  // Asynchronous scheduling: steps launched while the one before was still out, and tokens
  // computed for sequences that had finished by the time their step was collected (one a stop).
  uint64_t overlapped_steps = 0;
  uint64_t wasted_tokens = 0;
  // Prefix cache, since start: prompt tokens of admitted requests that looked it up, those of
  // them it held, and key collisions found by the exact token check (each a miss).
  uint64_t prefix_query_tokens = 0;
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefix_collisions = 0;
  // Sequences preempted to make room for others' next blocks (each recomputes what the prefix
  // cache no longer holds of it when it resumes).
  uint64_t preemptions = 0;
  // The step running now (live, not published): its prompt tokens plus decoding sequences, 0
  // between steps. A watcher tells a long step (a large prefill chunk) from a stuck engine.
  int64_t step_tokens_in_progress = 0;
  // The host tier (all 0 without one): its blocks, those free or evictable, those holding a
  // cached key; prompt tokens admitted requests found there (beyond the device's hit), blocks
  // copied in (stored) and out (loaded) since start.
  int host_blocks = 0;
  int host_free_blocks = 0;
  int host_cached_blocks = 0;
  uint64_t host_hit_tokens = 0;
  uint64_t host_stored_blocks = 0;
  uint64_t host_loaded_blocks = 0;
  // pull-host leases (lease_host_copy): blocks shared with the host tier's cache, blocks copied.
  uint64_t host_lease_shared_blocks = 0;
  uint64_t host_lease_copied_blocks = 0;
  // The filesystem tier (all 0 without one): blocks per chunk file (0: no tier), prompt tokens
  // found there (beyond the device's and the host's hits), chunk files written and read, stores
  // dropped, files that failed a check, files evicted over --kv-offload-dir-bytes, and the chunk
  // files and bytes the tier indexes now.
  int disk_chunk_blocks = 0;
  uint64_t disk_hit_tokens = 0;
  uint64_t disk_stored_chunks = 0;
  uint64_t disk_loaded_chunks = 0;
  uint64_t disk_dropped_chunks = 0;
  uint64_t disk_corrupt_files = 0;
  uint64_t disk_evicted_files = 0;
  uint64_t disk_files = 0;
  uint64_t disk_bytes = 0;
  // Seconds the tiers' loader spent reading chunk files, and the loads that reached
  // --kv-load-timeout-ms (their requests computed the rest).
  double disk_load_s = 0;
  uint64_t disk_load_timeouts = 0;
  // Admissions that waited PENDING while chunk files were read for them (off the scheduler's
  // thread; `waiting` counts them meanwhile).
  uint64_t disk_pending_loads = 0;
};

class Engine {
 public:
  // The most prompt-log-probability logit rows a step computes (SamplingParams::prompt_logprobs):
  // they bound the logits buffers to (this + max_running) rows of the vocabulary.
  static constexpr int kMaxPromptLogprobRows = 256;

  // Builds the engine over a loaded model (which it keeps).
  static StatusOr<std::unique_ptr<Engine>> create(LoadedModel model, const EngineOptions& options);
  ~Engine();

  // Queues a request; its callback runs on the thread that calls step(). Fails at once on
  // bad parameters, an empty prompt, or a prompt that leaves no room in the context.
  Status add_request(GenerationRequest request, TokenCallback callback);
  // Cancels a request: its blocks are freed at once and its callback gets finish "abort".
  void abort(const std::string& id);
  // Runs one scheduler iteration (admission, one forward pass, sampling).
  Status step();
  bool has_work() const;
  // Steps until every queued request has finished.
  Status run_until_idle();
  // Runs one request to completion on its own.
  StatusOr<GenerationResult> generate(std::vector<int> prompt, const SamplingParams& params);

  // Blocks for a request of `num_tokens` tokens whose prompt `prompt` has its KV arrive from
  // elsewhere (the decode side of P/D); ResourceExhausted when too few are free. Its leading
  // blocks come from the prefix cache (namespace `cache_salt`) where it holds them, each
  // retained, so that only blocks[cached_blocks, ...) need the prompt's KV from elsewhere (an
  // empty `prompt` looks nothing up).
  // Every full prompt block may hit, the last one included: the decode side never computes the
  // prompt (the first token comes from the prefill side), unlike add_request's lookup, which
  // leaves the last prompt token to compute. release_blocks gives hit and new blocks back alike.
  struct Reservation {
    std::vector<int> blocks;
    int cached_blocks = 0;  // blocks[0, cached_blocks) hold the KV of prompt[0, cached_blocks·B).
  };
  StatusOr<Reservation> reserve_cached_blocks(const std::vector<int>& prompt, std::string_view cache_salt,
                                              int num_tokens);
  // Returns blocks from reserve_cached_blocks or a prefill_only hand-off.
  Status release_blocks(const std::vector<int>& blocks);
  // pull-host (docs/kv_offload.md): host-tier slots holding `blocks` (a prefill_only hand-off's, of
  // `prompt` in namespace `cache_salt`) leased to the caller (HostKvTier::lease: the full blocks
  // the host tier holds already are shared, the rest copied) — the caller then releases the device
  // blocks at once — until release_host_lease. FailedPrecondition without a host tier;
  // ResourceExhausted when the host tier has too few slots free or evictable.
  StatusOr<std::vector<int>> lease_host_copy(const std::vector<int>& prompt, std::string_view cache_salt,
                                             const std::vector<int>& blocks);
  Status release_host_lease(const std::vector<int>& slots);
  // The keys of `prompt`'s leading full blocks (at most `blocks`) in namespace `cache_salt`, and
  // the namespace's root: what this engine's caches, tiers and KV events name them by.
  struct PromptKeys {
    BlockKey ns_root;
    std::vector<BlockKey> keys;
  };
  PromptKeys prompt_keys(const std::vector<int>& prompt, std::string_view cache_salt, int blocks) const;
  // The host tier (thread-safe; the peer tier leases and fills its slots), or null without one.
  HostKvTier* host_tier() const;
  // Rank `rank`'s host-tier arena and its block count (null, 0 without a host tier).
  uint8_t* host_kv_arena(int rank) const;
  int host_kv_blocks() const;
  // Blocks a request of `prompt_len` prompt tokens and `max_tokens` needs in this engine.
  int blocks_needed(int prompt_len, int max_tokens) const;

  // The prefix cache's key root (block_key.h): with a request's namespace it gives the keys
  // this engine's cache and KV events use; routers compute the same keys from it.
  const BlockKey& kv_key_root() const { return key_root_; }
  bool prefix_caching() const { return options_.prefix_cache.enabled; }
  // Leading tokens of `tokens` the prefix cache holds now, in namespace `cache_salt` (whole
  // blocks; read only; the last token never counts, as a request always computes it).
  int cached_prefix_tokens(const std::vector<int>& tokens, std::string_view cache_salt = "");
  // The keys `tier` holds (the KV events' exactness checks; none for a tier it lacks).
  std::vector<BlockKey> cached_keys(KvTier tier = KvTier::kDevice) const;
  // Waits until the filesystem tier's queued chunk files are written (no-op without one).
  void flush_disk_writes();
  // Uncaches every block (running requests keep theirs, uncached); events get "cleared".
  void reset_prefix_cache();

  // Called on every rank's thread right after the rank wrote entry `layer` of the KV cache spec
  // (an attention layer, or an index cache: see ModelConfig::index_cache_layer) for this step;
  // `completed` lists the requests whose whole prompt KV is in the cache for that layer now.
  // Lets push mode send each layer while later layers compute. Set before the first step.
  using LayerHook = std::function<void(int rank, int layer, const std::vector<std::string>& completed)>;
  void set_layer_hook(LayerHook hook);

  // The KV arena and its layout on `rank` (for registering with kvtransfer).
  uint8_t* kv_arena(int rank) const;
  const KvCacheLayout& kv_layout(int rank) const;
  // Rank `rank`'s backend (whose memory kv_arena(rank) is).
  Backend& backend(int rank) const;
  int tp() const { return options_.tp; }
  int max_running() const { return options_.max_running; }
  int max_batch_tokens() const { return options_.max_batch_tokens; }

  const ModelConfig& config() const { return model_.config; }
  const Tokenizer& tokenizer() const { return *model_.tokenizer; }
  const LoadedModel& model() const { return model_; }
  // Tokens the KV cache holds (blocks × block size).
  int64_t kv_capacity_tokens() const;
  // Safe from any thread, also while another thread is inside step() and from token
  // callbacks: free blocks, waiting requests and the step in progress are live; running and the
  // step/token counters are as the scheduler last published them (at admission and at the end
  // of each step), so at most one step old.
  EngineStats stats() const;
  // The step window's samples with seq > `seq`, oldest first (the last
  // EngineOptions::step_window steps at most). Safe from any thread, as stats(); a sample is
  // published with the counters of its step.
  std::vector<StepSample> steps_after(uint64_t seq) const;

 private:
  struct Sequence;
  struct LaunchedStep;
  Engine(LoadedModel model, const EngineOptions& options);
  // Moves waiting requests into running_; appends those with a KvHandoff::on_admitted to
  // `admitted` (the caller runs the callbacks once mu_ is released).
  void admit(std::vector<Sequence*>* admitted);
  // Gives each running sequence the blocks its next step writes, oldest first; when the pool is
  // short, preempts the latest admitted sequences (back to the front of waiting_) until it fits.
  // Never with a step out: then it stops short and returns false (collect, then call it again).
  bool grow_blocks();
  // Takes a running sequence's blocks back (its cached ones stored in the host tier first); it is
  // recomputed from its tokens — and what the tiers still hold of them — when admitted again.
  void preempt(Sequence& seq);
  // Stores the sequence's first `blocks` cached blocks in the host tier, and its chunks the host
  // tier holds whole in the filesystem tier (no-op without them).
  void store_in_host(Sequence& seq, int blocks);
  // Loads what the host and filesystem tiers hold of the sequence's blocks [from, limit) into its
  // device blocks; returns the end of the run loaded (`from` when none).
  int load_from_tiers(Sequence& seq, int from, int limit);
  Status run_step();  // step() but for the KV events' step end.
  // Builds the next step from the running sequences and launches it (queued, under
  // async_scheduling; else run to its results) into launched_; OK with nothing to launch. A
  // step that fails to launch fails its sequences.
  Status launch_step();
  // Takes the oldest launched step's results: its sequences' KV counts as computed, their
  // tokens are accepted (stop rules, callbacks). A failed step fails its sequences.
  Status collect_step();
  // The KV positions `seq` has to its last known or launched token: its tokens, and the token a
  // launched step samples for it unless that one ends it (a later step never feeds it).
  int kv_length(const Sequence& seq) const;
  // Waits until the device has run every launched step, before blocks may go to writers outside
  // its queue (a KV transfer into reserved blocks): a launched step may still write the blocks of
  // a sequence that finished meanwhile. Any thread.
  Status wait_for_launched_steps();
  // `reservation` once wait_for_launched_steps() returned (taken first: a step launched before
  // its blocks came back is then waited for too); its blocks released if the wait fails.
  StatusOr<Reservation> after_launched_steps(Reservation reservation);
  // Whether a PENDING sequence's prefetch is done (caller holds mu_).
  bool prefetch_done_locked() const;
  // With nothing to run but PENDING sequences, waits (a bounded while) for a prefetch to end or
  // a request or an abort to arrive.
  void wait_for_prefetches();
  void finish(Sequence& seq, FinishReason reason, Status error = absl::OkStatus());
  // Feeds a sampled (or handed-over) token to the sequence and reports it; finishes if due.
  // `streamed`: the client already has this token; only its finish (if any) is reported.
  // `logprobs`: the row it was sampled from asked for them (params.logprobs >= 0).
  void accept_token(Sequence& seq, int token, bool streamed = false,
                    const kernels::RowLogprobs* logprobs = nullptr);
  // The prefix cache: the keys of `seq`'s first `blocks` full blocks (computed once), and
  // caching its blocks whose KV every rank has written (at the end of a step).
  void extend_keys(Sequence& seq, int blocks);
  void cache_computed_blocks(Sequence& seq);
  // Moves the sequence's prompt log-probabilities into `ev` when it asked for them and they are
  // all computed, once: the request's first event carries them.
  void attach_prompt_logprobs(Sequence& seq, TokenEvent& ev);
  // The next row to sample `seq` with (Sampler::next_row); its logit_bias entries, appended
  // to `biases`, and before min_tokens its stop ids, appended to `banned`; and, with any
  // penalty, its seen slot (handed out on first use) and the ids of its tokens not yet in the
  // slot, appended to `seen_new_ids`: the whole prompt at its first sample, then the new token.
  kernels::SampleRow sample_row(Sequence& seq, std::vector<int>* seen_new_ids,
                                     std::vector<kernels::LogitBias>* biases, std::vector<int>* banned);
  // Copies the scheduler's counters and running count for stats() (scheduler thread), and
  // `waiting` when the caller holds mu_, which guards waiting_; records the `step` that
  // brought the counters there, so that the window and the counters agree.
  void publish_stats(std::optional<int> waiting = std::nullopt, const StepSample* step = nullptr);

  LoadedModel model_;
  EngineOptions options_;
  std::unique_ptr<ModelWeightsF32> weights_;  // Outlives ranks_, whose shards point into it.
  std::unique_ptr<RankPool> ranks_;
  std::unique_ptr<BlockAllocator> blocks_;
  // The host and filesystem tiers; null without a host tier. Destroyed before ranks_ (the host
  // tier copies through their backends).
  std::unique_ptr<KvTiers> tiers_;
  mutable std::mutex mu_;  // Guards waiting_ and pending aborts (add/abort come from any thread).
  std::deque<std::shared_ptr<Sequence>> waiting_;
  // PENDING: waiting for their chunk files (Sequence::prefetch); also guarded by mu_. Back to the
  // front of waiting_ once read.
  std::vector<std::shared_ptr<Sequence>> loading_;
  std::condition_variable idle_;  // With mu_: a request, an abort or a prefetch's end.
  std::vector<std::string> aborts_;
  // Shared with the launched steps that feed them: a sequence aborted meanwhile lives until its
  // steps are collected.
  std::vector<std::shared_ptr<Sequence>> running_;
  // Steps launched and not yet collected (oldest first): at most one between scheduler
  // iterations, two while one is launched behind another; and how many, for any thread.
  std::deque<std::unique_ptr<LaunchedStep>> launched_;
  std::atomic<int> steps_in_flight_{0};
  std::mutex launched_mark_mu_;               // wait_for_launched_steps may come from any thread.
  // Async scheduling: its mark, on rank 0's queue. Above TP 1 it covers every rank's KV writes
  // too: each layer's all-reduce, which every rank queues after that layer's KV writes, completes
  // on rank 0 only once every rank has reached it.
  std::unique_ptr<QueueMark> launched_mark_;
  uint64_t next_step_id_ = 0;
  TimePoint last_collect_{};  // When the previous launched step's results came (step wall times).
  std::vector<float> logits_;
  bool sample_on_backend_ = false;
  // The penalties' slots (kernels::SeenTokens): seen_slots_ handed out so far, those free
  // again (a finished sequence's), and, sampling on the host, their bitmaps and output counts.
  int seen_slots_ = 0;
  std::vector<int> free_seen_slots_;
  std::vector<uint32_t> host_seen_bits_;
  std::vector<int32_t> host_counts_;
  kernels::cpu::SampleScratch host_scratch_;
  EngineStats stats_;  // Written by the scheduler thread only; stats() reads published_.
  // Taken after mu_ when both are held (add_request and admit publish under mu_).
  mutable std::mutex stats_mu_;
  EngineStats published_;  // Guarded by stats_mu_.
  std::atomic<int64_t> step_tokens_in_progress_{0};  // EngineStats::step_tokens_in_progress.
  StepWindow step_window_;  // Guarded by stats_mu_.
  LayerHook layer_hook_;
  BlockKey key_root_;
  BlockKeyFn key_fn_;  // PrefixCacheOptions::key_fn, else chain_key.
};

}  // namespace pdserve::engine
