#include "engine/engine.h"

#include <algorithm>

#include "common/logging.h"
#include "engine/kv_tiers.h"
#include "engine/model_weights.h"
#include "engine/rank_pool.h"
#include "engine/shard_upload.h"
#include "engine/weights_digest.h"

namespace pdserve::engine {

struct Engine::Sequence {
  Sequence(GenerationRequest r, TokenCallback c, const ModelConfig& config)
      : request(capped(std::move(r), config.max_seq_len)), callback(std::move(c)),
        sampler(request.params), stop(with_resumed(request.params, request.resumed_tokens), config.eos_ids) {
    tokens = request.prompt;
    const SamplingParams& p = request.params;
    for (const auto& [id, bias] : p.logit_bias) biases.push_back({id, bias});
    // Sorted by id, one entry per id (the last given wins), so that a row's edits are a set.
    std::stable_sort(biases.begin(), biases.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    for (size_t i = 0; i + 1 < biases.size();) {
      if (biases[i].id == biases[i + 1].id) {
        biases.erase(biases.begin() + int64_t(i));
      } else {
        ++i;
      }
    }
    if (p.min_tokens > 0) {
      min_tokens_banned = p.stop_token_ids;
      if (!p.ignore_eos)
        min_tokens_banned.insert(min_tokens_banned.end(), config.eos_ids.begin(), config.eos_ids.end());
      std::sort(min_tokens_banned.begin(), min_tokens_banned.end());
      min_tokens_banned.erase(std::unique(min_tokens_banned.begin(), min_tokens_banned.end()), min_tokens_banned.end());
    }
  }
  // The stop rules' token budget covers the resumed output too: they count every token pushed
  // (min_tokens already counts all of the output).
  static SamplingParams with_resumed(SamplingParams p, int resumed) {
    p.max_tokens += resumed;
    return p;
  }
  // Generation ends when the next token would need a position past the context, so at most
  // max_seq_len + 1 - prompt tokens are generated (llama2.c's `steps` semantics).
  static GenerationRequest capped(GenerationRequest r, int max_seq_len) {
    if (r.handoff.prefill_only) r.params.max_tokens = 1;
    r.params.max_tokens = std::min<int64_t>(r.params.max_tokens, int64_t(max_seq_len) + 1 - int64_t(r.prompt.size()));
    return r;
  }
  // Replays the resumed output into the stop rules and the sampler (their deltas were streamed
  // by the earlier run); InvalidArgument if that output had already ended generation.
  Status resume(const Tokenizer& tokenizer) {
    const int first = int(tokens.size()) - request.resumed_tokens;
    for (int i = first; i < int(tokens.size()); ++i) {
      const std::string bytes = tokenizer.token_text(tokens[i - 1], tokens[i], request.params.skip_special_tokens);
      (void)stop.push(tokens[i], bytes);
      if (stop.finished())
        return absl::InvalidArgumentError(absl::StrCat("resumed output token ", i - first,
                                                       " already ends generation (", std::string(finish_reason_name(stop.finish_reason())), ")"));
      sampler.skip_draw();
    }
    return absl::OkStatus();
  }
  GenerationRequest request;
  TokenCallback callback;
  Sampler sampler;
  StopChecker stop;
  std::vector<int> tokens;  // Prompt, then generated tokens.
  int num_computed = 0;     // Leading tokens whose KV is in the cache.
  // The penalties' slot (kernels::SeenTokens; -1: none yet) and how many of `tokens` are in it:
  // those uploaded as new ids, and each token a penalised row sampled, which joined the slot
  // where it was sampled (SampleRow::add_sampled).
  int seen_slot = -1;
  size_t seen_synced = 0;
  std::vector<kernels::LogitBias> biases;  // params.logit_bias, sorted by id.
  std::vector<int> min_tokens_banned;           // Stop ids, banned before min_tokens.
  std::vector<TokenLogprob> prompt_logprobs;    // Collected over the prefill steps.
  bool prompt_logprobs_sent = false;
  std::vector<int> blocks;
  bool finished = false;
  // The prefix cache: the namespace's chain start, the keys of the leading full blocks (as far
  // as computed), how many leading blocks are cached or were offered to the cache, the link
  // the chain goes on from, and whether it cannot go on (a collision or an evicted link).
  BlockKey ns_root;
  std::vector<BlockKey> keys;
  int chain_done = 0;
  std::optional<CachedLink> chain;
  bool chain_broken = false;
  int cached_tokens = 0;
  int preemptions = 0;  // Times its blocks were taken back to make room (it recomputes them).
  // Launched steps not yet collected (Engine::launched_): the tokens they feed it, whose KV
  // num_computed counts once their step is collected, and the one that samples its next token,
  // which the host has not read (its id, and its logit row there; -1: none).
  int fed_ahead = 0;
  int64_t pending_step = -1;
  int pending_row = -1;
  KvTiers::Progress tiers;  // How far its blocks reached the host and filesystem tiers.
  // The chunk files read ahead of its admission (PENDING in Engine::loading_ until done), and
  // whether admission looked for them already (both reset once it is admitted).
  std::shared_ptr<KvTiers::Prefetch> prefetch;
  bool prefetch_tried = false;

  // Where the output starts in `tokens`: the resumed tokens of a migrated request are output.
  int output_start() const { return int(request.prompt.size()) - request.resumed_tokens; }
  int generated() const { return int(tokens.size()) - output_start(); }
};

// A launched step: what it fed, what its logit rows are, where its results land.
struct Engine::LaunchedStep {
  struct Fed {
    std::shared_ptr<Sequence> seq;
    int tokens = 0;
  };
  // A logit row: the one sampling a sequence's next token (prompt_pos -1), or for
  // params.prompt_logprobs one per position of a prompt chunk that has a next prompt token,
  // whose log-probability it gives (its sampled token is unused).
  struct Row {
    Sequence* seq;  // Kept alive by `fed`.
    int prompt_pos;
    bool adds_sampled = false;  // Its token joins the sequence's seen slot where it is sampled.
  };
  int64_t id = 0;
  std::vector<Fed> fed;
  std::vector<Row> rows;
  std::vector<int> tokens;
  std::vector<kernels::RowLogprobs> logprobs;  // When some row asks.
  std::vector<kernels::SampleRow> host_rows;   // Sampling on the host: the rows' parameters.
  std::vector<int> seen_new_ids;
  std::vector<kernels::LogitBias> biases;
  std::vector<int> banned;
  Status status;  // Synchronous scheduling: how the step, run to its results, went.
  StepSample sample;
  TimePoint started{};
};

namespace {

int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::create(LoadedModel model, const EngineOptions& options) {
  const ModelConfig& c = model.config;
  PD_RETURN_IF_ERROR(c.validate());
  PD_RETURN_IF_ERROR(c.validate_tp(options.tp));
  if (options.block_size <= 0 || options.max_batch_tokens <= 0 || options.max_running <= 0)
    return absl::InvalidArgumentError("block size, batch token budget and max running must be positive");
  if (model.tokenizer == nullptr) return absl::InvalidArgumentError("model has no tokenizer");
  PD_RETURN_IF_ERROR(check_cpu_threads(options.cpu_threads));
  if (options.cpu_threads > 1 && options.backend_factory)
    return absl::InvalidArgumentError(
        "cpu_threads sets the threads of the backends make_backend makes; a backend_factory sets its own");
  if (options.gemm_precision == GemmPrecision::kBf16 && options.weight_dtype != DType::kBF16)
    return absl::InvalidArgumentError(absl::StrCat(
        "--gemm-precision bf16 multiplies bf16 activations by bf16 weights: ", "it takes --weight-dtype bf16, not ",
        dtype_name(options.weight_dtype)));
  if (options.decode_graphs && options.tp > 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--decode-graphs runs at TP 1 (a recorded step cannot hold the "
                     "collectives between ranks yet), not TP ",
                     options.tp));
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(model), options));
  const ModelConfig& config = engine->model_.config;
  const KvCacheSpec spec = config.kv_cache_spec(options.block_size, options.kv_dtype);
  PD_ASSIGN_OR_RETURN(uint64_t block_bytes, KvCacheLayout::bytes_per_block(spec, options.tp));
  PD_ASSIGN_OR_RETURN(auto weights, ModelWeightsF32::create(config, *engine->model_.weights));
  uint64_t budget = options.kv_cache_bytes;
  if (budget == 0 && options.memory_utilization > 0) {
    if (options.memory_utilization > 1.0)
      return absl::InvalidArgumentError("--memory-utilization must be in (0, 1]");
    PD_ASSIGN_OR_RETURN(auto device, make_backend(options.backend, 0));
    const uint64_t share = uint64_t(double(device->memory_bytes()) * options.memory_utilization);
    // A device holds the rank's weights too (rank 0's shard is the largest: uneven splits give
    // the first ranks the extra rows); the CPU backend maps them from the page cache.
    uint64_t weight_bytes = 0;
    if (!device->host_memory()) {
      PD_ASSIGN_OR_RETURN(const RankShard shard, shard_weights(config, *weights, 0, options.tp));
      PD_ASSIGN_OR_RETURN(weight_bytes, uploaded_bytes(config, shard, options.weight_dtype));
    }
    if (share <= weight_bytes)
      return absl::InvalidArgumentError(absl::StrCat("--memory-utilization leaves ", share >> 20, " MiB of ",
                                                     device->name(), ", less than the ", weight_bytes >> 20,
                                                     " MiB of weights per rank"));
    budget = share - weight_bytes;
  }
  if (budget == 0) {
    const uint64_t full = uint64_t(options.max_running) * blocks_for(config.max_seq_len, options.block_size);
    budget = std::min<uint64_t>(full * block_bytes, 512ull << 20);
  }
  const uint64_t num_blocks = budget / block_bytes;
  if (num_blocks == 0)
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget of ", budget,
                                                   " bytes holds no block (a block takes ", block_bytes, ")"));
  if (num_blocks > (1u << 30)) return absl::InvalidArgumentError("KV cache budget too large");
  PD_ASSIGN_OR_RETURN(engine->ranks_, RankPool::create(config, *weights, spec, int(num_blocks), options));
  engine->weights_ = std::move(weights);
  using SampleOn = EngineOptions::SampleOn;
  engine->sample_on_backend_ =
      options.sample_on == SampleOn::kBackend ||
      (options.sample_on == SampleOn::kAuto && !engine->ranks_->rank(0).backend().host_memory());
  if (options.async_scheduling && !engine->sample_on_backend_)
    return absl::InvalidArgumentError(
        "--async-scheduling samples on the backend (the next step reads the tokens there); this engine samples on the "
        "host");
  if (options.async_scheduling) {
    PD_ASSIGN_OR_RETURN(engine->launched_mark_, engine->ranks_->rank(0).backend().create_mark());
  }
  engine->blocks_ =
      std::make_unique<BlockAllocator>(int(num_blocks), options.block_size, options.prefix_cache.event_sink);
  engine->key_root_ = key_root({spec.fingerprint(), weights_digest(*engine->model_.weights),
                                uint32_t(options.block_size), options.prefix_cache.secret});
  engine->key_fn_ = options.prefix_cache.key_fn ? options.prefix_cache.key_fn : BlockKeyFn(chain_key);
  if (options.host_kv_bytes == 0) {  // With a host tier, KvTiers::create checks these.
    PD_RETURN_IF_ERROR(check_disk_tier_flags(options.kv_offload_dir, options.kv_offload_dir_bytes, options.kv_load_timeout));
    if (!options.kv_offload_dir.empty())
      return absl::InvalidArgumentError("--kv-offload-dir needs --host-kv-bytes (its files are stored and loaded "
                                        "through the host tier)");
  } else {
    if (!options.prefix_cache.enabled)
      return absl::InvalidArgumentError("--host-kv-bytes needs the prefix cache (its block keys name the host tier's blocks)");
    std::vector<HostKvTier::DeviceRank> device;
    for (int r = 0; r < options.tp; ++r) {
      RankRunner& rank = engine->ranks_->rank(r);
      device.push_back({&rank.backend(), rank.kv_arena(), &rank.kv_layout()});
    }
    KvTiers::Options to;
    to.host_bytes_per_rank = options.host_kv_bytes;
    to.disk = {.dir = options.kv_offload_dir,
               .max_bytes = options.kv_offload_dir_bytes,
               .chunk_blocks = options.kv_offload_chunk_blocks,
               .block_size = options.block_size,
               .compat = spec.fingerprint(),
               .key_root = engine->key_root_,
               .sink = options.prefix_cache.event_sink};
    to.sink = options.prefix_cache.event_sink;
    to.load_timeout = options.kv_load_timeout;
    to.clock = options.clock;
    to.on_prefetched = [e = engine.get()] {
      std::lock_guard lock(e->mu_);
      e->idle_.notify_all();
    };
    PD_ASSIGN_OR_RETURN(engine->tiers_, KvTiers::create(std::move(device), std::move(to)));
    const int host_blocks = engine->tiers_->host().num_blocks();
    if (host_blocks < int(num_blocks))
      PD_LOG_WARN("the host KV tier ({} blocks) is smaller than the device cache ({} blocks): it keeps less than the "
                  "device gives up",
                  host_blocks, num_blocks);
    engine->stats_.host_blocks = host_blocks;
  }
  engine->stats_.num_blocks = int(num_blocks);
  engine->stats_.block_size = options.block_size;
  engine->stats_.kv_bytes_per_rank = num_blocks * block_bytes;
  engine->publish_stats();
  PD_LOG_INFO(
      "KV cache: {} blocks x {} tokens = {} tokens ({} MiB of {} per rank, TP {} on {}, weights uploaded {:.1f} MiB "
      "per rank, sampling on the {})",
      num_blocks, options.block_size, num_blocks * options.block_size, (num_blocks * block_bytes) >> 20,
      dtype_name(options.kv_dtype), options.tp, engine->ranks_->rank(0).backend().name(),
      double(engine->ranks_->uploaded_weight_bytes()) / (1 << 20), engine->sample_on_backend_ ? "backend" : "host");
  return engine;
}

