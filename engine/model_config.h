// The shape and hyper-parameters of a Llama-family model (Llama, Mistral, Qwen2, Qwen3), whatever
// file format it came from, and the KV cache spec it implies.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/generation_defaults.h"
#include "engine/kv_spec.h"
#include "engine/rope_scaling.h"

namespace pdserve::engine {

// How RoPE pairs the dimensions of a head: llama2.c/Meta rotates adjacent pairs (2i, 2i+1);
// Hugging Face checkpoints rotate halves (i, i + head_dim/2).
enum class RopeStyle : uint8_t { kAdjacentPairs = 0, kRotateHalf = 1 };

// One layer's attention shape and cache layout, where it differs from the model-wide fields
// (mixed-geometry models: per-layer KV heads and head dims, sliding windows, K/V layouts, and a
// key-only index cache whose scores pick the blocks a layer attends to).
struct LayerAttention {
  int n_kv_heads = 0;
  int head_dim = 0;
  int window = 0;  // 0: full attention.
  KvLayout kv_layout = KvLayout::kSeparate;
  // Head-outer by default: a P/D transfer between different TP degrees then moves each head's
  // run of blocks as one op (see KvOrder).
  KvOrder kv_order = KvOrder::kHeadOuter;
  // > 0: the layer keeps a one-head key-only index cache of this head dim (replicated on every
  // rank); each query attends only the `index_top_k` blocks whose index keys score highest
  // against its index query, plus its own block.
  int index_head_dim = 0;
  int index_top_k = 0;
  bool operator==(const LayerAttention&) const = default;
};

struct ModelConfig {
  std::string architecture = "llama";  // "llama", "mistral", "qwen2", "qwen3".
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // dim / n_heads unless the config says otherwise.
  int vocab_size = 0;
  int max_seq_len = 0;  // max_position_embeddings: the engine refuses longer sequences.
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;  // How RoPE stretches past the pretraining context (default: not at all).
  float rms_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::kRotateHalf;
  bool qkv_bias = false;
  // Qwen3: an RMSNorm over each q and k head (weights of head_dim, shared by all heads) between
  // the projections and RoPE.
  bool qk_norm = false;
  bool tie_embeddings = false;
  int sliding_window = 0;  // 0: full attention in every layer.
  int bos_id = 1;
  std::vector<int> eos_ids = {2};  // Tokens that end generation.
  // Per-layer attention; empty means every layer uses the fields above.
  std::vector<LayerAttention> layer_attention;
  // generation_config.json's sampling defaults (none for a model without one).
  GenerationDefaults generation_defaults;

  // Layer `l`'s attention (from layer_attention, or the model-wide fields).
  LayerAttention attention(int l) const;
  int q_dim(int l = 0) const { return n_heads * attention(l).head_dim; }
  int kv_dim(int l = 0) const { const LayerAttention a = attention(l); return a.n_kv_heads * a.head_dim; }
  // The KV cache spec entry holding layer `l`'s index cache; -1 if it has none. Index caches
  // follow the n_layers attention caches, in layer order.
  int index_cache_layer(int l) const;

  // Checks that the numbers are positive and consistent (heads divide, dims agree).
  Status validate() const;
  // Checks that the model can be sharded over `tp` ranks.
  Status validate_tp(int tp) const;
  // The per-layer KV cache spec this model needs, with the given block size and cache dtype.
  KvCacheSpec kv_cache_spec(int block_size, DType dtype = DType::kF32) const;
};

}  // namespace pdserve::engine
