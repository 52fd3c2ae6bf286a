// make-model: writes a Hugging Face model directory (config.json, model.safetensors,
// tokenizer files) either with seeded random weights in a named shape ("tiny", "llama-3-8b",
// ...) for tests and benchmarks, or exported from a llama2.c checkpoint (--from).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/dtype.h"
#include "engine/model_config.h"

namespace pdserve::engine {

struct MakeModelOptions {
  std::string preset;   // One of make_model_presets(); empty with `from`.
  uint64_t seed = 0;    // Same preset + seed + dtype: byte-identical files.
  std::string out_dir;  // Created if missing; existing model files in it are replaced.
  std::string from;     // A llama2.c .bin to export instead of a preset.
  DType dtype = DType::kF32;
};

// Preset models: weights N(0, 0.02) (biases too), norm weights 1 — except tiny-llama31,
// tiny-qwen3, tiny-yarn and mixed-geometry, whose weights are N(0, 1/fan-in) so that positions
// and cached keys visibly change the logits (the first three also draw norm weights
// 1 + N(0, 0.2)). They share the byte-level
// tokenizer (BOS 256, EOS 257, 258 tokens), so bos_token_id/eos_token_id are 256/257 whatever
// the real model uses; the model vocabulary is larger and the extra ids are never encoded.
// Weights are streamed to disk: an 8B model in f32 needs 32 GB of disk, not of memory.
//
// Export (`from`): the checkpoint's weights with each head's q/k rows reordered from llama2.c's
// adjacent-pair RoPE layout to rotate-half (row 2i -> i, 2i+1 -> i + head_dim/2), so the HF
// model computes the same logits; its tokenizer (found beside it) is copied as tokenizer.bin.
// The config keeps llama2.c's BOS 1 and stop-at-BOS (eos_token_id 1).
Status make_model(const MakeModelOptions& options);

// The preset names: tiny, tiny-mha, tiny-qwen2, tiny-mistral, synthetic-100m, llama-3-8b,
// qwen2.5-7b, tiny-llama31 (llama3 RoPE scaling), tiny-qwen3, tiny-yarn, mixed-geometry.
std::vector<std::string> make_model_presets();

// The config a preset writes; NotFound for unknown names (listing the known ones).
StatusOr<ModelConfig> make_model_preset_config(const std::string& preset);

}  // namespace pdserve::engine