Engine::Engine(LoadedModel model, const EngineOptions& options)
    : model_(std::move(model)), options_(options), step_window_(options.step_window) {}

// The tiers' loader thread goes first: it calls back into mu_ and idle_.
Engine::~Engine() { tiers_.reset(); }

int64_t Engine::kv_capacity_tokens() const { return int64_t(stats_.num_blocks) * options_.block_size; }

EngineStats Engine::stats() const {
  // Only stats_mu_, never mu_: a token callback may run under mu_ (aborts in admit) and read
  // stats on that same thread.
  EngineStats s;
  {
    std::lock_guard lock(stats_mu_);
    s = published_;
  }
  s.step_tokens_in_progress = step_tokens_in_progress_.load(std::memory_order_relaxed);
  const BlockAllocator::Counts counts = blocks_->counts();
  s.free_blocks = counts.free;
  s.evictable_blocks = counts.evictable;
  s.cached_blocks = counts.cached;
  s.prefix_collisions = counts.collisions;
  if (tiers_) {
    const HostKvTier& host_tier = tiers_->host();
    const BlockAllocator::Counts host = host_tier.counts();
    s.host_free_blocks = host.free;
    s.host_cached_blocks = host.cached;
    const HostKvTier::Copies copies = host_tier.copies();
    s.host_stored_blocks = copies.stored;
    s.host_loaded_blocks = copies.loaded;
    s.host_lease_shared_blocks = copies.lease_shared;
    s.host_lease_copied_blocks = copies.lease_copied;
  }
  if (const FsKvTier* fs = tiers_ ? tiers_->disk() : nullptr) {
    const FsKvTier::Counters disk = fs->counters();
    s.disk_stored_chunks = disk.stored_chunks;
    s.disk_loaded_chunks = disk.loaded_chunks;
    s.disk_dropped_chunks = disk.dropped_chunks;
    s.disk_corrupt_files = disk.corrupt_files;
    s.disk_evicted_files = disk.evicted_files;
    s.disk_files = disk.files;
    s.disk_bytes = disk.bytes;
    s.disk_chunk_blocks = fs->chunk_blocks();
    s.disk_load_s = tiers_->disk_load_seconds();
    s.disk_load_timeouts = tiers_->disk_load_timeouts();
    s.disk_pending_loads = tiers_->disk_pending_loads();
  }
  return s;
}

