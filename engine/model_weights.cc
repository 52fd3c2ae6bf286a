#include "engine/model_weights.h"

#include <cstring>

#include "engine/model_tensors.h"

namespace pdserve::engine {
namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // Subnormal: normalise.
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) { mant <<= 1; --exp; }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? "," : "", s[i]);
  return out + "]";
}

}  // namespace

StatusOr<std::unique_ptr<ModelWeightsF32>> ModelWeightsF32::create(const ModelConfig& c,
                                                                   const WeightSource& source) {
  PD_RETURN_IF_ERROR(c.validate());
  auto w = std::unique_ptr<ModelWeightsF32>(new ModelWeightsF32());
  for (const TensorShape& e : model_tensors(c)) {
    StatusOr<TensorView> t = source.tensor(e.name);
    if (!t.ok()) {
      if (e.optional && absl::IsNotFound(t.status())) continue;
      return absl::Status(t.status().code(),
                          absl::StrCat("model tensor ", e.name, ": ", t.status().message()));
    }
    if (t->shape != e.shape)
      return absl::InvalidArgumentError(absl::StrCat("model tensor ", e.name, " has shape ",
                                                     shape_str(t->shape), ", config implies ",
                                                     shape_str(e.shape)));
    if (t->dtype == DType::kF32) {
      w->tensors_[e.name] = static_cast<const float*>(t->data);
      continue;
    }
    std::vector<float> f(t->numel());
    const uint16_t* src = static_cast<const uint16_t*>(t->data);
    for (size_t i = 0; i < f.size(); ++i)
      f[i] = t->dtype == DType::kBF16 ? bf16_to_float(src[i]) : half_to_float(src[i]);
    w->converted_bytes_ += f.size() * sizeof(float);
    w->tensors_[e.name] = f.data();
    w->owned_.push_back(std::move(f));
  }
  if (!w->get("lm_head.weight")) w->tensors_["lm_head.weight"] = w->get("model.embed_tokens.weight");
  return w;
}

const float* ModelWeightsF32::get(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

StatusOr<RankShard> shard_weights(const ModelConfig& c, const ModelWeightsF32& w, int rank, int tp) {
  PD_RETURN_IF_ERROR(c.validate_tp(tp));
  RankShard s;
  s.rank = rank;
  s.tp = tp;
  s.q_heads = {rank * c.n_heads / tp, (rank + 1) * c.n_heads / tp};
  s.hidden = even_split(c.hidden_dim, tp, rank);
  s.vocab = even_split(c.vocab_size, tp, rank);
  s.embed = w.get("model.embed_tokens.weight");
  s.final_norm = w.get("model.norm.weight");
  s.lm_head = w.get("lm_head.weight") + int64_t(s.vocab.begin) * c.dim;
  for (int l = 0; l < c.n_layers; ++l) {
    auto get = [&](const char* suffix) { return w.get(layer_tensor_name(l, suffix)); };
    const LayerAttention a = c.attention(l);
    const int64_t hd = a.head_dim;
    LayerShard ls;
    ls.kv_heads = kv_heads_of_rank(a.n_kv_heads, tp, rank);
    ls.head_dim = a.head_dim;
    if (a.index_head_dim > 0) {
      ls.w_index_q = get("self_attn.index_q_proj.weight");
      ls.w_index_k = get("self_attn.index_k_proj.weight");
    }
    ls.attn_norm = get("input_layernorm.weight");
    ls.ffn_norm = get("post_attention_layernorm.weight");
    ls.wq = get("self_attn.q_proj.weight") + s.q_heads.begin * hd * c.dim;
    ls.wk = get("self_attn.k_proj.weight") + ls.kv_heads.begin * hd * c.dim;
    ls.wv = get("self_attn.v_proj.weight") + ls.kv_heads.begin * hd * c.dim;
    ls.wo = get("self_attn.o_proj.weight") + s.q_heads.begin * hd;
    ls.wo_stride = c.q_dim(l);
    if (c.qkv_bias) {
      ls.bq = get("self_attn.q_proj.bias") + s.q_heads.begin * hd;
      ls.bk = get("self_attn.k_proj.bias") + ls.kv_heads.begin * hd;
      ls.bv = get("self_attn.v_proj.bias") + ls.kv_heads.begin * hd;
    }
    if (c.qk_norm) {
      ls.q_norm = get("self_attn.q_norm.weight");
      ls.k_norm = get("self_attn.k_norm.weight");
    }
    ls.w_gate = get("mlp.gate_proj.weight") + int64_t(s.hidden.begin) * c.dim;
    ls.w_up = get("mlp.up_proj.weight") + int64_t(s.hidden.begin) * c.dim;
    ls.w_down = get("mlp.down_proj.weight") + s.hidden.begin;
    ls.w_down_stride = c.hidden_dim;
    s.layers.push_back(ls);
  }
  return s;
}

}  // namespace pdserve::engine
