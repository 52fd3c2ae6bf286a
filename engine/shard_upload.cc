#include "engine/shard_upload.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "engine/model/float_convert.h"

namespace pdserve::engine {
namespace {

// Copies tensors into `backend` (or, with none, only counts the bytes they would take).
class Uploader {
 public:
  Uploader(Backend* backend, UploadedShard* out) : backend_(backend), out_(out) {}

  // `rows` rows of `cols` floats, `stride` apart in `src`.
  struct Part {
    const float* src;
    int64_t rows, cols, stride;
  };

  // `rows` rows of `cols` floats, `stride` apart in `src`; stored compact (stride = cols), as
  // f32 or as bf16.
  StatusOr<const float*> rows(const float* src, int64_t rows, int64_t cols, int64_t stride,
                              DType type = DType::kF32) {
    if (src == nullptr) return nullptr;
    PD_ASSIGN_OR_RETURN(const std::vector<const float*> stored, stacked({Part{src, rows, cols, stride}}, type));
    return stored[0];
  }

  // The parts' rows (all of the same width) one after the other in one compact matrix; where
  // each part starts in it, the first part's start being the matrix's.
  StatusOr<std::vector<const float*>> stacked(std::initializer_list<Part> parts, DType type) {
    size_t n = 0;
    std::vector<const float*> starts;
    for (const Part& p : parts) {
      starts.push_back(p.src);
      n += size_t(p.rows * p.cols);
    }
    if (backend_ == nullptr) {
      out_->bytes += n * dtype_size(type);
      return starts;
    }
    const void* data = parts.begin()->src;
    if (type == DType::kBF16) {
      half_.resize(n);
      size_t at = 0;
      for (const Part& p : parts)
        for (int64_t r = 0; r < p.rows; ++r)
          for (int64_t c = 0; c < p.cols; ++c) half_[at++] = f32_to_bf16(p.src[r * p.stride + c]);
      data = half_.data();
    } else if (parts.size() > 1 || parts.begin()->stride != parts.begin()->cols) {
      compact_.resize(n);
      float* at = compact_.data();
      for (const Part& p : parts)
        for (int64_t r = 0; r < p.rows; ++r, at += p.cols) std::copy_n(p.src + r * p.stride, p.cols, at);
      data = compact_.data();
    }
    const size_t bytes = n * dtype_size(type);
    auto buf = std::make_unique<BackendBuffer>();
    PD_RETURN_IF_ERROR(buf->reserve(backend_, bytes));
    PD_RETURN_IF_ERROR(backend_->copy_to_device(buf->as<void>(), data, bytes));
    // The staging vector is reused by the next tensor: wait until this one has left it.
    if (data != parts.begin()->src) PD_RETURN_IF_ERROR(backend_->synchronize());
    size_t at = 0;
    starts.clear();
    for (const Part& p : parts) {
      starts.push_back(reinterpret_cast<const float*>(buf->as<uint8_t>() + at));
      at += size_t(p.rows * p.cols) * dtype_size(type);
    }
    out_->bytes += bytes;
    out_->buffers.push_back(std::move(buf));
    return starts;
  }
  StatusOr<const float*> vector(const float* src, int64_t n) { return rows(src, 1, n, n); }

