#include "engine/model_tensors.h"

#include "engine/weights.h"

namespace pdserve::engine {

std::vector<TensorShape> model_tensors(const ModelConfig& c) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, vocab = c.vocab_size;
  std::vector<TensorShape> t;
  t.push_back({"model.embed_tokens.weight", {vocab, dim}});
  for (int l = 0; l < c.n_layers; ++l) {
    const int64_t q = c.q_dim(l), kv = c.kv_dim(l), index = c.attention(l).index_head_dim;
    auto add = [&](const char* suffix, std::vector<int64_t> shape) {
      t.push_back({layer_tensor_name(l, suffix), std::move(shape)});
    };
    add("input_layernorm.weight", {dim});
    add("self_attn.q_proj.weight", {q, dim});
    add("self_attn.k_proj.weight", {kv, dim});
    add("self_attn.v_proj.weight", {kv, dim});
    if (c.qkv_bias) {
      add("self_attn.q_proj.bias", {q});
      add("self_attn.k_proj.bias", {kv});
      add("self_attn.v_proj.bias", {kv});
    }
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.attention(l).head_dim});
      add("self_attn.k_norm.weight", {c.attention(l).head_dim});
    }
    add("self_attn.o_proj.weight", {dim, q});
    if (index > 0) {
      add("self_attn.index_q_proj.weight", {index, dim});
      add("self_attn.index_k_proj.weight", {index, dim});
    }
    add("post_attention_layernorm.weight", {dim});
    add("mlp.gate_proj.weight", {hidden, dim});
    add("mlp.up_proj.weight", {hidden, dim});
    add("mlp.down_proj.weight", {dim, hidden});
  }
  t.push_back({"model.norm.weight", {dim}});
  t.push_back({"lm_head.weight", {vocab, dim}, c.tie_embeddings});
  return t;
}

}  // namespace pdserve::engine
