#include "engine/rank_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/logging.h"

namespace pdserve::engine {

StatusOr<std::unique_ptr<RankRunner>> RankRunner::create(const ModelConfig& config, RankShard shard,
                                                         const KvCacheSpec& kv_spec, int num_blocks,
                                                         int max_tokens, Backend* backend,
                                                         Communicator* comm,
                                                         const KvArenaAllocator& arena_allocator) {
  for (const LayerKvSpec& s : kv_spec.layers)
    if (s.dtype != DType::kF32 && (s.dtype != DType::kBF16 || !backend->bf16_kv()))
      return absl::InvalidArgumentError(absl::StrCat("the ", backend->name(), " backend cannot keep its KV cache in ",
                                                     dtype_name(s.dtype), " (it takes f32",
                                                     backend->bf16_kv() ? " or bf16)" : ")"));
  for (size_t l = 0; l < kv_spec.layers.size(); ++l) {
    const LayerKvSpec& s = kv_spec.layers[l];
    // Attention's input stage and the fused QKV rows size V heads as K heads.
    if (s.has_v() && s.v_head_dim != s.head_dim)
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, "'s V heads are ", s.v_head_dim,
                                                     " wide and its K heads ", s.head_dim,
                                                     ": the forward pass takes them equal"));
  }
  if (max_tokens <= 0) return absl::InvalidArgumentError("a rank needs room for at least one token per step");
  if (shard.gemm_precision == GemmPrecision::kBf16 && shard.weight_dtype != DType::kBF16)
    return absl::InvalidArgumentError(
        absl::StrCat("bf16 GEMM precision takes bf16 weights; this shard's are ", dtype_name(shard.weight_dtype)));
  // A recorded step cannot hold the collectives between ranks yet: the shared-memory group's run
  // on the host, and NCCL's (on the rank's stream since R9) are untried inside a graph.
  if (shard.decode_graphs && shard.tp > 1)
    return absl::InvalidArgumentError(absl::StrCat("decode graphs run at TP 1; this rank is one of ", shard.tp));
  if (shard.decode_graphs && !backend->records_graphs())
    return absl::InvalidArgumentError(
        absl::StrCat("--decode-graphs records GPU steps; the ", backend->name(), " backend runs eagerly"));
  PD_ASSIGN_OR_RETURN(KvCacheLayout layout, KvCacheLayout::create(kv_spec, shard.rank, shard.tp, num_blocks));
  auto runner = std::unique_ptr<RankRunner>(new RankRunner(config, std::move(shard), std::move(layout), backend, comm));
  const size_t arena_bytes = runner->layout_.total_bytes();
  if (arena_allocator) {
    if (!backend->host_memory())
      return absl::InvalidArgumentError(absl::StrCat("a KV arena from an allocator is host memory; the ",
                                                     backend->name(), " backend computes in its own"));
    PD_ASSIGN_OR_RETURN(void* arena, arena_allocator(runner->shard_.rank, arena_bytes));
    if (arena == nullptr) return absl::InternalError("KV arena allocator returned null");
    std::memset(arena, 0, arena_bytes);  // Backend memory is zeroed; the allocator's may not be.
    runner->arena_ = static_cast<uint8_t*>(arena);
  } else {
    PD_ASSIGN_OR_RETURN(void* arena, backend->allocate(arena_bytes));
    runner->arena_ = static_cast<uint8_t*>(arena);
    runner->owns_arena_ = true;
  }
  for (int l = 0; l < runner->layout_.num_layers(); ++l)
    runner->views_.push_back(runner->layout_.view(l, runner->arena_));
  PD_RETURN_IF_ERROR(runner->reserve(max_tokens));
  PD_RETURN_IF_ERROR(runner->upload_rope_tables());
  return runner;
}

RankRunner::RankRunner(const ModelConfig& config, RankShard shard, KvCacheLayout layout,
                       Backend* backend, Communicator* comm)
    : config_(config), shard_(std::move(shard)), layout_(std::move(layout)), backend_(backend), comm_(comm) {}

RankRunner::~RankRunner() {
  // A step still out copies into the sampled slots' pinned memory, which goes with them: its mark
  // (synchronize() may return early on an earlier error), then the whole queue.
  for (; launched_ > 0; --launched_) (void)oldest_out().mark->wait();
  (void)backend_->synchronize();
  if (owns_arena_) backend_->deallocate(arena_);
}

