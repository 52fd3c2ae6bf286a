#include "engine/rank_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pdserve::engine {

StatusOr<std::unique_ptr<RankRunner>> RankRunner::create(const ModelConfig& config, RankShard shard,
                                                         const KvCacheSpec& kv_spec, int num_blocks,
                                                         Backend* backend, Communicator* comm,
                                                         const KvArenaAllocator& arena_allocator) {
  for (const LayerKvSpec& s : kv_spec.layers)
    if (s.dtype != DType::kF32)
      return absl::UnimplementedError("the CPU backend keeps its KV cache in f32");
  PD_ASSIGN_OR_RETURN(KvCacheLayout layout, KvCacheLayout::create(kv_spec, shard.rank, shard.tp, num_blocks));
  auto runner = std::unique_ptr<RankRunner>(new RankRunner(config, std::move(shard), std::move(layout), backend, comm));
  const size_t arena_bytes = runner->layout_.total_bytes();
  if (arena_allocator) {
    PD_ASSIGN_OR_RETURN(void* arena, arena_allocator(runner->shard_.rank, arena_bytes));
    if (arena == nullptr) return absl::InternalError("KV arena allocator returned null");
    std::memset(arena, 0, arena_bytes);  // Backend memory is zeroed; the allocator's may not be.
    runner->arena_ = static_cast<uint8_t*>(arena);
  } else {
    PD_ASSIGN_OR_RETURN(void* arena, backend->allocate(arena_bytes));
    runner->arena_ = static_cast<uint8_t*>(arena);
    runner->owns_arena_ = true;
  }
  const KvCacheLayout& L = runner->layout_;
  for (int l = 0; l < L.num_layers(); ++l) {
    kernels::cpu::PagedLayerView v;
    v.block_size = L.block_size();
    v.head_dim = L.part_head_dim(l, KvPart::kK);
    v.k = reinterpret_cast<float*>(runner->arena_ + L.offset(l, KvPart::kK, 0, 0, 0));
    v.k_block_stride = int64_t(L.block_stride(l, KvPart::kK) / sizeof(float));
    v.k_token_stride = L.token_stride(l, KvPart::kK);
    v.k_head_stride = L.head_stride(l, KvPart::kK);
    if (kv_spec.layers[l].has_v()) {
      v.v_head_dim = L.part_head_dim(l, KvPart::kV);
      v.v = reinterpret_cast<float*>(runner->arena_ + L.offset(l, KvPart::kV, 0, 0, 0));
      v.v_block_stride = int64_t(L.block_stride(l, KvPart::kV) / sizeof(float));
      v.v_token_stride = L.token_stride(l, KvPart::kV);
      v.v_head_stride = L.head_stride(l, KvPart::kV);
    }
    runner->views_.push_back(v);
  }
  return runner;
}

RankRunner::RankRunner(const ModelConfig& config, RankShard shard, KvCacheLayout layout,
                       Backend* backend, Communicator* comm)
    : config_(config), shard_(std::move(shard)), layout_(std::move(layout)), backend_(backend), comm_(comm) {}

RankRunner::~RankRunner() {
  if (owns_arena_) backend_->deallocate(arena_);
}

void RankRunner::resize_scratch(int n) {
  const ModelConfig& c = config_;
  auto fit = [](auto& v, size_t size) {
    if (v.size() < size) v.resize(size);
  };
  fit(x_, size_t(n) * c.dim);
  fit(xn_, size_t(n) * c.dim);
  fit(out_, size_t(n) * c.dim);
  fit(gate_, size_t(n) * shard_.hidden.size());
  fit(up_, size_t(n) * shard_.hidden.size());
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    fit(q_, size_t(n) * shard_.q_heads.size() * w.head_dim);
    fit(attn_, size_t(n) * shard_.q_heads.size() * w.head_dim);
    fit(k_, size_t(n) * w.kv_heads.size() * w.head_dim);
    fit(v_, size_t(n) * w.kv_heads.size() * w.head_dim);
    const int index_dim = c.attention(l).index_head_dim;
    if (index_dim > 0) {
      fit(q_index_, size_t(n) * index_dim);
      fit(k_index_, size_t(n) * index_dim);
      fit(block_mask_, size_t(n) * ((c.max_seq_len + layout_.block_size() - 1) / layout_.block_size()));
    }
  }
}

