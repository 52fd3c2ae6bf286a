#include "tests/gpu/device_runner.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/model_tensors.h"

namespace pdserve::testing {

using namespace pdserve::engine;

Status BackendBuffer::reserve(Backend* backend, size_t bytes) {
  if (ptr_ != nullptr && bytes <= bytes_) return absl::OkStatus();
  reset();
  PD_ASSIGN_OR_RETURN(ptr_, backend->allocate(bytes));
  backend_ = backend;
  bytes_ = bytes;
  return absl::OkStatus();
}

void BackendBuffer::reset() {
  if (ptr_ != nullptr) backend_->deallocate(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

namespace {

// Tensors by name, their data in backend memory.
class DeviceTensorSource final : public WeightSource {
 public:
  StatusOr<TensorView> tensor(std::string_view name) const override {
    auto it = tensors_.find(std::string(name));
    if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("no tensor ", std::string(name)));
    return it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, view] : tensors_) out.push_back(name);
    return out;
  }
  void add(const std::string& name, std::vector<int64_t> shape, const float* data) {
    tensors_[name] = TensorView{DType::kF32, std::move(shape), data};
  }

 private:
  std::map<std::string, TensorView> tensors_;
};

class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(Backend* backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, int64_t) override {}
  void all_gather(const float* in, int64_t count, float* out) override {
    if (in != out) (void)backend_->copy_to_device(out, in, size_t(count) * sizeof(float));
  }
  void barrier() override {}

