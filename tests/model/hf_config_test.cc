#include "engine/model/hf_config.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

// Abridged from meta-llama/Meta-Llama-3-8B.
constexpr const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})";

// From Qwen/Qwen2.5-7B-Instruct.
constexpr const char* kQwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

// From mistralai/Mistral-7B-v0.1.
constexpr const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";

// From meta-llama/Llama-3.1-8B.
constexpr const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// From Qwen/Qwen3-0.6B: head_dim 128 with hidden_size 1024 over 16 heads.
constexpr const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

// kQwen3 with `rope_scaling` set to `scaling` (JSON text).
std::string qwen3_with_scaling(const std::string& scaling) {
  std::string text = kQwen3;
  text.replace(text.find("\"rope_scaling\": null"), 20, "\"rope_scaling\": " + scaling);
  return text;
}

TEST(HfConfig, Llama31RopeScaling) {
  auto c = parse_hf_config(kLlama31, "llama3.1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_seq_len, 131072);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
}

TEST(HfConfig, Qwen3) {
  auto c = parse_hf_config(kQwen3, "qwen3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen3");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 2048);  // Not hidden_size.
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->max_seq_len, 40960);
  EXPECT_FLOAT_EQ(c->rope_theta, 1000000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
}

// Each scaling type under "rope_type", the older "type", or both; transformers v5's
// rope_parameters, which carries rope_theta too.
TEST(HfConfig, RopeScalingTypesAndKeys) {
  struct Case {
    std::string scaling;
    RopeScalingType type;
  };
  const Case cases[] = {
      {R"({"type": "linear", "factor": 2.0})", RopeScalingType::kLinear},
      {R"({"rope_type": "dynamic", "factor": 2.0})", RopeScalingType::kDynamic},
      {R"({"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})",
       RopeScalingType::kYarn},
      {R"({"rope_type": "default"})", RopeScalingType::kNone},
  };
  for (const Case& k : cases) {
    auto c = parse_hf_config(qwen3_with_scaling(k.scaling), "cfg");
    ASSERT_TRUE(c.ok()) << c.status() << k.scaling;
    EXPECT_EQ(c->rope_scaling.type, k.type) << k.scaling;
  }
  auto yarn = parse_hf_config(qwen3_with_scaling(
      R"({"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 16,
          "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false, "attention_factor": null})"), "cfg");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope_scaling.factor, 40.0);
  EXPECT_EQ(yarn->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(yarn->rope_scaling.beta_fast, 16.0);
  EXPECT_EQ(yarn->rope_scaling.beta_slow, 2.0);
  EXPECT_EQ(yarn->rope_scaling.mscale, 0.707);
  EXPECT_EQ(yarn->rope_scaling.mscale_all_dim, 1.0);
  EXPECT_FALSE(yarn->rope_scaling.truncate);
  EXPECT_FALSE(yarn->rope_scaling.attention_factor.has_value());

  std::string v5 = kLlama31;
  v5.replace(v5.find("\"rope_scaling\""), 14, "\"rope_parameters\"");
  v5.replace(v5.find("\"rope_type\": \"llama3\""), 21, "\"rope_type\": \"llama3\", \"rope_theta\": 250000.0");
  auto c = parse_hf_config(v5, "v5");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_theta, 250000.0f);
}

// What the engine cannot honour is refused by name, never ignored.
TEST(HfConfig, RopeScalingRefusals) {
  struct Case {
    std::string scaling;
    absl::StatusCode code;
    const char* names;
  };
  const Case cases[] = {
      {R"({"rope_type": "longrope", "long_factor": [1], "short_factor": [1]})", absl::StatusCode::kUnimplemented, "longrope"},
      {R"({"type": "su", "long_factor": [1], "short_factor": [1]})", absl::StatusCode::kUnimplemented, "su"},
      {R"({"rope_type": "linear", "factor": 2.0, "long_factor": [1]})", absl::StatusCode::kUnimplemented, "long_factor"},
      {R"({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192})",
       absl::StatusCode::kInvalidArgument, "needs low_freq_factor"},
      {R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1, "high_freq_factor": 4})",
       absl::StatusCode::kInvalidArgument, "needs original_max_position_embeddings"},
      {R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4, "high_freq_factor": 1,
           "original_max_position_embeddings": 8192})", absl::StatusCode::kInvalidArgument, "high_freq_factor"},
      {R"({"rope_type": "linear"})", absl::StatusCode::kInvalidArgument, "factor"},
      {R"({"rope_type": "linear", "factor": 0.5})", absl::StatusCode::kInvalidArgument, "factor"},
      {R"({"type": "linear", "rope_type": "dynamic", "factor": 2})", absl::StatusCode::kInvalidArgument, "two types"},
      {R"({"factor": 2})", absl::StatusCode::kInvalidArgument, "rope_type"},
      {R"("linear")", absl::StatusCode::kInvalidArgument, "object"},
  };
  for (const Case& k : cases) {
    auto c = parse_hf_config(qwen3_with_scaling(k.scaling), "cfg");
    EXPECT_EQ(c.status().code(), k.code) << k.scaling << " " << c.status();
    EXPECT_NE(c.status().message().find(k.names), std::string::npos) << c.status();
  }
  std::string mlp_bias = kLlama31;
  mlp_bias.replace(mlp_bias.find("\"mlp_bias\": false"), 17, "\"mlp_bias\": true");
  auto m = parse_hf_config(mlp_bias, "cfg");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("mlp_bias"), std::string::npos);
  std::string partial = kQwen3;
  partial.replace(partial.find("\"head_dim\""), 0, "\"partial_rotary_factor\": 0.5, ");
  auto p = parse_hf_config(partial, "cfg");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(p.status().message().find("partial_rotary_factor"), std::string::npos);
}