std::vector<StepSample> Engine::steps_after(uint64_t seq) const {
  std::lock_guard lock(stats_mu_);
  return step_window_.after(seq);
}

void Engine::publish_stats(std::optional<int> waiting, const StepSample* step) {
  std::lock_guard lock(stats_mu_);
  const int published_waiting = published_.waiting;
  published_ = stats_;
  published_.running = int(running_.size());
  published_.waiting = waiting.value_or(published_waiting);
  if (step) step_window_.record(*step);
}

Status Engine::add_request(GenerationRequest request, TokenCallback callback) {
  const ModelConfig& c = model_.config;
  // A migrated request's max_tokens counts the tokens still to generate, its min_tokens all of
  // the output: min_tokens is bounded by both together.
  PD_RETURN_IF_ERROR(Sequence::with_resumed(request.params, std::max(0, request.resumed_tokens)).validate());
  if (request.prompt.empty()) return absl::InvalidArgumentError("empty prompt: no tokens to start from");
  for (int t : request.prompt)
    if (t < 0 || t >= c.vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t, " outside the vocabulary [0, ", c.vocab_size, ")"));
  if (int64_t(request.prompt.size()) > c.max_seq_len)
    return absl::InvalidArgumentError(absl::StrCat("prompt of ", request.prompt.size(),
                                                   " tokens is longer than the model's context of ",
                                                   c.max_seq_len, " positions"));
  if (request.resumed_tokens < 0 || request.resumed_tokens >= int(request.prompt.size()))
    return absl::InvalidArgumentError(absl::StrCat("resumed_tokens ", request.resumed_tokens,
                                                   " must be in [0, prompt length ", request.prompt.size(), ")"));
  for (const auto& [id, bias] : request.params.logit_bias)
    if (id >= c.vocab_size)
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias token id ", id, " outside the vocabulary [0, ", c.vocab_size, ")"));
  const KvHandoff& h = request.handoff;
  const int need = blocks_needed(int(request.prompt.size()), h.prefill_only ? 1 : request.params.max_tokens);
  if (h.first_token_streamed && h.preloaded_blocks.empty())
    return absl::InvalidArgumentError("first_token_streamed needs a preloaded request");
  if (!h.preloaded_blocks.empty()) {
    if (h.prefill_only) return absl::InvalidArgumentError("a request cannot be both prefill-only and preloaded");
    // The prompt's KV is in them; the blocks of the tokens it generates come as it needs them.
    const int prompt_blocks = blocks_for(int(request.prompt.size()), options_.block_size);
    if (int(h.preloaded_blocks.size()) < prompt_blocks)
      return absl::InvalidArgumentError(absl::StrCat("preloaded request has ", h.preloaded_blocks.size(),
                                                     " KV blocks, its prompt fills ", prompt_blocks));
    if (h.first_token < 0 || h.first_token >= c.vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("preloaded request's first token ", h.first_token,
                                                     " is outside the vocabulary"));
    for (int b : h.preloaded_blocks)
      if (blocks_->ref_count(b) <= 0)
        return absl::InvalidArgumentError(absl::StrCat("preloaded block ", b, " is not reserved"));
  }
  if (need > stats_.num_blocks)
    return absl::ResourceExhaustedError(absl::StrCat("request needs ", need, " KV blocks; the cache has ",
                                                     stats_.num_blocks, " in all"));
  auto seq = std::make_shared<Sequence>(std::move(request), std::move(callback), c);
  PD_RETURN_IF_ERROR(seq->resume(*model_.tokenizer));
  seq->ns_root = namespace_root(key_root_, canonical_namespace(seq->request.cache_salt));
  std::lock_guard lock(mu_);
  waiting_.push_back(std::move(seq));
  idle_.notify_all();
  std::lock_guard published(stats_mu_);
  published_.waiting = int(waiting_.size() + loading_.size());
  return absl::OkStatus();
}

void Engine::abort(const std::string& id) {
  std::lock_guard lock(mu_);
  aborts_.push_back(id);
  idle_.notify_all();
}

bool Engine::has_work() const {
  std::lock_guard lock(mu_);
  return !waiting_.empty() || !loading_.empty() || !running_.empty() || !aborts_.empty() || steps_in_flight_.load() > 0;
}

bool Engine::prefetch_done_locked() const {
  return std::any_of(loading_.begin(), loading_.end(), [](const auto& s) { return s->prefetch->done(); });
}