 private:
  Backend* backend_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator(Backend* backend) {
  return std::make_unique<SingleRankCommunicator>(backend);
}

StatusOr<std::unique_ptr<ModelWeightsF32>> wrap_device_tensors(const ModelConfig& config,
                                                              const std::vector<const float*>& tensors) {
  const std::vector<TensorShape> shapes = model_tensors(config);
  if (shapes.size() != tensors.size())
    return absl::InvalidArgumentError(absl::StrCat(tensors.size(), " tensors for ", shapes.size(), " model tensors"));
  DeviceTensorSource source;
  for (size_t i = 0; i < shapes.size(); ++i)
    if (tensors[i] != nullptr) source.add(shapes[i].name, shapes[i].shape, tensors[i]);
  return ModelWeightsF32::create(config, source);
}

StatusOr<std::unique_ptr<DeviceWeights>> upload_weights(const ModelConfig& config,
                                                        const ModelWeightsF32& host, Backend* backend) {
  auto out = std::make_unique<DeviceWeights>();
  std::map<const float*, const float*> uploaded;
  std::vector<const float*> tensors;
  for (const TensorShape& e : model_tensors(config)) {
    const float* h = host.get(e.name);
    if (h == nullptr) {
      tensors.push_back(nullptr);
      continue;
    }
    auto it = uploaded.find(h);
    if (it == uploaded.end()) {
      int64_t n = 1;
      for (int64_t d : e.shape) n *= d;
      auto buf = std::make_unique<BackendBuffer>();
      PD_RETURN_IF_ERROR(buf->reserve(backend, size_t(n) * sizeof(float)));
      PD_RETURN_IF_ERROR(backend->copy_to_device(buf->as<void>(), h, size_t(n) * sizeof(float)));
      it = uploaded.emplace(h, buf->as<float>()).first;
      out->buffers.push_back(std::move(buf));
    }
    tensors.push_back(it->second);
  }
  PD_RETURN_IF_ERROR(backend->synchronize());
  PD_ASSIGN_OR_RETURN(out->weights, wrap_device_tensors(config, tensors));
  return out;
}

StatusOr<std::unique_ptr<DeviceRankRunner>> DeviceRankRunner::create(const ModelConfig& config,
                                                                    RankShard shard,
                                                                    const KvCacheSpec& kv_spec,
                                                                    int num_blocks, Backend* backend,
                                                                    Communicator* comm) {
  for (const LayerKvSpec& s : kv_spec.layers)
    if (s.dtype != DType::kF32) return absl::UnimplementedError("the forward pass keeps its KV cache in f32");
  PD_ASSIGN_OR_RETURN(KvCacheLayout layout, KvCacheLayout::create(kv_spec, shard.rank, shard.tp, num_blocks));
  auto r = std::unique_ptr<DeviceRankRunner>(new DeviceRankRunner(config, std::move(shard), std::move(layout), backend, comm));
  const KvCacheLayout& L = r->layout_;
  PD_RETURN_IF_ERROR(r->arena_.reserve(backend, L.total_bytes()));
  uint8_t* arena = r->arena_.as<uint8_t>();
  for (int l = 0; l < L.num_layers(); ++l) {
    kernels::cpu::PagedLayerView v;
    v.block_size = L.block_size();
    v.head_dim = L.part_head_dim(l, KvPart::kK);
    v.k = reinterpret_cast<float*>(arena + L.offset(l, KvPart::kK, 0, 0, 0));
    v.k_block_stride = int64_t(L.block_stride(l, KvPart::kK) / sizeof(float));
    v.k_token_stride = L.token_stride(l, KvPart::kK);
    v.k_head_stride = L.head_stride(l, KvPart::kK);
    if (kv_spec.layers[l].has_v()) {
      v.v_head_dim = L.part_head_dim(l, KvPart::kV);
      v.v = reinterpret_cast<float*>(arena + L.offset(l, KvPart::kV, 0, 0, 0));
      v.v_block_stride = int64_t(L.block_stride(l, KvPart::kV) / sizeof(float));
      v.v_token_stride = L.token_stride(l, KvPart::kV);
      v.v_head_stride = L.head_stride(l, KvPart::kV);
    }
    r->views_.push_back(v);
  }
  return r;
}

DeviceRankRunner::DeviceRankRunner(const ModelConfig& config, RankShard shard, KvCacheLayout layout,
                                   Backend* backend, Communicator* comm)
    : config_(config), shard_(std::move(shard)), layout_(std::move(layout)), backend_(backend), comm_(comm) {}

Status DeviceRankRunner::reserve(int n, int rows) {
  const ModelConfig& c = config_;
  const size_t f = sizeof(float);
  size_t q = 0, kv = 0, index = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    q = std::max(q, size_t(shard_.q_heads.size()) * w.head_dim);
    kv = std::max(kv, size_t(w.kv_heads.size()) * w.head_dim);
    index = std::max(index, size_t(c.attention(l).index_head_dim));
  }
  const size_t mask_stride = (c.max_seq_len + layout_.block_size() - 1) / layout_.block_size();
  Backend* b = backend_;
  PD_RETURN_IF_ERROR(x_.reserve(b, n * c.dim * f));
  PD_RETURN_IF_ERROR(xn_.reserve(b, n * c.dim * f));
  PD_RETURN_IF_ERROR(out_.reserve(b, n * c.dim * f));
  PD_RETURN_IF_ERROR(gate_.reserve(b, n * shard_.hidden.size() * f));
  PD_RETURN_IF_ERROR(up_.reserve(b, n * shard_.hidden.size() * f));
  PD_RETURN_IF_ERROR(q_.reserve(b, n * q * f));
  PD_RETURN_IF_ERROR(attn_.reserve(b, n * q * f));
  PD_RETURN_IF_ERROR(k_.reserve(b, n * kv * f));
  PD_RETURN_IF_ERROR(v_.reserve(b, n * kv * f));
  if (index > 0) {
    PD_RETURN_IF_ERROR(q_index_.reserve(b, n * index * f));
    PD_RETURN_IF_ERROR(k_index_.reserve(b, n * index * f));
    PD_RETURN_IF_ERROR(block_mask_.reserve(b, n * mask_stride));
  }
  if (rows > 0) {
    PD_RETURN_IF_ERROR(last_.reserve(b, size_t(rows) * c.dim * f));
    PD_RETURN_IF_ERROR(logits_local_.reserve(b, size_t(rows) * shard_.vocab.size() * f));
  }
  return absl::OkStatus();
}