Status RankRunner::reserve(int n) {
  const ModelConfig& c = config_;
  const size_t f = sizeof(float);
  size_t q = 0, kv = 0, index = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    q = std::max(q, size_t(shard_.q_heads.size()) * w.head_dim);
    kv = std::max(kv, size_t(w.kv_heads.size()) * w.head_dim);
    index = std::max(index, size_t(c.attention(l).index_head_dim));
  }
  max_tokens_ = n;
  mask_stride_ = (c.max_seq_len + layout_.block_size() - 1) / layout_.block_size();
  Backend* b = backend_;
  const size_t tokens = size_t(n);
  PD_RETURN_IF_ERROR(x_.reserve(b, tokens * c.dim * f));
  PD_RETURN_IF_ERROR(xn_.reserve(b, tokens * c.dim * f));
  PD_RETURN_IF_ERROR(out_.reserve(b, tokens * c.dim * f));
  // The projections (QKV, then gate and up) share one buffer: the first are used up by attention's
  // input stage before the MLP's are made.
  const size_t hidden = shard_.hidden.size();
  PD_RETURN_IF_ERROR(proj_.reserve(b, tokens * std::max(q + 2 * kv, 2 * hidden) * f));
  PD_RETURN_IF_ERROR(act_.reserve(b, tokens * hidden * f));
  PD_RETURN_IF_ERROR(q_.reserve(b, tokens * q * f));
  PD_RETURN_IF_ERROR(attn_.reserve(b, tokens * q * f));
  if (index > 0) {
    PD_RETURN_IF_ERROR(q_index_.reserve(b, tokens * index * f));
    PD_RETURN_IF_ERROR(k_index_.reserve(b, tokens * index * f));
    PD_RETURN_IF_ERROR(block_mask_.reserve(b, tokens * mask_stride_));
  }
  // What the backend's bf16 GEMMs need besides their operands (a device's bf16 copy of x): a
  // GEMM's input is at most the model's width, the attention output's or the MLP's.
  if (shard_.weight_dtype == DType::kBF16)
    PD_RETURN_IF_ERROR(b->reserve_gemm_scratch(shard_.gemm_precision, n, int(std::max({size_t(c.dim), q, hidden}))));
  // Where sampling on the backend leaves a step's tokens (rank 0; the other ranks get them by a
  // launched step's broadcast), kept from step to step: the next step's embedding may read them
  // (ForwardBatch::tokens), a recorded graph's too.
  PD_RETURN_IF_ERROR(tokens_.reserve(b, tokens * sizeof(int)));
  for (SampledSlot& slot : sampled_) {
    PD_ASSIGN_OR_RETURN(slot.mark, b->create_mark());
  }
  if (shard_.rank == 0) {
    bool pinned = true;
    for (SampledSlot& slot : sampled_) {
      slot.tokens.allocate(b, tokens * sizeof(int));
      slot.logprobs.allocate(b, tokens * sizeof(kernels::RowLogprobs));
      pinned &= slot.tokens.pinned() && slot.logprobs.pinned();
    }
    // Pinned, a queued copy does not wait for the step; where the device cannot pin, it does.
    if (!b->host_memory() && !pinned)
      PD_LOG_WARN("rank 0: the {} backend cannot pin the sampled tokens' host memory: each step waits for its copy",
                  b->name());
  }
  if (shard_.decode_graphs) {
    // Every buffer a recorded step reads is in place before the first recording: the inputs
    // (each decode token's table reaches at most mask_stride_ blocks), and the logits rows, which
    // only a step with more rows than the largest bucket grows (dropping the graphs).
    graph_max_batch_ = std::min(n, kMaxDecodeGraphBatch);
    PD_RETURN_IF_ERROR(graph_ints_.reserve(b, size_t(graph_max_batch_) * (3 + mask_stride_) * sizeof(int)));
    PD_RETURN_IF_ERROR(graph_table_ptrs_.reserve(b, size_t(graph_max_batch_) * sizeof(const int*)));
    PD_RETURN_IF_ERROR(last_.reserve(b, size_t(graph_max_batch_) * c.dim * f));
    const kernels::ShardedLogits shards{nullptr, graph_max_batch_, c.vocab_size, shard_.tp};
    PD_RETURN_IF_ERROR(logits_local_.reserve(b, size_t(graph_max_batch_) * shards.shard_stride() * f));
  }
  return absl::OkStatus();
}