void Engine::wait_for_prefetches() {
  std::unique_lock lock(mu_);
  if (loading_.empty() || !waiting_.empty() || !aborts_.empty()) return;
  // Only PENDING requests: sleep until a prefetch ends or a request or an abort comes, rather
  // than spin (the bound is a safety net: each of those notifies idle_).
  idle_.wait_for(lock, std::chrono::milliseconds(100),
                 [&] { return !waiting_.empty() || !aborts_.empty() || prefetch_done_locked(); });
}

void Engine::finish(Sequence& seq, FinishReason reason, Status error) {
  if (seq.finished) return;
  seq.finished = true;
  TokenEvent ev;
  ev.id = seq.request.id;
  const KvHandoff& handoff = seq.request.handoff;
  // With on_admitted the caller owns the blocks whatever the outcome (none before admission).
  // Its blocks of generated tokens join the prompt's in the host tier (those the device cached).
  store_in_host(seq, seq.chain_done);
  const bool hand_over = handoff.prefill_only && (handoff.on_admitted || (error.ok() && reason != FinishReason::kAbort));
  if (hand_over) {
    ev.blocks = std::move(seq.blocks);
  } else if (!seq.blocks.empty()) {
    Status s = blocks_->release(seq.blocks);
    if (!s.ok()) PD_LOG_ERROR("releasing blocks of {}: {}", seq.request.id, s.ToString());
  }
  seq.blocks.clear();
  // A preloaded request that ends before admission took its blocks (aborted while waiting):
  // they were handed to the engine with it, so they are released here.
  if (std::vector<int>& preloaded = seq.request.handoff.preloaded_blocks; !preloaded.empty()) {
    Status s = blocks_->release(preloaded);
    if (!s.ok()) PD_LOG_ERROR("releasing the preloaded blocks of {}: {}", seq.request.id, s.ToString());
    preloaded.clear();
  }
  if (seq.seen_slot >= 0) free_seen_slots_.push_back(seq.seen_slot);
  seq.seen_slot = -1;
  ev.finished = true;
  ev.reason = reason;
  ev.cached_tokens = seq.cached_tokens;
  ev.error = std::move(error);
  if (ev.error.ok() && reason != FinishReason::kAbort) attach_prompt_logprobs(seq, ev);
  if (seq.callback) seq.callback(ev);
}

void Engine::attach_prompt_logprobs(Sequence& seq, TokenEvent& ev) {
  if (seq.request.params.prompt_logprobs < 0 || seq.prompt_logprobs_sent ||
      seq.prompt_logprobs.size() + 1 != seq.request.prompt.size())
    return;
  ev.prompt_logprobs = std::move(seq.prompt_logprobs);
  seq.prompt_logprobs_sent = true;
}

namespace {

TokenLogprob token_logprob(int token, const kernels::RowLogprobs& lp) {
  TokenLogprob t{token, lp.logprob, {}};
  for (int i = 0; i < lp.top_count; ++i) t.top.push_back({lp.top_ids[i], lp.top_logprobs[i]});
  return t;
}

}  // namespace

void Engine::admit(std::vector<Sequence*>* admitted) {
  std::lock_guard lock(mu_);
  // Aborts first, so that their blocks are free for admission.
  for (const std::string& id : aborts_) {
    for (auto& seq : running_)
      if (seq->request.id == id) finish(*seq, FinishReason::kAbort);
    for (auto& seq : loading_)
      if (seq->request.id == id) {
        seq->prefetch->cancel();
        finish(*seq, FinishReason::kAbort);
      }
    for (auto& seq : waiting_)
      if (seq->request.id == id) finish(*seq, FinishReason::kAbort);
  }
  aborts_.clear();
  std::erase_if(waiting_, [](const auto& s) { return s->finished; });
  std::erase_if(loading_, [](const auto& s) { return s->finished; });
  // Sequences whose chunk files were read go back to the front, in their order: they were first.
  for (size_t i = loading_.size(); i-- > 0;) {
    if (!loading_[i]->prefetch->done()) continue;
    waiting_.push_front(std::move(loading_[i]));
    loading_.erase(loading_.begin() + int64_t(i));
  }
  // Preloaded requests hold their blocks already: they start at once, with the handed-over
  // token as their first output.
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->request.handoff.preloaded_blocks.empty()) {
      ++it;
      continue;
    }
    Sequence& seq = **it;
    seq.blocks = std::move(seq.request.handoff.preloaded_blocks);
    // Its blocks now (finish and preemption release those); preempted, it is recomputed here.
    seq.request.handoff.preloaded_blocks.clear();
    seq.num_computed = int(seq.request.prompt.size());
    cache_computed_blocks(seq);  // Its KV arrived whole.
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    seq.sampler.skip_draw();
    accept_token(seq, seq.request.handoff.first_token, seq.request.handoff.first_token_streamed);
  }
  // FIFO: a request that does not fit blocks the ones behind it, so none starves (a preempted
  // sequence goes back to the front). Admission takes blocks for what the sequence computes now
  // (its tokens and the next one) and leaves one spare block per running sequence, which is what
  // each may take next; decoding sequences take their next block as they reach it (grow_blocks).
  while (!waiting_.empty() && int(running_.size()) < options_.max_running) {
    Sequence& seq = *waiting_.front();
    const int prompt_len = int(seq.request.prompt.size());
    const int len = int(seq.tokens.size());
    const int need = std::min(blocks_needed(len, 1), blocks_needed(prompt_len, seq.request.params.max_tokens));
    // The last token is always computed (its logits give the next token), and prompt
    // log-probabilities need every prompt position's logits: neither can come from the cache.
    const bool lookup = options_.prefix_cache.enabled &&
                        (seq.request.params.prompt_logprobs < 0 || seq.prompt_logprobs_sent);
    const int max_hit = lookup ? (len - 1) / options_.block_size : 0;
    extend_keys(seq, max_hit);
    // Chunk files past what the device and the host hold are read first, off this thread: the
    // sequence waits PENDING in loading_ and those behind it are admitted meanwhile.
    if (tiers_ && tiers_->disk() && lookup && !seq.prefetch_tried) {
      // At most max_running wait PENDING (their chunks are held in memory until admitted): the
      // queue waits for one of them.
      if (int(loading_.size()) >= options_.max_running) break;
      seq.prefetch_tried = true;
      const std::span<const BlockKey> keys = std::span(seq.keys).first(size_t(max_hit));
      const int run = std::max(blocks_->cached_prefix(keys, seq.ns_root, seq.tokens),
                               tiers_->host().held_prefix(keys, seq.ns_root, seq.tokens));
      seq.prefetch = tiers_->prefetch({keys, seq.ns_root, seq.tokens, {}}, run, max_hit, seq.request.id);
      if (seq.prefetch) {
        loading_.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
        continue;
      }
    }
    auto a = blocks_->allocate_cached(std::span(seq.keys).first(size_t(max_hit)), seq.ns_root, seq.tokens, need,
                                      int(running_.size()));
    if (!a.ok()) break;
    seq.blocks = std::move(a->blocks);
    seq.chain_done = a->cached_blocks;
    seq.chain = a->last_hit;
    seq.chain_broken = false;
    int computed = a->cached_blocks;
    // The host and filesystem tiers continue the device's hit: their blocks are copied into the
    // new ones.
    if (tiers_ && lookup && computed < max_hit) computed = load_from_tiers(seq, computed, max_hit);
    seq.prefetch.reset();
    seq.prefetch_tried = false;
    seq.num_computed = computed * options_.block_size;
    if (seq.preemptions == 0) {
      seq.cached_tokens = seq.num_computed;
      if (lookup) {
        stats_.prefix_query_tokens += uint64_t(prompt_len);
        stats_.prefix_hit_tokens += uint64_t(seq.cached_tokens);
      }
    }
    if (seq.request.handoff.on_admitted) admitted->push_back(&seq);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  // Both counts at once, so that a request moving from waiting to running is counted once.
  publish_stats(int(waiting_.size() + loading_.size()));
}

