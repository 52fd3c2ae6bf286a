#include "engine/model_config.h"

#include "engine/tp_shard.h"
#include "engine/weights.h"

namespace pdserve::engine {

std::string layer_tensor_name(int layer, std::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", std::string(suffix));
}

Status ModelConfig::validate() const {
  if (dim <= 0 || hidden_dim <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 ||
      head_dim <= 0 || vocab_size <= 0 || max_seq_len <= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "model shape has a non-positive field: dim=", dim, " hidden_dim=", hidden_dim,
        " n_layers=", n_layers, " n_heads=", n_heads, " n_kv_heads=", n_kv_heads,
        " head_dim=", head_dim, " vocab_size=", vocab_size, " max_seq_len=", max_seq_len));
  if (!layer_attention.empty() && int(layer_attention.size()) != n_layers)
    return absl::InvalidArgumentError(absl::StrCat("per-layer attention lists ", layer_attention.size(),
                                                   " layers, the model has ", n_layers));
  for (int l = 0; l < n_layers; ++l) {
    const LayerAttention a = attention(l);
    if (a.n_kv_heads <= 0 || a.head_dim <= 0 || a.window < 0 || a.index_head_dim < 0)
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": non-positive KV heads or head dim"));
    if (n_heads % a.n_kv_heads != 0)
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": n_heads (", n_heads,
                                                     ") is not a multiple of its KV heads (", a.n_kv_heads, ")"));
    if (a.head_dim % 2 != 0) return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": head_dim must be even for RoPE"));
    if (a.index_head_dim > 0 && a.index_top_k <= 0)
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": an index cache needs index_top_k > 0"));
  }
  PD_RETURN_IF_ERROR(rope_scaling.validate());
  if (!(rms_eps > 0.0f)) return absl::InvalidArgumentError("rms_norm_eps must be positive");
  if (bos_id < 0 || bos_id >= vocab_size) return absl::InvalidArgumentError("BOS id outside the vocabulary");
  return absl::OkStatus();
}

Status ModelConfig::validate_tp(int tp) const {
  if (tp <= 0) return absl::InvalidArgumentError("TP size must be positive");
  if (n_heads % tp != 0)
    return absl::InvalidArgumentError(absl::StrCat("the model's ", n_heads,
                                                   " attention heads do not divide over TP ", tp));
  for (int l = 0; l < n_layers; ++l)
    if (!kv_heads_divide(attention(l).n_kv_heads, tp))
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's ", attention(l).n_kv_heads, " KV heads (layer ", l, ") cannot be spread over TP ", tp,
          " (need heads % tp == 0, or tp % heads == 0 for replication)"));
  if (hidden_dim < tp) return absl::InvalidArgumentError("MLP hidden size smaller than TP");
  return absl::OkStatus();
}

LayerAttention ModelConfig::attention(int l) const {
  if (!layer_attention.empty()) return layer_attention[l];
  LayerAttention a;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.window = sliding_window;
  return a;
}

int ModelConfig::index_cache_layer(int l) const {
  if (attention(l).index_head_dim == 0) return -1;
  int at = n_layers;
  for (int i = 0; i < l; ++i) at += attention(i).index_head_dim > 0;
  return at;
}

KvCacheSpec ModelConfig::kv_cache_spec(int block_size, DType dtype) const {
  KvCacheSpec spec;
  spec.block_size = block_size;
  for (int l = 0; l < n_layers; ++l) {
    const LayerAttention a = attention(l);
    LayerKvSpec s;
    s.num_kv_heads = a.n_kv_heads;
    s.head_dim = a.head_dim;
    s.v_head_dim = a.head_dim;
    s.dtype = dtype;
    s.layout = a.kv_layout;
    s.order = a.kv_order;
    s.window = a.window;
    spec.layers.push_back(s);
  }
  for (int l = 0; l < n_layers; ++l) {
    const LayerAttention a = attention(l);
    if (a.index_head_dim == 0) continue;
    LayerKvSpec s;
    s.kind = KvKind::kKeyOnly;
    s.sharding = KvSharding::kReplicated;
    s.num_kv_heads = 1;
    s.head_dim = a.index_head_dim;
    s.dtype = dtype;
    spec.layers.push_back(s);
  }
  return spec;
}

}  // namespace pdserve::engine