Status RankRunner::upload_rope_tables() {
  const ModelConfig& c = config_;
  std::vector<int> head_dims;        // Distinct, in order of first use.
  std::vector<RopeFrequencies> tables;
  std::vector<size_t> offset, table_of_layer(c.n_layers);
  size_t floats = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int hd = shard_.layers[l].head_dim;
    const auto at = std::find(head_dims.begin(), head_dims.end(), hd);
    table_of_layer[l] = size_t(at - head_dims.begin());
    if (at != head_dims.end()) continue;
    head_dims.push_back(hd);
    tables.push_back(rope_frequencies(c.rope_scaling, c.rope_theta, hd, c.max_seq_len));
    offset.push_back(floats);
    floats += tables.back().inv_freq.size();
  }
  std::vector<float> host;
  for (const RopeFrequencies& t : tables) host.insert(host.end(), t.inv_freq.begin(), t.inv_freq.end());
  PD_RETURN_IF_ERROR(rope_tables_.reserve(backend_, std::max<size_t>(floats, 1) * sizeof(float)));
  PD_RETURN_IF_ERROR(backend_->copy_to_device(rope_tables_.as<void>(), host.data(), floats * sizeof(float)));
  PD_RETURN_IF_ERROR(backend_->synchronize());  // `host` goes out of scope.
  layer_rope_.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    const size_t t = table_of_layer[l];
    layer_rope_[l] = {rope_tables_.as<float>() + offset[t], tables[t].attention_scale,
                      c.rope_style == RopeStyle::kRotateHalf};
  }
  return absl::OkStatus();
}