bool Engine::grow_blocks() {
  const int b = options_.block_size;
  std::vector<std::shared_ptr<Sequence>> preempted;  // Newest first.
  for (size_t i = 0; i < running_.size();) {
    Sequence& s = *running_[i];
    bool s_gone = false;  // Preempted, or failed: running_[i] is the next sequence now.
    // A step writes the KV of every token not yet computed: the last sampled one when decoding.
    while (!s_gone && int(s.blocks.size()) < blocks_for(kv_length(s), b)) {
      if (auto more = blocks_->allocate(1); more.ok()) {
        s.blocks.push_back(more->front());
        continue;
      }
      if (!launched_.empty()) return false;  // Preemption waits for the steps out (none preempted yet).
      // The pool is short: the latest admitted sequence gives its blocks back (the one that has
      // waited least; it may be `s` itself). Prefill-only requests are never chosen: their
      // blocks are their caller's, and they never grow (admission gave them all they write).
      size_t victim = running_.size();
      while (victim > i && running_[victim - 1]->request.handoff.prefill_only) --victim;
      if (victim == i) {
        // Only `s` prefill-only leaves no victim, and admission gave it every block it writes:
        // this is a bug, and the request fails rather than have the step write past its blocks.
        PD_LOG_ERROR("prefill-only request {} is short of KV blocks ({} held, {} needed)", s.request.id,
                     s.blocks.size(), blocks_for(kv_length(s), b));
        finish(s, FinishReason::kAbort, absl::InternalError("a prefill-only request ran short of KV blocks"));
        running_.erase(running_.begin() + int64_t(i));
        s_gone = true;
        break;
      }
      --victim;
      preempt(*running_[victim]);
      preempted.push_back(std::move(running_[victim]));
      running_.erase(running_.begin() + int64_t(victim));
      s_gone = victim == i;
    }
    if (!s_gone) ++i;
  }
  if (preempted.empty()) return true;
  std::lock_guard lock(mu_);
  // Oldest at the front: the one preempted last was admitted earliest of them.
  for (auto& seq : preempted) waiting_.push_front(std::move(seq));
  publish_stats(int(waiting_.size() + loading_.size()));
  return true;
}

void Engine::preempt(Sequence& s) {
  // Never with a step out (run_step collects it first): its KV and tokens would be the void
  // blocks' and the recomputation's.
  PD_LOG_DEBUG("preempting {} ({} tokens, {} blocks) to make room", s.request.id, s.tokens.size(), s.blocks.size());
  // Its full blocks stay in the prefix cache (evictable) under their keys, and go to the host
  // tier (swapped out) where it has room: resuming, it takes back what either still holds and
  // recomputes the rest from its tokens.
  store_in_host(s, s.chain_done);
  if (Status st = blocks_->release(s.blocks); !st.ok())
    PD_LOG_ERROR("releasing blocks of preempted {}: {}", s.request.id, st.ToString());
  s.blocks.clear();
  s.num_computed = 0;
  s.chain_done = 0;
  s.chain.reset();
  s.chain_broken = false;
  s.tiers = {};
  // Prompt log-probabilities not yet sent are computed again with the prompt.
  if (!s.prompt_logprobs_sent) s.prompt_logprobs.clear();
  ++s.preemptions;
  ++stats_.preemptions;
}

Status Engine::step() {
  Status s = run_step();
  // One KV event batch per step: what admission evicted and the step cached.
  if (options_.prefix_cache.event_sink) options_.prefix_cache.event_sink->step_end();
  return s;
}

int Engine::kv_length(const Sequence& s) const {
  return int(s.tokens.size()) + (s.pending_row >= 0 && !s.stop.next_token_ends() ? 1 : 0);
}

Status Engine::wait_for_launched_steps() {
  // Synchronously a step is done when it joins launched_: nothing to wait for.
  if (!launched_mark_ || steps_in_flight_.load() == 0) return absl::OkStatus();
  // A mark of its own rather than synchronize(), which would take the steps' launch errors.
  std::lock_guard lock(launched_mark_mu_);
  PD_RETURN_IF_ERROR(launched_mark_->record());
  return launched_mark_->wait();
}

Status Engine::run_step() {
  Status status;
  std::vector<Sequence*> admitted;
  admit(&admitted);
  // Outside mu_: the callback may call back into the engine (release_blocks, abort).
  for (Sequence* s : admitted) s->request.handoff.on_admitted(s->blocks);
  std::erase_if(running_, [](const auto& s) { return s->finished; });
  // A growth that would preempt waits for the steps out (those it collects may free blocks too).
  // Checked where blocks are taken: a reservation on another thread may take free ones.
  while (!grow_blocks()) {
    status.Update(collect_step());
    std::erase_if(running_, [](const auto& s) { return s->finished; });
  }
  const size_t before = launched_.size();
  status.Update(launch_step());
  // The step before the one just launched (asynchronous), or that one (synchronous); with
  // nothing launched, the one still out.
  if (!launched_.empty() && (launched_.size() > 1 || !options_.async_scheduling || launched_.size() == before))
    status.Update(collect_step());
  if (running_.empty() && launched_.empty()) {
    publish_stats();
    wait_for_prefetches();
  }
  return status;
}