TEST(HfConfig, Llama3) {
  auto c = parse_hf_config(kLlama3, "llama3");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->dim, 4096);
  EXPECT_EQ(c->hidden_dim, 14336);
  EXPECT_EQ(c->n_layers, 32);
  EXPECT_EQ(c->n_heads, 32);
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_seq_len, 8192);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-5f);
  EXPECT_EQ(c->rope_style, RopeStyle::kRotateHalf);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->tie_embeddings);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->bos_id, 128000);
  EXPECT_EQ(c->eos_ids, std::vector<int>{128001});
}

TEST(HfConfig, Qwen2) {
  auto c = parse_hf_config(kQwen25, "qwen");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->dim, 3584);
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
  EXPECT_EQ(c->eos_ids, std::vector<int>{151645});
}

TEST(HfConfig, MistralSlidingWindow) {
  auto c = parse_hf_config(kMistral, "mistral");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "mistral");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->qkv_bias);
}

TEST(HfConfig, DefaultsAndLists) {
  auto c = parse_hf_config(R"({"model_type":"llama","hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":300,"max_position_embeddings":256,
      "eos_token_id":[2,7],"attention_bias":true,"tie_word_embeddings":true})", "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->n_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->eos_ids, (std::vector<int>{2, 7}));
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tie_embeddings);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
}

TEST(HfConfig, Errors) {
  auto code = [](const std::string& text) { return parse_hf_config(text, "cfg").status().code(); };
  EXPECT_EQ(code("{"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(R"({"architectures":["GPT2LMHeadModel"]})"), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(code(R"({})"), absl::StatusCode::kUnimplemented);
  std::string llama = kLlama3;
  auto without = [&](const std::string& field) {
    std::string t = llama;
    size_t at = t.find("\"" + field + "\"");
    t.replace(at, 1, "\"x_");
    return t;
  };
  auto missing = parse_hf_config(without("hidden_size"), "cfg");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("hidden_size"), std::string::npos);
  EXPECT_NE(missing.status().message().find("cfg"), std::string::npos);
  EXPECT_FALSE(parse_hf_config(without("vocab_size"), "cfg").ok());
  EXPECT_FALSE(parse_hf_config(without("num_hidden_layers"), "cfg").ok());
  std::string bad_type = llama;
  bad_type.replace(bad_type.find("4096"), 4, "\"4096\"");
  EXPECT_FALSE(parse_hf_config(bad_type, "cfg").ok());
  std::string scaled = llama;
  scaled.replace(scaled.find("\"rope_scaling\": null"), 20, R"("rope_scaling": {"type":"longrope"})");
  EXPECT_EQ(parse_hf_config(scaled, "cfg").status().code(), absl::StatusCode::kUnimplemented);
  std::string heads = llama;
  heads.replace(heads.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  EXPECT_FALSE(parse_hf_config(heads, "cfg").ok());
}

TEST(HfConfig, GenerationConfigAddsEos) {
  auto c = parse_hf_config(kLlama3, "llama3");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(merge_generation_config(R"({"bos_token_id":128000,"eos_token_id":[128001,128009]})", "gen", *c).ok());
  EXPECT_EQ(c->eos_ids, (std::vector<int>{128001, 128009}));
  ASSERT_TRUE(merge_generation_config(R"({"do_sample":true})", "gen", *c).ok());
  EXPECT_EQ(c->eos_ids.size(), 2u);
  EXPECT_FALSE(merge_generation_config(R"({"eos_token_id":999999999})", "gen", *c).ok());
  EXPECT_FALSE(merge_generation_config("{", "gen", *c).ok());
}

TEST(HfConfig, WriteThenParse) {
  const std::string yarn = qwen3_with_scaling(
      R"({"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 16,
          "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false, "attention_factor": 1.25})");
  const std::string dynamic = qwen3_with_scaling(R"({"type": "dynamic", "factor": 2.0})");
  for (const std::string& text : {std::string(kLlama3), std::string(kQwen25), std::string(kMistral),
                                  std::string(kLlama31), std::string(kQwen3), yarn, dynamic}) {
    auto c = parse_hf_config(text, "in");
    ASSERT_TRUE(c.ok());
    auto json = hf_config_json(*c, DType::kBF16);
    ASSERT_TRUE(json.ok()) << json.status();
    auto back = parse_hf_config(*json, "out");
    ASSERT_TRUE(back.ok()) << back.status() << *json;
    EXPECT_EQ(back->architecture, c->architecture);
    EXPECT_EQ(back->dim, c->dim);
    EXPECT_EQ(back->n_kv_heads, c->n_kv_heads);
    EXPECT_EQ(back->qkv_bias, c->qkv_bias);
    EXPECT_EQ(back->sliding_window, c->sliding_window);
    EXPECT_EQ(back->eos_ids, c->eos_ids);
    EXPECT_FLOAT_EQ(back->rope_theta, c->rope_theta);
    EXPECT_EQ(back->rope_scaling, c->rope_scaling);
    EXPECT_EQ(back->qk_norm, c->qk_norm);
    EXPECT_EQ(back->head_dim, c->head_dim);
    EXPECT_EQ(back->tie_embeddings, c->tie_embeddings);
    EXPECT_EQ(back->max_seq_len, c->max_seq_len);
  }
  ModelConfig adjacent;
  adjacent.rope_style = RopeStyle::kAdjacentPairs;
  EXPECT_FALSE(hf_config_json(adjacent, DType::kF32).ok());
}

}  // namespace
}  // namespace pdserve::engine