void RankRunner::forward(const ForwardBatch& batch, float* logits) {
  const ModelConfig& c = config_;
  const int n = int(batch.tokens.size());
  resize_scratch(n);
  const int nq = shard_.q_heads.size(), hidden = shard_.hidden.size();
  const bool rotate_half = c.rope_style == RopeStyle::kRotateHalf;
  const int mask_stride = (c.max_seq_len + layout_.block_size() - 1) / layout_.block_size();

  backend_->embed(x_.data(), shard_.embed, batch.tokens.data(), n, c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    const int nkv = w.kv_heads.size(), hd = w.head_dim;
    const int q_local = nq * hd, kv_local = nkv * hd;
    const float scale = 1.0f / std::sqrt(float(hd));
    kernels::cpu::TokenPlacement place{n, batch.positions.data(), batch.block_tables.data()};
    backend_->rms_norm(xn_.data(), x_.data(), w.attn_norm, n, c.dim, c.rms_eps);
    backend_->matmul_xwt(q_.data(), xn_.data(), w.wq, n, q_local, c.dim, c.dim);
    backend_->matmul_xwt(k_.data(), xn_.data(), w.wk, n, kv_local, c.dim, c.dim);
    backend_->matmul_xwt(v_.data(), xn_.data(), w.wv, n, kv_local, c.dim, c.dim);
    if (w.bq) {
      backend_->add_bias(q_.data(), w.bq, n, q_local);
      backend_->add_bias(k_.data(), w.bk, n, kv_local);
      backend_->add_bias(v_.data(), w.bv, n, kv_local);
    }
    backend_->rope(q_.data(), n, q_local, nq, hd, batch.positions.data(), c.rope_theta, rotate_half);
    backend_->rope(k_.data(), n, kv_local, nkv, hd, batch.positions.data(), c.rope_theta, rotate_half);
    backend_->paged_kv_write(views_[l], place, k_.data(), kv_local, v_.data(), kv_local, nkv);
    const int index_layer = c.index_cache_layer(l);
    if (index_layer >= 0) {
      const int index_dim = c.attention(l).index_head_dim;
      backend_->matmul_xwt(q_index_.data(), xn_.data(), w.w_index_q, n, index_dim, c.dim, c.dim);
      backend_->matmul_xwt(k_index_.data(), xn_.data(), w.w_index_k, n, index_dim, c.dim, c.dim);
      backend_->paged_kv_write(views_[index_layer], place, k_index_.data(), index_dim, nullptr, 0, 1);
      backend_->index_select_blocks(block_mask_.data(), mask_stride, q_index_.data(), views_[index_layer],
                                    place, c.attention(l).index_top_k);
      if (batch.layer_hook) (*batch.layer_hook)(shard_.rank, index_layer, batch.completed_prefills);
      place.block_mask = block_mask_.data();
      place.mask_stride = mask_stride;
    }
    if (batch.layer_hook) (*batch.layer_hook)(shard_.rank, l, batch.completed_prefills);
    backend_->paged_attention(attn_.data(), q_.data(), views_[l], place, nq, nq / nkv,
                              layout_.spec().layers[l].window, scale);
    backend_->matmul_xwt(out_.data(), attn_.data(), w.wo, n, c.dim, q_local, c.q_dim(l));
    comm_->all_reduce_sum(out_.data(), int64_t(n) * c.dim);
    backend_->add_inplace(x_.data(), out_.data(), int64_t(n) * c.dim);

    backend_->rms_norm(xn_.data(), x_.data(), w.ffn_norm, n, c.dim, c.rms_eps);
    backend_->matmul_xwt(gate_.data(), xn_.data(), w.w_gate, n, hidden, c.dim, c.dim);
    backend_->matmul_xwt(up_.data(), xn_.data(), w.w_up, n, hidden, c.dim, c.dim);
    backend_->silu_mul(gate_.data(), up_.data(), int64_t(n) * hidden);
    backend_->matmul_xwt(out_.data(), gate_.data(), w.w_down, n, c.dim, hidden, c.hidden_dim);
    comm_->all_reduce_sum(out_.data(), int64_t(n) * c.dim);
    backend_->add_inplace(x_.data(), out_.data(), int64_t(n) * c.dim);
  }

  const int rows = int(batch.logit_rows.size());
  if (rows > 0) {
    const int vocab_local = shard_.vocab.size();
    if (last_.size() < size_t(rows) * c.dim) last_.resize(size_t(rows) * c.dim);
    if (logits_local_.size() < size_t(rows) * vocab_local) logits_local_.resize(size_t(rows) * vocab_local);
    for (int r = 0; r < rows; ++r)
      std::copy_n(x_.data() + int64_t(batch.logit_rows[r]) * c.dim, c.dim, last_.data() + int64_t(r) * c.dim);
    backend_->rms_norm(last_.data(), last_.data(), shard_.final_norm, rows, c.dim, c.rms_eps);
    backend_->matmul_xwt(logits_local_.data(), last_.data(), shard_.lm_head, rows, vocab_local, c.dim, c.dim);
    for (int r = 0; r < rows; ++r)
      std::copy_n(logits_local_.data() + int64_t(r) * vocab_local, vocab_local,
                  logits + int64_t(r) * c.vocab_size + shard_.vocab.begin);
  }
  comm_->barrier();
}

}  // namespace pdserve::engine