Status Engine::launch_step() {
  // Decoding sequences (one token each) first, so that prefills never stall them; then
  // prompt chunks in arrival order under the remaining budget.
  std::vector<std::shared_ptr<Sequence>> order;
  for (auto& s : running_)
    if (kv_length(*s) - s->num_computed - s->fed_ahead == 1) order.push_back(s);
  for (auto& s : running_)
    if (kv_length(*s) - s->num_computed - s->fed_ahead > 1) order.push_back(s);
  if (order.empty()) return absl::OkStatus();

  auto step = std::make_unique<LaunchedStep>();
  step->id = int64_t(next_step_id_++);
  ForwardBatch batch;
  StepSample& sample = step->sample;
  int budget = options_.max_batch_tokens;
  int prompt_logprob_rows = kMaxPromptLogprobRows;
  for (const std::shared_ptr<Sequence>& owner : order) {
    if (budget == 0) break;
    Sequence* s = owner.get();
    const int start = s->num_computed + s->fed_ahead;  // Its first position not computed or launched.
    const int pending = kv_length(*s) - start;
    int n = std::min(pending, budget);
    // Each prompt position of a prompt_logprobs chunk is a logit row (rows × vocab floats in
    // every logits buffer): chunks shrink to keep a step's under the cap, and a sequence whose
    // next chunk gets none waits for the next step (the first such one always gets some).
    const bool prompt_logprobs = s->request.params.prompt_logprobs >= 0 && !s->prompt_logprobs_sent;
    const int prompt_rows_left = int(s->request.prompt.size()) - 1 - start;
    if (prompt_logprobs && prompt_rows_left > 0) {
      if (prompt_logprob_rows == 0) continue;
      if (std::min(n, prompt_rows_left) > prompt_logprob_rows) n = prompt_logprob_rows;
      prompt_logprob_rows -= std::min(n, prompt_rows_left);
    }
    // A prompt chunk while the prompt is not all computed (a one-token prompt included) or a
    // preempted sequence recomputes its tokens, else a decode step, whose attention reads the
    // whole context.
    if (pending > 1 || start < int(s->request.prompt.size())) {
      sample.prefill_tokens += n;
      ++sample.prefill_seqs;
    } else {
      ++sample.decode_seqs;
      sample.kv_tokens += start + 1;
    }
    budget -= n;
    for (int i = 0; i < n; ++i) {
      const int pos = start + i;
      // Past its known tokens: the one a launched step samples, read where that step left it.
      batch.tokens.push_back(pos < int(s->tokens.size()) ? s->tokens[pos] : -1 - s->pending_row);
      batch.positions.push_back(pos);
      batch.block_tables.push_back(s->blocks.data());
      if (prompt_logprobs && pos + 1 < int(s->request.prompt.size())) {
        batch.logit_rows.push_back(int(batch.tokens.size()) - 1);
        step->rows.push_back({s, pos});
      }
    }
    if (n == pending) {
      batch.logit_rows.push_back(int(batch.tokens.size()) - 1);
      step->rows.push_back({s, -1});
      if (start + n == int(s->request.prompt.size())) batch.completed_prefills.push_back(s->request.id);
    }
    step->fed.push_back({owner, n});
  }
  const int vocab = model_.config.vocab_size;
  if (layer_hook_) batch.layer_hook = &layer_hook_;
  std::vector<kernels::SampleRow> rows;
  for (LaunchedStep::Row& r : step->rows) {
    if (r.prompt_pos >= 0) {
      // Greedy, no slot, no edits: only its log-probabilities are used.
      kernels::SampleRow row;
      row.logprobs = r.seq->request.params.prompt_logprobs;
      row.logprob_of = r.seq->request.prompt[r.prompt_pos + 1];
      rows.push_back(row);
    } else {
      rows.push_back(sample_row(*r.seq, &step->seen_new_ids, &step->biases, &step->banned));
      r.adds_sampled = rows.back().add_sampled;
    }
  }
  const int num_rows = int(rows.size());
  const bool want_logprobs =
      std::any_of(rows.begin(), rows.end(), [](const kernels::SampleRow& r) { return r.logprobs >= 0; });
  step->tokens.resize(num_rows);
  if (want_logprobs) step->logprobs.resize(num_rows);
  StepOutput out;
  out.tokens = step->tokens.data();
  out.logprobs = want_logprobs ? step->logprobs.data() : nullptr;
  if (sample_on_backend_) {
    batch.samples = std::move(rows);
    batch.seen_new_ids = std::move(step->seen_new_ids);
    batch.seen_slots = seen_slots_;
    batch.biases = std::move(step->biases);
    batch.banned = std::move(step->banned);
  } else {
    logits_.resize(size_t(num_rows) * vocab);  // Synchronous only: collected before the next launch.
    step->host_rows = std::move(rows);
    out.logits = logits_.data();
  }
  step->started = options_.clock->now();
  step_tokens_in_progress_.store(sample.prefill_tokens + sample.decode_seqs, std::memory_order_relaxed);
  if (options_.async_scheduling) {
    if (Status launched = ranks_->launch(batch, want_logprobs); !launched.ok()) {
      // Nothing of this step counts: its sequences fail (their blocks come back), the rest wait.
      step_tokens_in_progress_.store(0, std::memory_order_relaxed);
      for (const LaunchedStep::Fed& f : step->fed) finish(*f.seq, FinishReason::kAbort, launched);
      std::erase_if(running_, [](const auto& seq) { return seq->finished; });
      publish_stats();
      return launched;
    }
  } else {
    step->status = ranks_->forward(batch, out);
  }
  // What it feeds counts as computed once it is collected; the tokens it samples are read then.
  for (const LaunchedStep::Fed& f : step->fed) f.seq->fed_ahead += f.tokens;
  for (size_t i = 0; i < step->rows.size(); ++i)
    if (step->rows[i].prompt_pos < 0) {
      step->rows[i].seq->pending_step = step->id;
      step->rows[i].seq->pending_row = int(i);
    }
  if (!launched_.empty()) ++stats_.overlapped_steps;
  launched_.push_back(std::move(step));
  steps_in_flight_.store(int(launched_.size()));
  return absl::OkStatus();
}

