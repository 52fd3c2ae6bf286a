// The model's weights as fp32 for the CPU backend, and each TP rank's shard of them. f32
// tensors are used in place (memory-mapped, never copied); bf16/f16 tensors are converted once
// and shared by all ranks. A rank's shard is only pointers and strides into the full tensors:
// row slices for Q/K/V and the MLP's gate/up, column slices (a leading dimension wider than
// the slice) for the output projections, Megatron style.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/dtype.h"
#include "engine/model_config.h"
#include "engine/tp_shard.h"
#include "engine/weights.h"

namespace pdserve::engine {

// Every tensor the model needs, as fp32 pointers, shape-checked against the config.
class ModelWeightsF32 {
 public:
  static StatusOr<std::unique_ptr<ModelWeightsF32>> create(const ModelConfig& config,
                                                           const WeightSource& source);
  // The fp32 data of tensor `name` (validated at creation); nullptr if the model has none.
  const float* get(const std::string& name) const;
  // Bytes converted to fp32 (0 when every tensor was f32 and is used in place).
  size_t converted_bytes() const { return converted_bytes_; }

 private:
  std::map<std::string, const float*> tensors_;
  std::vector<std::vector<float>> owned_;
  size_t converted_bytes_ = 0;
};

struct LayerShard {
  Range kv_heads;    // Global KV heads held (replicated when tp > the layer's KV heads).
  int head_dim = 0;  // The layer's attention head dim.
  const float* attn_norm = nullptr;
  const float* wq = nullptr;  // [q_local][dim] rows.
  const float* wk = nullptr;  // [kv_local][dim] rows.
  const float* wv = nullptr;
  const float* bq = nullptr;  // Biases (Qwen2) or nullptr.
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // Qwen3's per-head q/k RMSNorm weights [head_dim], whole on
  const float* k_norm = nullptr;  // every rank; or nullptr.
  const float* wo = nullptr;  // [dim][q_local] columns, rows wo_stride apart.
  int64_t wo_stride = 0;      // q_dim in the full tensor; q_local once uploaded compact.
  const float* w_index_q = nullptr;  // [index_head_dim][dim], whole on every rank; or nullptr.
  const float* w_index_k = nullptr;
  const float* ffn_norm = nullptr;
  const float* w_gate = nullptr;  // [hidden_local][dim] rows.
  const float* w_up = nullptr;
  const float* w_down = nullptr;  // [dim][hidden_local] columns, rows w_down_stride apart.
  int64_t w_down_stride = 0;      // hidden_dim in the full tensor; hidden_local once compact.
  // Fused projections, where the weights were laid out for them (upload_shard does): [wq; wk;
  // wv] as one [q_local + 2*kv_local][dim] matrix, and [w_gate; w_up] as one
  // [2*hidden_local][dim]; wq, wk, wv, w_gate and w_up then point into them. One GEMM each where
  // there were three and two (issue 18's R5c). Null in host shards, which point into the model's
  // own tensors.
  const float* wqkv = nullptr;
  const float* w_gate_up = nullptr;
};

// What rank `rank` of `tp` computes.
struct RankShard {
  int rank = 0, tp = 1;
  // Element type of the GEMM weights (wq, wk, wv, wo, the MLP's, the index projections and
  // lm_head): f32, or bf16 bits behind the same pointers once uploaded to a backend whose
  // bf16_weights() is true. Embedding table, norms and biases are always f32.
  DType weight_dtype = DType::kF32;
  // How those GEMMs take their activations (engine/dtype.h): kBf16 with bf16 weights only.
  GemmPrecision gemm_precision = GemmPrecision::kExact;
  // Decode steps recorded once per batch bucket and replayed (engine/decode_graphs.h): on
  // backends that record graphs, at TP 1.
  bool decode_graphs = false;
  Range q_heads;    // Global attention heads.
  Range hidden;     // MLP columns.
  Range vocab;      // Rows of the output classifier.
  const float* embed = nullptr;  // Full table, every rank.
  const float* final_norm = nullptr;
  const float* lm_head = nullptr;  // [vocab_local][dim] rows.
  std::vector<LayerShard> layers;
};

// Slices `weights` for rank `rank` of `tp`; fails if the model does not divide over `tp`.
StatusOr<RankShard> shard_weights(const ModelConfig& config, const ModelWeightsF32& weights,
                                  int rank, int tp);

}  // namespace pdserve::engine