 private:
  Backend* backend_;
  UploadedShard* out_;
  std::vector<float> compact_;
  std::vector<uint16_t> half_;
};

// upload_shard's work; with no backend, only the byte count (the shard's pointers stay host ones).
StatusOr<std::unique_ptr<UploadedShard>> upload(const ModelConfig& c, const RankShard& host, Backend* backend,
                                                DType weight_dtype) {
  if (host.weight_dtype != DType::kF32) return absl::InvalidArgumentError("upload_shard takes f32 host weights");
  auto out = std::make_unique<UploadedShard>();
  Uploader up(backend, out.get());
  RankShard& s = out->shard;
  s = host;
  s.weight_dtype = weight_dtype;
  const DType w = weight_dtype;
  const int64_t dim = c.dim, nq = host.q_heads.size(), hidden = host.hidden.size();
  PD_ASSIGN_OR_RETURN(s.embed, up.rows(host.embed, c.vocab_size, dim, dim));
  PD_ASSIGN_OR_RETURN(s.final_norm, up.vector(host.final_norm, dim));
  const int64_t lm_offset = host.lm_head - host.embed;
  if (w == DType::kF32 && lm_offset >= 0 && lm_offset < int64_t(c.vocab_size) * dim) {
    s.lm_head = s.embed + lm_offset;  // Tied to the embedding.
  } else {
    PD_ASSIGN_OR_RETURN(s.lm_head, up.rows(host.lm_head, host.vocab.size(), dim, dim, w));
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerShard& h = host.layers[l];
    LayerShard& d = s.layers[l];
    const int64_t q_local = nq * h.head_dim, kv_local = int64_t(h.kv_heads.size()) * h.head_dim;
    const int64_t index_dim = c.attention(l).index_head_dim;
    PD_ASSIGN_OR_RETURN(d.attn_norm, up.vector(h.attn_norm, dim));
    PD_ASSIGN_OR_RETURN(d.ffn_norm, up.vector(h.ffn_norm, dim));
    // One matrix each for the fused QKV and gate_up GEMMs, the parts' pointers into them.
    PD_ASSIGN_OR_RETURN(
        const auto qkv,
        up.stacked({{h.wq, q_local, dim, dim}, {h.wk, kv_local, dim, dim}, {h.wv, kv_local, dim, dim}}, w));
    d.wqkv = d.wq = qkv[0];
    d.wk = qkv[1];
    d.wv = qkv[2];
    PD_ASSIGN_OR_RETURN(d.bq, up.vector(h.bq, q_local));
    PD_ASSIGN_OR_RETURN(d.bk, up.vector(h.bk, kv_local));
    PD_ASSIGN_OR_RETURN(d.bv, up.vector(h.bv, kv_local));
    PD_ASSIGN_OR_RETURN(d.q_norm, up.vector(h.q_norm, h.head_dim));
    PD_ASSIGN_OR_RETURN(d.k_norm, up.vector(h.k_norm, h.head_dim));
    PD_ASSIGN_OR_RETURN(d.wo, up.rows(h.wo, dim, q_local, h.wo_stride, w));
    d.wo_stride = q_local;
    PD_ASSIGN_OR_RETURN(d.w_index_q, up.rows(h.w_index_q, index_dim, dim, dim, w));
    PD_ASSIGN_OR_RETURN(d.w_index_k, up.rows(h.w_index_k, index_dim, dim, dim, w));
    PD_ASSIGN_OR_RETURN(const auto gate_up, up.stacked({{h.w_gate, hidden, dim, dim}, {h.w_up, hidden, dim, dim}}, w));
    d.w_gate_up = d.w_gate = gate_up[0];
    d.w_up = gate_up[1];
    PD_ASSIGN_OR_RETURN(d.w_down, up.rows(h.w_down, dim, hidden, h.w_down_stride, w));
    d.w_down_stride = hidden;
  }
  if (backend != nullptr) PD_RETURN_IF_ERROR(backend->synchronize());
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<UploadedShard>> upload_shard(const ModelConfig& c, const RankShard& host,
                                                      Backend* backend, DType weight_dtype) {
  if (weight_dtype != DType::kF32 && (weight_dtype != DType::kBF16 || !backend->bf16_weights()))
    return absl::InvalidArgumentError(absl::StrCat("the ", backend->name(), " backend cannot compute with ",
                                                   dtype_name(weight_dtype), " weights"));
  return upload(c, host, backend, weight_dtype);
}

StatusOr<uint64_t> uploaded_bytes(const ModelConfig& config, const RankShard& host, DType weight_dtype) {
  PD_ASSIGN_OR_RETURN(auto counted, upload(config, host, nullptr, weight_dtype));
  return counted->bytes;
}

}  // namespace pdserve::engine