void StepMetadata::pack(const ForwardBatch& batch, int block_size) {
  const int n = int(batch.tokens.size());
  ints.assign(batch.tokens.begin(), batch.tokens.end());
  ints.insert(ints.end(), batch.positions.begin(), batch.positions.end());
  ints.insert(ints.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  // The distinct tables and how far the step reaches into each. A sequence's tokens are
  // usually consecutive, so the previous token's table is tried first.
  std::vector<std::pair<const int*, int>> tables;  // (table, blocks reached)
  std::vector<int> index(n);
  sampled_rows_read = 0;
  for (int t = 0; t < n; ++t) {
    if (batch.tokens[t] < 0) sampled_rows_read = std::max(sampled_rows_read, -int64_t(batch.tokens[t]));
    const int* table = batch.block_tables[t];
    int i = t > 0 && batch.block_tables[t - 1] == table ? index[t - 1] : -1;
    for (int j = 0; i < 0 && j < int(tables.size()); ++j)
      if (tables[j].first == table) i = j;
    if (i < 0) {
      i = int(tables.size());
      tables.push_back({table, 0});
    }
    index[t] = i;
    tables[i].second = std::max(tables[i].second, batch.positions[t] / block_size + 1);
  }
  std::vector<int64_t> start(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    start[i] = int64_t(ints.size());
    ints.insert(ints.end(), tables[i].first, tables[i].first + tables[i].second);
  }
  table_at.resize(n);
  for (int t = 0; t < n; ++t) table_at[t] = start[index[t]];
  single_tokens = 0;
  while (single_tokens < n && (single_tokens + 1 == n || index[single_tokens + 1] != index[single_tokens]))
    ++single_tokens;
}

int RankRunner::graph_bucket(const ForwardBatch& batch, const StepMetadata& meta) const {
  const int n = int(batch.tokens.size());
  if (!shard_.decode_graphs || meta.single_tokens != n || int(batch.logit_rows.size()) != n) return 0;
  if (batch.layer_hook && !batch.completed_prefills.empty()) return 0;
  for (int r = 0; r < n; ++r)
    if (batch.logit_rows[r] != r) return 0;
  const int bucket = decode_graph_bucket(n, graph_max_batch_);
  if (bucket == 0 || graphs_.refused(bucket)) return 0;
  return int(meta.ints.size()) - 3 * n <= n * mask_stride_ ? bucket : 0;  // The tables fit (always).
}

Status RankRunner::prepare(const ForwardBatch& batch, const StepMetadata& meta) {
  const int n = int(batch.tokens.size());
  if (n > max_tokens_)
    return absl::InvalidArgumentError(absl::StrCat("a step of ", n, " tokens; ranks hold ", max_tokens_));
  // A previous step's sampled token (ForwardBatch::tokens) is one of the rank's rows.
  if (meta.sampled_rows_read > max_tokens_)
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", -meta.sampled_rows_read, " names no sampled row a step of this rank (TP ", shard_.tp, ") can hold"));
  step_bucket_ = graph_bucket(batch, meta);
  // The logits rows: as many as the step samples (a graph step's bucket computes them all),
  // fewer than its tokens, grown on demand.
  const int rows = int(batch.logit_rows.size()), model_rows = std::max(rows, step_bucket_);
  if (rows > 0) {
    // Padded to the widest shard: the all-gather of sampling on the backend takes equal parts.
    const kernels::ShardedLogits shards{nullptr, rows, config_.vocab_size, shard_.tp};
    const size_t local = size_t(rows) * shards.shard_stride() * sizeof(float);
    const size_t last_bytes = size_t(model_rows) * config_.dim * sizeof(float),
                 logits_bytes = size_t(model_rows) * shards.shard_stride() * sizeof(float);
    // Growing frees the old buffers, which recorded graphs write: they go first (even should the
    // new allocation fail, or land at the old address).
    if (last_bytes > last_.bytes() || logits_bytes > logits_local_.bytes()) {
      if (launched_ > 0) PD_RETURN_IF_ERROR(backend_->synchronize());  // A launched step may replay one.
      graphs_.clear();
    }
    PD_RETURN_IF_ERROR(last_.reserve(backend_, last_bytes));
    PD_RETURN_IF_ERROR(logits_local_.reserve(backend_, logits_bytes));
    if (!batch.samples.empty()) {
      if (batch.samples.size() != size_t(rows))
        return absl::InvalidArgumentError(absl::StrCat(batch.samples.size(), " samples for ", rows, " logit rows"));
      if (shard_.tp > 1) PD_RETURN_IF_ERROR(logits_gathered_.reserve(backend_, local * shard_.tp));
      if (shard_.rank == 0) {
        PD_RETURN_IF_ERROR(sample_rows_.reserve(backend_, rows * sizeof(kernels::SampleRow)));
        PD_RETURN_IF_ERROR(sample_scratch_.reserve(
            backend_, size_t(kernels::sample_scratch_floats(rows, config_.vocab_size)) * sizeof(float)));
        PD_RETURN_IF_ERROR(backend_->copy_to_device(sample_rows_.as<void>(), batch.samples.data(),
                                                    rows * sizeof(kernels::SampleRow)));
        if (batch.seen_slots > 0) {
          const kernels::SeenTokens seen{nullptr, nullptr, nullptr, config_.vocab_size};
          // Doubled when it grows, so that slots handed out one by one do not copy every time.
          const size_t need = size_t(batch.seen_slots) * seen.words_per_slot() * sizeof(uint32_t);
          if (need > seen_bits_.bytes())
            PD_RETURN_IF_ERROR(seen_bits_.grow_keeping(backend_, std::max(need, 2 * seen_bits_.bytes())));
          const size_t counts = size_t(batch.seen_slots) * size_t(config_.vocab_size) * sizeof(int32_t);
          if (counts > seen_counts_.bytes())
            PD_RETURN_IF_ERROR(seen_counts_.grow_keeping(backend_, std::max(counts, 2 * seen_counts_.bytes())));
        }
        if (!batch.biases.empty()) {
          const size_t bytes = batch.biases.size() * sizeof(kernels::LogitBias);
          PD_RETURN_IF_ERROR(biases_.reserve(backend_, bytes));
          PD_RETURN_IF_ERROR(backend_->copy_to_device(biases_.as<void>(), batch.biases.data(), bytes));
        }
        if (!batch.banned.empty()) {
          const size_t bytes = batch.banned.size() * sizeof(int);
          PD_RETURN_IF_ERROR(banned_.reserve(backend_, bytes));
          PD_RETURN_IF_ERROR(backend_->copy_to_device(banned_.as<void>(), batch.banned.data(), bytes));
        }
        if (std::any_of(batch.samples.begin(), batch.samples.end(), [](const auto& r) { return r.logprobs >= 0; }))
          PD_RETURN_IF_ERROR(logprobs_.reserve(backend_, size_t(rows) * sizeof(kernels::RowLogprobs)));
        if (!batch.seen_new_ids.empty()) {
          PD_RETURN_IF_ERROR(seen_new_ids_.reserve(backend_, batch.seen_new_ids.size() * sizeof(int)));
          PD_RETURN_IF_ERROR(backend_->copy_to_device(seen_new_ids_.as<void>(), batch.seen_new_ids.data(),
                                                      batch.seen_new_ids.size() * sizeof(int)));
        }
      }
    }
  }
  if (step_bucket_ > 0) return prepare_graph_step(batch, meta, step_bucket_);
  PD_RETURN_IF_ERROR(meta_.reserve(backend_, std::max<size_t>(meta.ints.size(), 1) * sizeof(int)));
  PD_RETURN_IF_ERROR(table_ptrs_.reserve(backend_, std::max(n, 1) * sizeof(const int*)));
  const int* base = meta_.as<int>();
  table_ptrs_host_.resize(n);
  for (int t = 0; t < n; ++t) table_ptrs_host_[t] = base + meta.table_at[t];
  PD_RETURN_IF_ERROR(backend_->copy_to_device(meta_.as<void>(), meta.ints.data(), meta.ints.size() * sizeof(int)));
  PD_RETURN_IF_ERROR(backend_->copy_to_device(table_ptrs_.as<void>(), table_ptrs_host_.data(),
                                              size_t(n) * sizeof(const int*)));
  placement_ = kernels::TokenPlacement{n, base + n, table_ptrs_.as<const int* const>()};
  if (n > 0) placement_.max_position = *std::max_element(batch.positions.begin(), batch.positions.end());
  single_tokens_ = meta.single_tokens;
  step_ints_ = base;
  return absl::OkStatus();
}

Status RankRunner::prepare_graph_step(const ForwardBatch& batch, const StepMetadata& meta, int bucket) {
  const int n = int(batch.tokens.size()), tables = int(meta.ints.size()) - 3 * n;
  // [tokens][positions][logit rows] of the bucket, then the step's tables. Padding rows take
  // token 0 at position -1 (kernels/abi.h: no KV written, nothing attended) and the first table.
  std::vector<int>& ints = graph_ints_host_;
  ints.assign(size_t(3) * bucket + tables, 0);
  std::copy_n(meta.ints.begin(), n, ints.begin());
  std::fill_n(ints.begin() + bucket, bucket, -1);
  std::copy_n(meta.ints.begin() + n, n, ints.begin() + bucket);
  std::iota(ints.begin() + 2 * bucket, ints.begin() + 3 * bucket, 0);
  std::copy(meta.ints.begin() + 3 * n, meta.ints.end(), ints.begin() + 3 * bucket);
  const int* base = graph_ints_.as<int>();
  table_ptrs_host_.resize(bucket);
  for (int t = 0; t < bucket; ++t) table_ptrs_host_[t] = base + 3 * bucket + (t < n ? meta.table_at[t] - 3 * n : 0);
  PD_RETURN_IF_ERROR(backend_->copy_to_device(graph_ints_.as<void>(), ints.data(), ints.size() * sizeof(int)));
  PD_RETURN_IF_ERROR(backend_->copy_to_device(graph_table_ptrs_.as<void>(), table_ptrs_host_.data(),
                                              size_t(bucket) * sizeof(const int*)));
  placement_ = kernels::TokenPlacement{bucket, base + bucket, graph_table_ptrs_.as<const int* const>()};
  // A bound for every replay, not this step's largest position: the split-decode launch a graph
  // holds must fit any (each token cuts its own keys, so the result is the eager step's).
  placement_.max_position = config_.max_seq_len - 1;
  single_tokens_ = bucket;
  step_ints_ = base;
  return absl::OkStatus();
}

void RankRunner::attention(float* out, const float* q, const kernels::PagedLayerView& kv,
                           const kernels::TokenPlacement& tokens, int n_q_heads, int q_per_kv, int window,
                           float scale) {
  const int d = single_tokens_, n = tokens.num_tokens;
  const int64_t q_row = int64_t(n_q_heads) * kv.head_dim, out_row = int64_t(n_q_heads) * kv.v_head_dim;
  if (d > 0) {
    kernels::TokenPlacement decode = tokens;
    decode.num_tokens = d;
    decode.single_tokens = true;
    backend_->paged_attention(out, q, kv, decode, n_q_heads, q_per_kv, window, scale, shard_.gemm_precision);
  }
  if (d < n) {
    kernels::TokenPlacement rest = tokens;
    rest.num_tokens = n - d;
    rest.positions += d;
    rest.block_tables += d;
    if (rest.block_mask) rest.block_mask += int64_t(d) * rest.mask_stride;
    backend_->paged_attention(out + d * out_row, q + d * q_row, kv, rest, n_q_heads, q_per_kv, window, scale,
                              shard_.gemm_precision);
  }
}

void RankRunner::gate_up_silu(float* act, float* gate_up, const float* x, const float* w, int rows, int hidden,
                              int in) {
  // The fused verb takes bf16 weights only (a GPU fuses up to 8 rows); f32 ones keep the GEMM and
  // silu_mul, as cuBLAS's SGEMM gives other bits than the GEMV.
  if (shard_.weight_dtype == DType::kBF16) {
    backend_->gate_up_silu_bf16(act, gate_up, x, reinterpret_cast<const uint16_t*>(w), rows, hidden, in, in,
                                shard_.gemm_precision);
  } else {
    matmul(gate_up, x, w, rows, 2 * hidden, in, in);
    backend_->silu_mul(act, gate_up, gate_up + hidden, rows, hidden, 2 * hidden);
  }
}

void RankRunner::matmul(float* y, const float* x, const float* w, int rows, int out, int in, int64_t ldw) {
  if (shard_.weight_dtype == DType::kBF16) {
    backend_->matmul_xwt_bf16(y, x, reinterpret_cast<const uint16_t*>(w), rows, out, in, ldw, shard_.gemm_precision);
  } else {
    backend_->matmul_xwt(y, x, w, rows, out, in, ldw);
  }
}

void RankRunner::run_layers(int n, int rows, const std::function<void(int)>& layer_written) {
  const ModelConfig& c = config_;
  const int* tokens = step_ints_;
  const int nq = shard_.q_heads.size(), hidden = shard_.hidden.size();
  float *x = x_.as<float>(), *xn = xn_.as<float>(), *q = q_.as<float>(), *proj = proj_.as<float>(),
        *attn = attn_.as<float>(), *out = out_.as<float>(), *act = act_.as<float>();
  backend_->embed(x, shard_.embed, tokens, n, c.dim, tokens_.as<const int>());
  // Each layer's residual adds are fused with the norm that follows them (add_rms_norm): the
  // attention norm of layer 0 alone stands by itself, the last layer's MLP add alone is plain.
  backend_->rms_norm(xn, x, shard_.layers[0].attn_norm, n, c.dim, c.rms_eps);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    const int nkv = w.kv_heads.size(), hd = w.head_dim;
    const int q_local = nq * hd, kv_local = nkv * hd;
    const float scale = 1.0f / std::sqrt(float(hd));
    kernels::TokenPlacement place = placement_;
    // The projections' rows: one fused GEMM's [q | k | v] columns, or three compact matrices.
    kernels::QkvRows qkv;
    if (w.wqkv) {
      const int width = q_local + 2 * kv_local;
      matmul(proj, xn, w.wqkv, n, width, c.dim, c.dim);
      qkv = {proj, proj + q_local, proj + q_local + kv_local, width, width, width};
    } else {
      float *k = proj + int64_t(n) * q_local, *v = k + int64_t(n) * kv_local;
      matmul(proj, xn, w.wq, n, q_local, c.dim, c.dim);
      matmul(k, xn, w.wk, n, kv_local, c.dim, c.dim);
      matmul(v, xn, w.wv, n, kv_local, c.dim, c.dim);
      qkv = {proj, k, v, q_local, kv_local, kv_local};
    }
    qkv.n_q_heads = nq;
    qkv.n_kv_heads = nkv;
    qkv.q_bias = w.bq;
    qkv.k_bias = w.bk;
    qkv.v_bias = w.bv;
    qkv.q_norm = w.q_norm;  // Qwen3: each head normalised on its own.
    qkv.k_norm = w.k_norm;
    qkv.norm_eps = c.rms_eps;
    backend_->qkv_rope_write(q, qkv, layer_rope_[l], views_[l], place);
    const int index_layer = c.index_cache_layer(l);
    if (index_layer >= 0) {
      const int index_dim = c.attention(l).index_head_dim;
      float *qi = q_index_.as<float>(), *ki = k_index_.as<float>();
      matmul(qi, xn, w.w_index_q, n, index_dim, c.dim, c.dim);
      matmul(ki, xn, w.w_index_k, n, index_dim, c.dim, c.dim);
      backend_->paged_kv_write(views_[index_layer], place, ki, index_dim, nullptr, 0, 1);
      backend_->index_select_blocks(block_mask_.as<uint8_t>(), mask_stride_, qi, views_[index_layer], place,
                                    c.attention(l).index_top_k);
      if (layer_written) layer_written(index_layer);
      place.block_mask = block_mask_.as<uint8_t>();
      place.mask_stride = mask_stride_;
    }
    if (layer_written) layer_written(l);
    attention(attn, q, views_[l], place, nq, nq / nkv, layout_.spec().layers[l].window, scale);
    matmul(out, attn, w.wo, n, c.dim, q_local, w.wo_stride);
    comm_->all_reduce_sum(out, int64_t(n) * c.dim);
    backend_->add_rms_norm(xn, x, out, w.ffn_norm, n, c.dim, c.rms_eps);
    if (w.w_gate_up) {
      gate_up_silu(act, proj, xn, w.w_gate_up, n, hidden, c.dim);
    } else {
      float* up = proj + int64_t(n) * hidden;
      matmul(proj, xn, w.w_gate, n, hidden, c.dim, c.dim);
      matmul(up, xn, w.w_up, n, hidden, c.dim, c.dim);
      backend_->silu_mul(act, proj, up, n, hidden, hidden);
    }
    matmul(out, act, w.w_down, n, c.dim, hidden, w.w_down_stride);
    comm_->all_reduce_sum(out, int64_t(n) * c.dim);
    if (l + 1 < c.n_layers)
      backend_->add_rms_norm(xn, x, out, shard_.layers[l + 1].attn_norm, n, c.dim, c.rms_eps);
    else
      backend_->add_inplace(x, out, int64_t(n) * c.dim);
  }
  if (rows > 0) {
    const int* logit_rows = tokens + 2 * n;  // In the step's metadata, after the positions.
    backend_->gather_rms_norm(last_.as<float>(), x, logit_rows, shard_.final_norm, rows, c.dim, c.rms_eps);
    matmul(logits_local_.as<float>(), last_.as<float>(), shard_.lm_head, rows, shard_.vocab.size(), c.dim, c.dim);
  }
}