StatusOr<kernels::cpu::TokenPlacement> DeviceRankRunner::upload_metadata(const ForwardBatch& batch) {
  const int n = int(batch.tokens.size()), bs = layout_.block_size();
  // [tokens][positions][each distinct block table, as far as this step's tokens reach].
  meta_host_.assign(batch.tokens.begin(), batch.tokens.end());
  meta_host_.insert(meta_host_.end(), batch.positions.begin(), batch.positions.end());
  std::map<const int*, int> reach;  // Blocks needed per table.
  for (int t = 0; t < n; ++t) {
    int& r = reach[batch.block_tables[t]];
    r = std::max(r, batch.positions[t] / bs + 1);
  }
  std::map<const int*, size_t> offset;
  for (const auto& [table, blocks] : reach) {
    offset[table] = meta_host_.size();
    meta_host_.insert(meta_host_.end(), table, table + blocks);
  }
  PD_RETURN_IF_ERROR(meta_.reserve(backend_, meta_host_.size() * sizeof(int)));
  PD_RETURN_IF_ERROR(table_ptrs_.reserve(backend_, size_t(n) * sizeof(const int*)));
  const int* base = meta_.as<int>();
  table_ptrs_host_.resize(n);
  for (int t = 0; t < n; ++t) table_ptrs_host_[t] = base + offset[batch.block_tables[t]];
  PD_RETURN_IF_ERROR(backend_->copy_to_device(meta_.as<void>(), meta_host_.data(), meta_host_.size() * sizeof(int)));
  PD_RETURN_IF_ERROR(backend_->copy_to_device(table_ptrs_.as<void>(), table_ptrs_host_.data(),
                                              size_t(n) * sizeof(const int*)));
  return kernels::cpu::TokenPlacement{n, base + n, table_ptrs_.as<const int* const>()};
}

