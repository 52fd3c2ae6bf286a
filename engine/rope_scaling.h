// RoPE scaling: how a model stretches its rotary position embedding past the context it was
// pretrained on (config.json's `rope_scaling`), and the per-pair inverse frequencies and the
// cos/sin scale each kind implies. The formulas are Hugging Face transformers' (modeling_rope_utils:
// _compute_linear_scaling_rope_parameters, _compute_dynamic_ntk_parameters, _compute_yarn_parameters,
// _compute_llama3_parameters); the forward pass uploads the table once per rank and head dim, so the
// kernels only multiply positions by it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"

namespace pdserve::engine {

enum class RopeScalingType : uint8_t {
  kNone = 0,     // theta^(-2i/d): no scaling (HF "default").
  kLinear = 1,   // Every frequency divided by `factor` (position interpolation).
  kDynamic = 2,  // NTK-aware: theta enlarged; see rope_frequencies for the static form used.
  kYarn = 3,     // Per-dimension blend of interpolation and extrapolation, and a cos/sin scale.
  kLlama3 = 4,   // Llama 3.1+: low frequencies divided by `factor`, a smooth band in between.
};

// A parsed `rope_scaling` object. Only the fields of `type` are meaningful; the defaults are HF's.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;
  // llama3 (required) and yarn (optional: 0 takes max_position_embeddings): the pretraining context.
  int original_max_position_embeddings = 0;
  // llama3: wavelengths above original/low_freq_factor are scaled, below original/high_freq_factor
  // kept, and smoothly blended in between.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn: the ramp between extrapolated and interpolated dimensions runs from the dimension that
  // turns beta_fast times over the original context to the one that turns beta_slow times.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  // yarn: the cos/sin scale; unset derives it from factor (and mscale / mscale_all_dim, 0 = absent).
  std::optional<double> attention_factor;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;  // yarn: round the ramp's ends to whole dimensions.

  bool operator==(const RopeScaling&) const = default;
  // InvalidArgument for values HF rejects (factor < 1, high_freq_factor <= low_freq_factor, a
  // llama3 scaling without its original context, a negative attention factor, ...).
  Status validate() const;
};

// What the rotary kernels take for one head dim.
struct RopeFrequencies {
  std::vector<float> inv_freq;   // head_dim / 2 entries: pair i turns by position * inv_freq[i].
  float attention_scale = 1.0f;  // Multiplies cos and sin (yarn's attention factor; else 1).
};

// The table for `scaling` (validated) with base `theta`, a head of `head_dim` (even) and the
// config's max_position_embeddings. The unscaled base frequencies are computed in f32 exactly as
// HF does (1 / theta^(2i/d)); each scaling type adjusts them in double and rounds once.
//
// kDynamic: HF recomputes the frequencies on every forward pass from the current length (longer
// than max_position_embeddings only), so keys cached before the switch keep their old rotation.
// A paged, batched engine cannot; like vLLM, this uses the static form — the frequencies HF gives
// at length max_position_embeddings * factor — at every position.
RopeFrequencies rope_frequencies(const RopeScaling& scaling, float theta, int head_dim,
                                 int max_position_embeddings);

}  // namespace pdserve::engine