Status Engine::collect_step() {
  std::unique_ptr<LaunchedStep> step = std::move(launched_.front());
  launched_.pop_front();
  const int num_rows = int(step->rows.size());
  StepOutput out;
  out.tokens = step->tokens.data();
  out.logprobs = step->logprobs.empty() ? nullptr : step->logprobs.data();
  Status status = options_.async_scheduling ? ranks_->collect(out) : step->status;
  steps_in_flight_.store(int(launched_.size()));
  step_tokens_in_progress_.store(
      launched_.empty() ? 0 : launched_.front()->sample.prefill_tokens + launched_.front()->sample.decode_seqs,
      std::memory_order_relaxed);
  for (const LaunchedStep::Fed& f : step->fed) f.seq->fed_ahead -= f.tokens;
  for (const LaunchedStep::Row& r : step->rows)
    if (r.seq->pending_step == step->id) r.seq->pending_row = -1;
  if (!status.ok()) {
    // Nothing of this step counts: its sequences fail (their blocks come back), the rest wait.
    for (const LaunchedStep::Fed& f : step->fed) finish(*f.seq, FinishReason::kAbort, status);
    std::erase_if(running_, [](const auto& seq) { return seq->finished; });
    publish_stats();
    return status;
  }
  if (!sample_on_backend_) {
    // The backend's sampling, on the host: the same rows, bitmaps, counts and edits, in host
    // memory (resize keeps the slots' contents, as the backend's grow_keeping does).
    const int vocab = model_.config.vocab_size;
    const kernels::SeenTokens seen{nullptr, nullptr, step->seen_new_ids.data(), vocab};
    host_seen_bits_.resize(size_t(seen_slots_) * seen.words_per_slot());
    host_counts_.resize(size_t(seen_slots_) * vocab);
    kernels::cpu::sample_rows(step->tokens.data(), out.logprobs, {logits_.data(), num_rows, vocab, 1},
                              step->host_rows.data(),
                              {host_seen_bits_.data(), host_counts_.data(), step->seen_new_ids.data(), vocab},
                              {step->biases.data(), step->banned.data()}, &host_scratch_);
  }
  // Sampling done; what follows (stop rules, callbacks) is the scheduler's, not the step's. A
  // step launched behind another took the time since that one's results came.
  const TimePoint now = options_.clock->now();
  const TimePoint from = options_.async_scheduling ? std::max(step->started, last_collect_) : step->started;
  last_collect_ = now;
  StepSample& sample = step->sample;
  sample.wall_s = std::chrono::duration<double>(now - from).count();
  ++stats_.steps;
  stats_.prefill_tokens += uint64_t(sample.prefill_tokens);
  stats_.decode_tokens += uint64_t(sample.decode_seqs);
  stats_.step_seconds += sample.wall_s;
  stats_.graph_steps = ranks_->rank(0).graph_replays();
  stats_.graphs_recorded = ranks_->rank(0).graphs_recorded();

  // A sequence finished since the launch has no KV to count.
  for (const LaunchedStep::Fed& f : step->fed) {
    if (f.seq->finished) continue;
    f.seq->num_computed += f.tokens;
    cache_computed_blocks(*f.seq);
  }
  // A sequence's prompt rows come before its sampling row: its first event finds them all.
  for (int i = 0; i < num_rows; ++i) {
    const LaunchedStep::Row& r = step->rows[i];
    Sequence& seq = *r.seq;
    if (seq.finished) {  // Stopped or aborted since the launch: a wasted row.
      if (r.prompt_pos < 0) ++stats_.wasted_tokens;
      continue;
    }
    if (r.prompt_pos >= 0) {
      seq.prompt_logprobs.push_back(token_logprob(seq.request.prompt[r.prompt_pos + 1], step->logprobs[i]));
    } else {
      const bool asked = seq.request.params.logprobs >= 0;
      if (r.adds_sampled) ++seq.seen_synced;  // In the slot already.
      accept_token(seq, step->tokens[i], false, asked ? &step->logprobs[i] : nullptr);
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->finished; });
  publish_stats(std::nullopt, &sample);
  return absl::OkStatus();
}

kernels::SampleRow Engine::sample_row(Sequence& s, std::vector<int>* seen_new_ids,
                                           std::vector<kernels::LogitBias>* biases, std::vector<int>* banned) {
  kernels::SampleRow row = s.sampler.next_row();
  if (!s.biases.empty()) {
    row.bias_begin = int(biases->size());
    row.bias_count = int(s.biases.size());
    biases->insert(biases->end(), s.biases.begin(), s.biases.end());
  }
  // vLLM's min_tokens: the token sampled now would be output token generated() + 1 (+ 1 more
  // behind a launched step's token not read yet).
  if (s.generated() + (s.pending_row >= 0 ? 1 : 0) < s.request.params.min_tokens && !s.min_tokens_banned.empty()) {
    row.banned_begin = int(banned->size());
    row.banned_count = int(s.min_tokens_banned.size());
    banned->insert(banned->end(), s.min_tokens_banned.begin(), s.min_tokens_banned.end());
  }
  if (row.repetition_penalty == 1.0f && row.frequency_penalty == 0.0f && row.presence_penalty == 0.0f) return row;
  if (s.seen_slot < 0) {
    if (free_seen_slots_.empty()) free_seen_slots_.push_back(seen_slots_++);
    s.seen_slot = free_seen_slots_.back();
    free_seen_slots_.pop_back();
    s.seen_synced = 0;
    row.clear_slot = true;  // A slot another sequence may have used.
  }
  row.seen_slot = s.seen_slot;
  row.new_ids_begin = int(seen_new_ids->size());
  row.new_ids_count = int(s.tokens.size() - s.seen_synced);
  // The output's ids among them are counted for the frequency and presence penalties: at the
  // first sync those after the prompt proper (a migrated request's resumed tokens, the decode
  // side's handed-over first token), later all.
  row.new_output_from =
      int(std::clamp<int64_t>(int64_t(s.output_start()) - int64_t(s.seen_synced), 0, row.new_ids_count));
  seen_new_ids->insert(seen_new_ids->end(), s.tokens.begin() + int64_t(s.seen_synced), s.tokens.end());
  s.seen_synced = s.tokens.size();
  // The token sampled now joins the slot where it is sampled: a step launched before the host
  // reads it (asynchronous scheduling) penalises it all the same.
  row.add_sampled = true;
  return row;
}

void Engine::accept_token(Sequence& s, int token, bool streamed, const kernels::RowLogprobs* logprobs) {
  const int prev = s.tokens.back();
  s.tokens.push_back(token);
  const StopStep st = s.stop.push(token, model_.tokenizer->token_text(prev, token, s.request.params.skip_special_tokens));
  TokenEvent ev;
  ev.id = s.request.id;
  ev.cached_tokens = s.cached_tokens;
  ev.token = st.stop_token ? -1 : token;  // A stop token is not part of the output.
  ev.text = st.delta;
  if (logprobs && ev.token >= 0) ev.logprob = token_logprob(token, *logprobs);
  const bool send = s.callback && !streamed && (st.finish == FinishReason::kNone || ev.token >= 0 || !ev.text.empty());
  if (send) {
    attach_prompt_logprobs(s, ev);
    s.callback(ev);
  }
  if (st.finish != FinishReason::kNone) finish(s, st.finish);
}

int Engine::blocks_needed(int prompt_len, int max_tokens) const {
  return blocks_for(std::min<int64_t>(int64_t(prompt_len) + max_tokens, model_.config.max_seq_len),
                    options_.block_size);
}

StatusOr<Engine::Reservation> Engine::reserve_cached_blocks(const std::vector<int>& prompt,
                                                            std::string_view cache_salt, int num_tokens) {
  if (num_tokens <= 0 || num_tokens > model_.config.max_seq_len || int(prompt.size()) > num_tokens)
    return absl::InvalidArgumentError(absl::StrCat("cannot reserve KV for ", num_tokens, " tokens and a prompt of ",
                                                   prompt.size()));
  const int total = blocks_for(num_tokens, options_.block_size);
  if (!options_.prefix_cache.enabled) {
    PD_ASSIGN_OR_RETURN(std::vector<int> blocks, blocks_->allocate(total));
    return after_launched_steps(Reservation{std::move(blocks), 0});
  }
  const BlockKey ns_root = namespace_root(key_root_, canonical_namespace(cache_salt));
  // Every full prompt block may hit, the last one included (engine.h says why).
  std::vector<BlockKey> keys;
  extend_block_keys(keys, ns_root, prompt, options_.block_size, int(prompt.size()) / options_.block_size, key_fn_);
  PD_ASSIGN_OR_RETURN(BlockAllocator::Allocation a, blocks_->allocate_cached(keys, ns_root, prompt, total));
  int cached = a.cached_blocks;
  if (tiers_) {
    auto end = tiers_->host().load(keys, ns_root, prompt, a.blocks, cached, int(keys.size()));
    if (end.ok()) {
      cached = *end;
    } else {
      PD_LOG_ERROR("loading a reservation from the host KV tier: {} (transferring it instead)", end.status().ToString());
    }
  }
  return after_launched_steps(Reservation{std::move(a.blocks), cached});
}

