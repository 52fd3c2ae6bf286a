#include "engine/rope_scaling.h"

#include <algorithm>
#include <cmath>

namespace pdserve::engine {
namespace {

// HF's default inverse frequencies, in f32 as torch computes them (and as the rotary kernels
// did before tables): the unscaled table is bit-identical to theirs.
std::vector<float> base_inv_freq(float theta, int head_dim) {
  std::vector<float> inv(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(theta, float(2 * i) / float(head_dim));
  return inv;
}

// yarn's get_mscale: the attention temperature for stretching the context by `scale`.
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// yarn's find_correction_dim: the (fractional) dimension index that turns `rotations` times over
// `context` positions.
double yarn_correction_dim(double rotations, int dim, double theta, int context) {
  return dim * std::log(context / (rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
}

void scale_llama3(const RopeScaling& s, std::vector<float>& inv) {
  const double original = s.original_max_position_embeddings;
  const double low_freq_wavelen = original / s.low_freq_factor;
  const double high_freq_wavelen = original / s.high_freq_factor;
  for (float& f : inv) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen < high_freq_wavelen) continue;  // High frequencies: kept.
    if (wavelen > low_freq_wavelen) {           // Low frequencies: interpolated.
      f = float(f / s.factor);
      continue;
    }
    const double smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = float((1.0 - smooth) * f / s.factor + smooth * f);
  }
}

float scale_yarn(const RopeScaling& s, float theta, int head_dim, int max_position_embeddings,
                 std::vector<float>& inv) {
  const int context = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                             : max_position_embeddings;
  double low = yarn_correction_dim(s.beta_fast, head_dim, theta, context);
  double high = yarn_correction_dim(s.beta_slow, head_dim, theta, context);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(head_dim - 1));
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp.
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // 1: the dimension keeps its frequency.
    const double interpolated = double(inv[i]) / s.factor;
    inv[i] = float(interpolated * (1.0 - extrapolation) + double(inv[i]) * extrapolation);
  }
  if (s.attention_factor) return float(*s.attention_factor);
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return float(yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim));
  return float(yarn_mscale(s.factor, 1.0));
}

}  // namespace

Status RopeScaling::validate() const {
  if (type == RopeScalingType::kNone) return absl::OkStatus();
  if (!(factor >= 1.0)) return absl::InvalidArgumentError(absl::StrCat("rope_scaling factor ", factor, " must be >= 1"));
  if (type == RopeScalingType::kLlama3) {
    if (original_max_position_embeddings <= 0)
      return absl::InvalidArgumentError("llama3 rope_scaling needs original_max_position_embeddings");
    if (!(low_freq_factor > 0.0) || !(high_freq_factor > low_freq_factor))
      return absl::InvalidArgumentError(absl::StrCat("llama3 rope_scaling needs 0 < low_freq_factor (", low_freq_factor,
                                                     ") < high_freq_factor (", high_freq_factor, ")"));
  }
  if (type == RopeScalingType::kYarn) {
    if (attention_factor && !(*attention_factor >= 0.0))
      return absl::InvalidArgumentError("yarn rope_scaling attention_factor must be >= 0");
    if (!(beta_fast > 0.0) || !(beta_slow > 0.0))
      return absl::InvalidArgumentError("yarn rope_scaling beta_fast and beta_slow must be positive");
    if (original_max_position_embeddings < 0)
      return absl::InvalidArgumentError("yarn rope_scaling original_max_position_embeddings must be positive");
  }
  return absl::OkStatus();
}

RopeFrequencies rope_frequencies(const RopeScaling& s, float theta, int head_dim, int max_position_embeddings) {
  RopeFrequencies out;
  switch (s.type) {
    case RopeScalingType::kNone:
      out.inv_freq = base_inv_freq(theta, head_dim);
      break;
    case RopeScalingType::kLinear:
      out.inv_freq = base_inv_freq(theta, head_dim);
      for (float& f : out.inv_freq) f = float(f / s.factor);
      break;
    case RopeScalingType::kDynamic: {
      // HF's base at sequence length L: theta * (factor * L / max - (factor - 1))^(d / (d - 2));
      // the static form takes L = max * factor.
      const double grown = s.factor * s.factor - (s.factor - 1.0);
      const double base = double(theta) * std::pow(grown, double(head_dim) / double(head_dim - 2));
      out.inv_freq = base_inv_freq(float(base), head_dim);
      break;
    }
    case RopeScalingType::kYarn:
      out.inv_freq = base_inv_freq(theta, head_dim);
      out.attention_scale = scale_yarn(s, theta, head_dim, max_position_embeddings, out.inv_freq);
      break;
    case RopeScalingType::kLlama3:
      out.inv_freq = base_inv_freq(theta, head_dim);
      scale_llama3(s, out.inv_freq);
      break;
  }
  return out;
}

}  // namespace pdserve::engine