Status RankRunner::run_graph_step(int bucket) {
  if (StepGraph* graph = graphs_.find(bucket)) {
    const Status replayed = graph->replay();
    if (replayed.ok()) {
      graph_replays_.fetch_add(1, std::memory_order_relaxed);
      return replayed;
    }
    PD_LOG_WARN("rank {}: decode steps of {} tokens run eagerly from now on: their graph's replay failed: {}",
                shard_.rank, bucket, replayed.ToString());
    graphs_.refuse(bucket);
    run_layers(bucket, bucket, {});
    return absl::OkStatus();
  }
  run_layers(bucket, bucket, {});
  // The eager step's own errors are the step's, not the recording's (which would swallow them).
  PD_RETURN_IF_ERROR(backend_->synchronize());
  if (Status recorded = graphs_.record(*backend_, bucket, [&] { run_layers(bucket, bucket, {}); }); !recorded.ok())
    PD_LOG_WARN("rank {}: decode steps of {} tokens run eagerly: their graph could not be recorded: {}", shard_.rank,
                bucket, recorded.ToString());
  else
    graphs_recorded_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

Status RankRunner::run_step(const ForwardBatch& batch, float* logits, bool logprobs_wanted, bool share_sampled) {
  const ModelConfig& c = config_;
  const int n = int(batch.tokens.size()), rows = int(batch.logit_rows.size());
  Status status;
  // A layer hook may hand a completed prompt's KV to a transport: on a device the layer's writes
  // must be done first. Steps that complete no prompt have nothing to hand, and do not wait.
  const bool sync_for_hook = batch.layer_hook && !batch.completed_prefills.empty() && !backend_->host_memory();
  std::function<void(int)> layer_written;
  if (batch.layer_hook)
    layer_written = [&](int layer) {
      if (sync_for_hook) status.Update(backend_->synchronize());
      (*batch.layer_hook)(shard_.rank, layer, batch.completed_prefills);
    };
  if (step_bucket_ > 0) {
    status.Update(run_graph_step(step_bucket_));
    // A graph step completes no prompt: its hooks hand nothing and need no wait, so they follow
    // the step, in the order the layers' KV was written.
    for (int l = 0; layer_written && l < c.n_layers; ++l) {
      if (c.index_cache_layer(l) >= 0) layer_written(c.index_cache_layer(l));
      layer_written(l);
    }
  } else {
    run_layers(n, rows, layer_written);
  }

  if (rows > 0) {
    const int vocab_local = shard_.vocab.size();
    if (!batch.samples.empty()) {
      kernels::ShardedLogits gathered{logits_local_.as<float>(), rows, c.vocab_size, shard_.tp};
      if (shard_.tp > 1) {
        comm_->all_gather(logits_local_.as<float>(), int64_t(rows) * gathered.shard_stride(),
                          logits_gathered_.as<float>());
        gathered.data = logits_gathered_.as<float>();
      }
      if (shard_.rank == 0) {
        const kernels::SeenTokens seen{seen_bits_.as<uint32_t>(), seen_counts_.as<int32_t>(),
                                            seen_new_ids_.as<const int>(), c.vocab_size};
        const kernels::LogitEdits edits{biases_.as<const kernels::LogitBias>(), banned_.as<const int>()};
        // The engine asks for log-probabilities only when some row does (prepare reserved them).
        kernels::RowLogprobs* logprobs = logprobs_wanted ? logprobs_.as<kernels::RowLogprobs>() : nullptr;
        backend_->sample(tokens_.as<int>(), logprobs, gathered, sample_rows_.as<kernels::SampleRow>(), seen, edits,
                         sample_scratch_.as<float>());
        SampledSlot& slot = sampled_[next_slot_];
        slot.rows = rows;
        slot.with_logprobs = logprobs != nullptr;
        status.Update(backend_->copy_to_host_queued(slot.tokens.as<int>(), tokens_.as<void>(), rows * sizeof(int)));
        if (logprobs)
          status.Update(backend_->copy_to_host_queued(slot.logprobs.as<kernels::RowLogprobs>(), logprobs,
                                                      size_t(rows) * sizeof(kernels::RowLogprobs)));
      }
      // The next step, queued before the host reads these tokens, embeds them on every rank.
      if (share_sampled && shard_.tp > 1) comm_->broadcast(tokens_.as<int>(), rows, 0);
    } else if (backend_->host_memory()) {
      for (int r = 0; r < rows; ++r)
        std::copy_n(logits_local_.as<float>() + int64_t(r) * vocab_local, vocab_local,
                    logits + int64_t(r) * c.vocab_size + shard_.vocab.begin);
    } else {
      logits_host_.resize(size_t(rows) * vocab_local);
      status.Update(backend_->copy_to_host(logits_host_.data(), logits_local_.as<void>(),
                                           logits_host_.size() * sizeof(float)));
      for (int r = 0; r < rows; ++r)
        std::copy_n(logits_host_.data() + int64_t(r) * vocab_local, vocab_local,
                    logits + int64_t(r) * c.vocab_size + shard_.vocab.begin);
    }
  }
  SampledSlot& slot = sampled_[next_slot_];
  if (rows == 0 || batch.samples.empty() || shard_.rank != 0) slot.rows = 0;
  status.Update(backend_->queued_errors());  // This step's, before the next is queued.
  status.Update(slot.mark->record());
  slot.status = status;
  next_slot_ ^= 1;
  return status;
}

Status RankRunner::take_sampled(const StepOutput& out) {
  SampledSlot& slot = oldest_out();
  Status status = slot.status;
  status.Update(slot.mark->wait());
  if (status.ok() && slot.rows > 0 && out.tokens != nullptr) {
    std::copy_n(slot.tokens.as<int>(), slot.rows, out.tokens);
    if (out.logprobs && slot.with_logprobs)
      std::copy_n(slot.logprobs.as<kernels::RowLogprobs>(), slot.rows, out.logprobs);
  }
  return status;
}

Status RankRunner::forward(const ForwardBatch& batch, const StepOutput& result) {
  if (launched_ > 0)
    return absl::FailedPreconditionError(absl::StrCat("a forward pass while ", launched_, " launched steps wait"));
  Status status = run_step(batch, result.logits, result.logprobs != nullptr, false);
  if (shard_.rank == 0 && !batch.samples.empty() && !batch.logit_rows.empty()) status.Update(take_sampled(result));
  status.Update(backend_->synchronize());
  {
    std::lock_guard lock(status_mu_);
    status_ = status;
  }
  comm_->barrier();
  return status;
}

Status RankRunner::can_launch(const ForwardBatch& batch) const {
  if (!batch.logit_rows.empty() && batch.samples.empty())
    return absl::InvalidArgumentError("a launched step samples on the backend: its batch has no samples");
  if (launched_ == int(sampled_.size()))
    return absl::FailedPreconditionError(absl::StrCat(launched_, " launched steps wait to be collected"));
  return absl::OkStatus();
}

Status RankRunner::launch(const ForwardBatch& batch, bool logprobs) {
  PD_RETURN_IF_ERROR(can_launch(batch));  // Before any collective: alike on every rank of a pool.
  const Status status = run_step(batch, nullptr, logprobs, true);
  ++launched_;  // Its slot holds the status for collect(), even a failed one's.
  return status;
}

void RankRunner::withdraw_launch() {
  if (launched_ == 0) return;
  next_slot_ ^= 1;  // The newest step's slot, which the next launch fills again.
  --launched_;
  // Its errors are the failed launch's. All of the queue, in case the failure was the mark's.
  (void)sampled_[next_slot_].mark->wait();
  (void)backend_->synchronize();
}

Status RankRunner::collect(const StepOutput& out) {
  if (launched_ == 0) return absl::FailedPreconditionError("no launched step to collect");
  Status status = take_sampled(out);
  --launched_;
  comm_->check_async_errors();  // A launched step meets no barrier(), which would check them.
  return status;
}

Status RankRunner::status() const {
  std::lock_guard lock(status_mu_);
  return status_;
}

}  // namespace pdserve::engine