StatusOr<Engine::Reservation> Engine::after_launched_steps(Reservation reservation) {
  if (Status s = wait_for_launched_steps(); !s.ok()) {
    if (Status released = blocks_->release(reservation.blocks); !released.ok())
      PD_LOG_ERROR("releasing a reservation: {}", released.ToString());
    return s;
  }
  return reservation;
}

Status Engine::release_blocks(const std::vector<int>& blocks) { return blocks_->release(blocks); }

StatusOr<std::vector<int>> Engine::lease_host_copy(const std::vector<int>& prompt, std::string_view cache_salt,
                                                   const std::vector<int>& blocks) {
  if (!tiers_) return absl::FailedPreconditionError("no host KV tier (--host-kv-bytes) to copy the prompt into");
  // The keys of the prompt's full blocks, as its sequence cached them (none past the blocks given).
  const PromptKeys k = prompt_keys(prompt, cache_salt, int(blocks.size()));
  return tiers_->host().lease(k.keys, k.ns_root, prompt, blocks);
}

Engine::PromptKeys Engine::prompt_keys(const std::vector<int>& prompt, std::string_view cache_salt,
                                       int blocks) const {
  const int b = options_.block_size;
  PromptKeys k;
  k.ns_root = namespace_root(key_root_, canonical_namespace(cache_salt));
  extend_block_keys(k.keys, k.ns_root, prompt, b, std::min(int(prompt.size()) / b, blocks), key_fn_);
  return k;
}

HostKvTier* Engine::host_tier() const { return tiers_ ? &tiers_->host() : nullptr; }

Status Engine::release_host_lease(const std::vector<int>& slots) {
  if (!tiers_) return absl::FailedPreconditionError("no host KV tier");
  return tiers_->host().release_lease(slots);
}

uint8_t* Engine::host_kv_arena(int rank) const { return tiers_ ? tiers_->host().arena(rank) : nullptr; }

int Engine::host_kv_blocks() const { return tiers_ ? tiers_->host().num_blocks() : 0; }

void Engine::extend_keys(Sequence& s, int blocks) {
  extend_block_keys(s.keys, s.ns_root, s.tokens, options_.block_size, blocks, key_fn_);
}

void Engine::cache_computed_blocks(Sequence& s) {
  if (!options_.prefix_cache.enabled || s.chain_broken) return;
  const int b = options_.block_size;
  const int full = std::min<int>(s.num_computed / b, int(s.blocks.size()));
  if (s.chain_done >= full) return;
  extend_keys(s, full);
  for (int i = s.chain_done; i < full; ++i) {
    const auto tokens = std::span<const int32_t>(s.tokens).subspan(size_t(i) * b, size_t(b));
    s.chain = blocks_->cache(s.blocks[size_t(i)], s.keys[size_t(i)], s.chain, s.ns_root, uint32_t(i), tokens);
    if (!s.chain) {
      s.chain_broken = true;
      return;
    }
    s.chain_done = i + 1;
  }
  // Write-through of the prompt's full blocks as their step ends (output blocks follow when
  // the request finishes or is preempted).
  store_in_host(s, std::min<int>(s.chain_done, int(s.request.prompt.size()) / b));
}

void Engine::store_in_host(Sequence& s, int blocks) {
  if (!tiers_) return;
  tiers_->store({s.keys, s.ns_root, s.tokens, s.blocks}, std::min(blocks, s.chain_done), s.tiers, s.request.id);
}

int Engine::load_from_tiers(Sequence& s, int from, int limit) {
  const KvTiers::Loaded loaded =
      tiers_->load({s.keys, s.ns_root, s.tokens, s.blocks}, from, limit, s.tiers, s.request.id, s.prefetch.get());
  if (s.preemptions == 0) {
    const int b = options_.block_size;
    stats_.host_hit_tokens += uint64_t(loaded.host_end - from) * b;
    stats_.disk_hit_tokens += uint64_t(loaded.end - loaded.host_end) * b;
  }
  return loaded.end;
}

int Engine::cached_prefix_tokens(const std::vector<int>& tokens, std::string_view cache_salt) {
  if (!options_.prefix_cache.enabled || tokens.empty()) return 0;
  const int b = options_.block_size;
  const BlockKey ns_root = namespace_root(key_root_, canonical_namespace(cache_salt));
  std::vector<BlockKey> keys;
  extend_block_keys(keys, ns_root, tokens, b, int(tokens.size() - 1) / b, key_fn_);
  const int device = blocks_->cached_prefix(keys, ns_root, tokens);
  return std::max(device, tiers_ ? tiers_->host().held_prefix(keys, ns_root, tokens) : 0) * b;
}

std::vector<BlockKey> Engine::cached_keys(KvTier tier) const {
  if (tier == KvTier::kDevice) return blocks_->cached_keys();
  if (tier == KvTier::kHost && tiers_) return tiers_->host().cached_keys();
  if (tier == KvTier::kDisk && tiers_ && tiers_->disk()) return tiers_->disk()->cached_keys();
  return {};
}

void Engine::flush_disk_writes() {
  if (tiers_) tiers_->flush_disk_writes();
}

void Engine::reset_prefix_cache() {
  blocks_->reset_cache();
  if (tiers_) tiers_->host().clear();
}

void Engine::set_layer_hook(LayerHook hook) { layer_hook_ = std::move(hook); }

uint8_t* Engine::kv_arena(int rank) const { return ranks_->rank(rank).kv_arena(); }

const KvCacheLayout& Engine::kv_layout(int rank) const { return ranks_->rank(rank).kv_layout(); }

Backend& Engine::backend(int rank) const { return ranks_->rank(rank).backend(); }

Status Engine::run_until_idle() {
  while (has_work()) PD_RETURN_IF_ERROR(step());
  return absl::OkStatus();
}

StatusOr<GenerationResult> Engine::generate(std::vector<int> prompt, const SamplingParams& params) {
  GenerationResult result;
  result.prompt_token_ids = prompt;
  Status error;
  GenerationRequest request{"generate", std::move(prompt), params};
  PD_RETURN_IF_ERROR(add_request(std::move(request), [&](const TokenEvent& ev) {
    if (ev.token >= 0) result.token_ids.push_back(ev.token);
    if (ev.logprob) result.logprobs.push_back(*ev.logprob);
    result.prompt_logprobs.insert(result.prompt_logprobs.end(), ev.prompt_logprobs.begin(), ev.prompt_logprobs.end());
    result.text += ev.text;
    result.cached_tokens = ev.cached_tokens;
    if (ev.finished) {
      result.finish_reason = ev.reason;
      error = ev.error;
    }
  }));
  PD_RETURN_IF_ERROR(run_until_idle());
  PD_RETURN_IF_ERROR(error);
  return result;
}

}  // namespace pdserve::engine
