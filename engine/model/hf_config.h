// Hugging Face config.json for the Llama family (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM) to and from ModelConfig, so HF directories and make-model's
// output agree.
#pragma once

#include <string>

#include "common/status.h"
#include "engine/model_config.h"

namespace pdserve::engine {

// Parses config.json text. `source` names it in errors. Unimplemented for architectures or
// features the engine lacks (rope_scaling types other than linear, dynamic, yarn and llama3, or
// fields of theirs it cannot honour; partial_rotary_factor; mlp_bias; per-layer sliding windows);
// InvalidArgument for missing or mistyped fields. The result uses rotate-half RoPE and is
// validate()d.
StatusOr<ModelConfig> parse_hf_config(const std::string& text, const std::string& source);

// Reads and parses the config.json at `path`.
StatusOr<ModelConfig> read_hf_config(const std::string& path);

// Adds the eos_token_id(s) of a generation_config.json (text) to `config.eos_ids` — chat models
// list their end-of-turn token there rather than in config.json — and sets
// `config.generation_defaults` from its sampling keys (parse_generation_defaults).
Status merge_generation_config(const std::string& text, const std::string& source, ModelConfig& config);

// The config.json text for `config` whose weights are stored as `dtype` (inverse of
// parse_hf_config; rope_style must be kRotateHalf, the only layout HF checkpoints use).
StatusOr<std::string> hf_config_json(const ModelConfig& config, DType dtype);

}  // namespace pdserve::engine