Status DeviceRankRunner::forward(const ForwardBatch& batch, float* logits) {
  const ModelConfig& c = config_;
  const int n = int(batch.tokens.size()), rows = int(batch.logit_rows.size());
  PD_RETURN_IF_ERROR(reserve(n, rows));
  PD_ASSIGN_OR_RETURN(const kernels::cpu::TokenPlacement placement, upload_metadata(batch));
  const int* tokens = meta_.as<int>();
  const int* positions = placement.positions;
  const int nq = shard_.q_heads.size(), hidden = shard_.hidden.size();
  const bool rotate_half = c.rope_style == RopeStyle::kRotateHalf;
  const int mask_stride = (c.max_seq_len + layout_.block_size() - 1) / layout_.block_size();
  float *x = x_.as<float>(), *xn = xn_.as<float>(), *q = q_.as<float>(), *k = k_.as<float>(),
        *v = v_.as<float>(), *attn = attn_.as<float>(), *out = out_.as<float>(),
        *gate = gate_.as<float>(), *up = up_.as<float>();

  backend_->embed(x, shard_.embed, tokens, n, c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& w = shard_.layers[l];
    const int nkv = w.kv_heads.size(), hd = w.head_dim;
    const int q_local = nq * hd, kv_local = nkv * hd;
    const float scale = 1.0f / std::sqrt(float(hd));
    kernels::cpu::TokenPlacement place = placement;
    backend_->rms_norm(xn, x, w.attn_norm, n, c.dim, c.rms_eps);
    backend_->matmul_xwt(q, xn, w.wq, n, q_local, c.dim, c.dim);
    backend_->matmul_xwt(k, xn, w.wk, n, kv_local, c.dim, c.dim);
    backend_->matmul_xwt(v, xn, w.wv, n, kv_local, c.dim, c.dim);
    if (w.bq) {
      backend_->add_bias(q, w.bq, n, q_local);
      backend_->add_bias(k, w.bk, n, kv_local);
      backend_->add_bias(v, w.bv, n, kv_local);
    }
    backend_->rope(q, n, q_local, nq, hd, positions, c.rope_theta, rotate_half);
    backend_->rope(k, n, kv_local, nkv, hd, positions, c.rope_theta, rotate_half);
    backend_->paged_kv_write(views_[l], place, k, kv_local, v, kv_local, nkv);
    const int index_layer = c.index_cache_layer(l);
    if (index_layer >= 0) {
      const int index_dim = c.attention(l).index_head_dim;
      float *qi = q_index_.as<float>(), *ki = k_index_.as<float>();
      backend_->matmul_xwt(qi, xn, w.w_index_q, n, index_dim, c.dim, c.dim);
      backend_->matmul_xwt(ki, xn, w.w_index_k, n, index_dim, c.dim, c.dim);
      backend_->paged_kv_write(views_[index_layer], place, ki, index_dim, nullptr, 0, 1);
      backend_->index_select_blocks(block_mask_.as<uint8_t>(), mask_stride, qi, views_[index_layer], place,
                                    c.attention(l).index_top_k);
      if (batch.layer_hook) (*batch.layer_hook)(shard_.rank, index_layer, batch.completed_prefills);
      place.block_mask = block_mask_.as<uint8_t>();
      place.mask_stride = mask_stride;
    }
    if (batch.layer_hook) (*batch.layer_hook)(shard_.rank, l, batch.completed_prefills);
    backend_->paged_attention(attn, q, views_[l], place, nq, nq / nkv, layout_.spec().layers[l].window, scale);
    backend_->matmul_xwt(out, attn, w.wo, n, c.dim, q_local, c.q_dim(l));
    comm_->all_reduce_sum(out, int64_t(n) * c.dim);
    backend_->add_inplace(x, out, int64_t(n) * c.dim);

    backend_->rms_norm(xn, x, w.ffn_norm, n, c.dim, c.rms_eps);
    backend_->matmul_xwt(gate, xn, w.w_gate, n, hidden, c.dim, c.dim);
    backend_->matmul_xwt(up, xn, w.w_up, n, hidden, c.dim, c.dim);
    backend_->silu_mul(gate, up, int64_t(n) * hidden);
    backend_->matmul_xwt(out, gate, w.w_down, n, c.dim, hidden, c.hidden_dim);
    comm_->all_reduce_sum(out, int64_t(n) * c.dim);
    backend_->add_inplace(x, out, int64_t(n) * c.dim);
  }

  if (rows > 0) {
    const int vocab_local = shard_.vocab.size();
    float* last = last_.as<float>();
    // Backend-to-backend copies (copy_to_device accepts backend memory on both sides).
    for (int r = 0; r < rows; ++r)
      PD_RETURN_IF_ERROR(backend_->copy_to_device(last + int64_t(r) * c.dim,
                                                  x + int64_t(batch.logit_rows[r]) * c.dim, c.dim * sizeof(float)));
    backend_->rms_norm(last, last, shard_.final_norm, rows, c.dim, c.rms_eps);
    backend_->matmul_xwt(logits_local_.as<float>(), last, shard_.lm_head, rows, vocab_local, c.dim, c.dim);
    logits_host_.resize(size_t(rows) * vocab_local);
    PD_RETURN_IF_ERROR(backend_->copy_to_host(logits_host_.data(), logits_local_.as<void>(),
                                              logits_host_.size() * sizeof(float)));
    for (int r = 0; r < rows; ++r)
      std::copy_n(logits_host_.data() + int64_t(r) * vocab_local, vocab_local,
                  logits + int64_t(r) * c.vocab_size + shard_.vocab.begin);
  }
  comm_->barrier();
  return backend_->synchronize();
}

}  // namespace pdserve::testing
