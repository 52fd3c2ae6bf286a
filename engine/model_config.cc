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
  if (n_heads % n_kv_heads != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("n_heads (", n_heads, ") is not a multiple of n_kv_heads (", n_kv_heads, ")"));
  if (head_dim % 2 != 0) return absl::InvalidArgumentError("head_dim must be even for RoPE");
  if (!(rms_eps > 0.0f)) return absl::InvalidArgumentError("rms_norm_eps must be positive");
  if (bos_id < 0 || bos_id >= vocab_size) return absl::InvalidArgumentError("BOS id outside the vocabulary");
  return absl::OkStatus();
}

Status ModelConfig::validate_tp(int tp) const {
  if (tp <= 0) return absl::InvalidArgumentError("TP size must be positive");
  if (n_heads % tp != 0)
    return absl::InvalidArgumentError(absl::StrCat("the model's ", n_heads,
                                                   " attention heads do not divide over TP ", tp));
  if (!kv_heads_divide(n_kv_heads, tp))
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's ", n_kv_heads, " KV heads cannot be spread over TP ", tp,
        " (need heads % tp == 0, or tp % heads == 0 for replication)"));
  if (hidden_dim < tp) return absl::InvalidArgumentError("MLP hidden size smaller than TP");
  return absl::OkStatus();
}

KvCacheSpec ModelConfig::kv_cache_spec(int block_size, DType dtype) const {
  KvCacheSpec spec;
  spec.block_size = block_size;
  for (int l = 0; l < n_layers; ++l) {
    LayerKvSpec s;
    s.num_kv_heads = n_kv_heads;
    s.head_dim = head_dim;
    s.v_head_dim = head_dim;
    s.dtype = dtype;
    s.window = sliding_window;
    spec.layers.push_back(s);
  }
  return spec;
}

}  // namespace pdserve::engine
