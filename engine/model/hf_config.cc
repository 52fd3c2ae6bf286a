#include "engine/model/hf_config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model/generation_config.h"

namespace pdserve::engine {
namespace {

using json = nlohmann::json;

struct Arch {
  const char* model_type;
  const char* class_name;
};
constexpr Arch kArchs[] = {{"llama", "LlamaForCausalLM"},
                           {"mistral", "MistralForCausalLM"},
                           {"qwen2", "Qwen2ForCausalLM"},
                           {"qwen3", "Qwen3ForCausalLM"}};

StatusOr<std::string> architecture_of(const json& j) {
  std::string seen;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    seen = j["architectures"][0].get<std::string>();
    for (const Arch& a : kArchs)
      if (seen == a.class_name) return std::string(a.model_type);
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    seen = j["model_type"].get<std::string>();
    for (const Arch& a : kArchs)
      if (seen == a.model_type) return std::string(a.model_type);
  }
  return absl::UnimplementedError(absl::StrCat(
      "unsupported architecture '", seen.empty() ? "(none given)" : seen,
      "'; supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"));
}

// Reads an integer field; `fallback` < 0 makes it required.
StatusOr<int> get_int(const json& j, const char* key, int fallback);

// pdserve's extension for mixed-geometry models: "pdserve_layer_attention", one object per
// layer with n_kv_heads, head_dim, window, kv_layout ("separate"|"interleaved"), kv_order
// ("token_major"|"head_major"|"head_outer"; head_outer when absent), index_head_dim, index_top_k.
StatusOr<std::vector<LayerAttention>> layer_attention_of(const json& j) {
  std::vector<LayerAttention> out;
  if (!j.contains("pdserve_layer_attention")) return out;
  const json& layers = j["pdserve_layer_attention"];
  if (!layers.is_array()) return absl::InvalidArgumentError("pdserve_layer_attention must be an array");
  for (const json& l : layers) {
    if (!l.is_object()) return absl::InvalidArgumentError("pdserve_layer_attention entries must be objects");
    LayerAttention a;
    PD_ASSIGN_OR_RETURN(a.n_kv_heads, get_int(l, "n_kv_heads", -1));
    PD_ASSIGN_OR_RETURN(a.head_dim, get_int(l, "head_dim", -1));
    PD_ASSIGN_OR_RETURN(a.window, get_int(l, "window", 0));
    PD_ASSIGN_OR_RETURN(a.index_head_dim, get_int(l, "index_head_dim", 0));
    PD_ASSIGN_OR_RETURN(a.index_top_k, get_int(l, "index_top_k", 0));
    const std::string layout = l.value("kv_layout", "separate");
    const std::string order = l.value("kv_order", layout == "separate" ? "head_outer" : "token_major");
    if (layout != "separate" && layout != "interleaved")
      return absl::InvalidArgumentError(absl::StrCat("unknown kv_layout \"", layout, "\""));
    a.kv_layout = layout == "separate" ? KvLayout::kSeparate : KvLayout::kInterleaved;
    if (order == "token_major") a.kv_order = KvOrder::kTokenMajor;
    else if (order == "head_major") a.kv_order = KvOrder::kHeadMajor;
    else if (order == "head_outer") a.kv_order = KvOrder::kHeadOuter;
    else return absl::InvalidArgumentError(absl::StrCat("unknown kv_order \"", order, "\""));
    if (a.kv_order == KvOrder::kHeadOuter && a.kv_layout != KvLayout::kSeparate)
      return absl::InvalidArgumentError("kv_order \"head_outer\" needs kv_layout \"separate\"");
    out.push_back(a);
  }
  return out;
}

StatusOr<int> get_int(const json& j, const char* key, int fallback = -1) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback >= 0) return fallback;
    return absl::InvalidArgumentError(absl::StrCat("missing field ", key));
  }
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
    return absl::InvalidArgumentError(absl::StrCat("field ", key, " is not a non-negative integer"));
  return v.get<int>();
}

StatusOr<float> get_float(const json& j, const char* key, float fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return absl::InvalidArgumentError(absl::StrCat("field ", key, " is not a number"));
  return j[key].get<float>();
}

StatusOr<bool> get_bool(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) return absl::InvalidArgumentError(absl::StrCat("field ", key, " is not a boolean"));
  return j[key].get<bool>();
}

struct RopeScalingName {
  const char* name;
  RopeScalingType type;
};
constexpr RopeScalingName kRopeScalingNames[] = {{"default", RopeScalingType::kNone},
                                                 {"linear", RopeScalingType::kLinear},
                                                 {"dynamic", RopeScalingType::kDynamic},
                                                 {"yarn", RopeScalingType::kYarn},
                                                 {"llama3", RopeScalingType::kLlama3}};

StatusOr<double> get_double(const json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) return absl::InvalidArgumentError(absl::StrCat("rope_scaling ", key, " is not a number"));
  return j[key].get<double>();
}

// config.json's rope_scaling (or transformers v5's rope_parameters, which also carries
// rope_theta): the type under "rope_type" or the older "type", and the fields that type uses.
// Unknown types and fields are refused, not ignored: each one changes the positions.
StatusOr<RopeScaling> rope_scaling_of(const json& r, const char* key, float& theta) {
  if (!r.is_object()) return absl::InvalidArgumentError(absl::StrCat(key, " must be an object"));
  std::string name;
  for (const char* type_key : {"rope_type", "type"}) {
    if (!r.contains(type_key)) continue;
    if (!r[type_key].is_string()) return absl::InvalidArgumentError(absl::StrCat(key, " ", type_key, " is not a string"));
    const std::string given = r[type_key].get<std::string>();
    if (!name.empty() && given != name)
      return absl::InvalidArgumentError(absl::StrCat(key, " gives two types, \"", name, "\" and \"", given, "\""));
    name = given;
  }
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(key, " has no rope_type"));
  RopeScaling s;
  const RopeScalingName* known = nullptr;
  for (const RopeScalingName& n : kRopeScalingNames)
    if (name == n.name) known = &n;
  if (!known)
    return absl::UnimplementedError(absl::StrCat(key, " type \"", name,
                                                 "\" is not supported (supported: default, linear, dynamic, yarn, llama3)"));
  s.type = known->type;
  std::vector<std::string> allowed = {"rope_type", "type", "rope_theta"};
  auto allow = [&](std::initializer_list<const char*> keys) { allowed.insert(allowed.end(), keys.begin(), keys.end()); };
  if (s.type != RopeScalingType::kNone) {
    allow({"factor"});
    if (!r.contains("factor")) return absl::InvalidArgumentError(absl::StrCat(key, " type ", name, " needs a factor"));
    PD_ASSIGN_OR_RETURN(s.factor, get_double(r, "factor", 1.0));
  }
  if (s.type == RopeScalingType::kLlama3) {
    for (const char* needed : {"original_max_position_embeddings", "low_freq_factor", "high_freq_factor"})
      if (!r.contains(needed) || r[needed].is_null())
        return absl::InvalidArgumentError(absl::StrCat(key, " type llama3 needs ", needed));
    allow({"original_max_position_embeddings", "low_freq_factor", "high_freq_factor"});
    PD_ASSIGN_OR_RETURN(s.original_max_position_embeddings, get_int(r, "original_max_position_embeddings", 0));
    PD_ASSIGN_OR_RETURN(s.low_freq_factor, get_double(r, "low_freq_factor", 0.0));
    PD_ASSIGN_OR_RETURN(s.high_freq_factor, get_double(r, "high_freq_factor", 0.0));
  }
  if (s.type == RopeScalingType::kYarn) {
    allow({"original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
           "truncate"});
    PD_ASSIGN_OR_RETURN(s.original_max_position_embeddings, get_int(r, "original_max_position_embeddings", 0));
    // HF reads beta_fast/beta_slow with `or`: an explicit 0 (or null) takes the default too.
    PD_ASSIGN_OR_RETURN(s.beta_fast, get_double(r, "beta_fast", 32.0));
    PD_ASSIGN_OR_RETURN(s.beta_slow, get_double(r, "beta_slow", 1.0));
    if (s.beta_fast == 0.0) s.beta_fast = 32.0;
    if (s.beta_slow == 0.0) s.beta_slow = 1.0;
    if (r.contains("attention_factor") && !r["attention_factor"].is_null()) {
      PD_ASSIGN_OR_RETURN(double f, get_double(r, "attention_factor", 1.0));
      s.attention_factor = f;
    }
    PD_ASSIGN_OR_RETURN(s.mscale, get_double(r, "mscale", 0.0));
    PD_ASSIGN_OR_RETURN(s.mscale_all_dim, get_double(r, "mscale_all_dim", 0.0));
    if (r.contains("truncate") && !r["truncate"].is_boolean())
      return absl::InvalidArgumentError(absl::StrCat(key, " truncate is not a boolean"));
    s.truncate = r.value("truncate", true);
  }
  for (const auto& item : r.items())
    if (std::find(allowed.begin(), allowed.end(), item.key()) == allowed.end())
      return absl::UnimplementedError(absl::StrCat(key, " field \"", item.key(), "\" is not supported for type ", name));
  if (r.contains("rope_theta")) {
    if (!r["rope_theta"].is_number()) return absl::InvalidArgumentError(absl::StrCat(key, " rope_theta is not a number"));
    theta = r["rope_theta"].get<float>();
  }
  PD_RETURN_IF_ERROR(s.validate());
  return s;
}

// eos_token_id as an int or a list of ints, each inside the vocabulary.
StatusOr<std::vector<int>> eos_ids_of(const json& j, int vocab_size) {
  std::vector<int> ids;
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return ids;
  const json& e = j["eos_token_id"];
  for (const json& id : e.is_array() ? e : json::array({e})) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
      return absl::InvalidArgumentError(absl::StrCat("eos_token_id ", id.dump(), " is not a token id below ", vocab_size));
    ids.push_back(id.get<int>());
  }
  return ids;
}

StatusOr<ModelConfig> parse(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  ModelConfig c;
  PD_ASSIGN_OR_RETURN(c.architecture, architecture_of(j));
  PD_ASSIGN_OR_RETURN(c.dim, get_int(j, "hidden_size"));
  PD_ASSIGN_OR_RETURN(c.hidden_dim, get_int(j, "intermediate_size"));
  PD_ASSIGN_OR_RETURN(c.n_layers, get_int(j, "num_hidden_layers"));
  PD_ASSIGN_OR_RETURN(c.n_heads, get_int(j, "num_attention_heads"));
  PD_ASSIGN_OR_RETURN(c.n_kv_heads, get_int(j, "num_key_value_heads", c.n_heads));
  if (c.n_heads == 0) return absl::InvalidArgumentError("num_attention_heads is 0");
  PD_ASSIGN_OR_RETURN(c.head_dim, get_int(j, "head_dim", c.dim / c.n_heads));
  PD_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, "vocab_size"));
  PD_ASSIGN_OR_RETURN(c.max_seq_len, get_int(j, "max_position_embeddings"));
  PD_ASSIGN_OR_RETURN(c.rope_theta, get_float(j, "rope_theta", 10000.0f));
  PD_ASSIGN_OR_RETURN(c.rms_eps, get_float(j, "rms_norm_eps", 1e-6f));
  PD_ASSIGN_OR_RETURN(c.tie_embeddings, get_bool(j, "tie_word_embeddings", false));
  PD_ASSIGN_OR_RETURN(bool bias, get_bool(j, "attention_bias", false));
  c.qkv_bias = bias || c.architecture == "qwen2";
  c.qk_norm = c.architecture == "qwen3";
  c.rope_style = RopeStyle::kRotateHalf;

  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return absl::UnimplementedError(absl::StrCat("hidden_act ", j["hidden_act"].dump(), " (only silu is supported)"));
  PD_ASSIGN_OR_RETURN(bool mlp_bias, get_bool(j, "mlp_bias", false));
  if (mlp_bias) return absl::UnimplementedError("mlp_bias true (MLP projections with biases) is not supported");
  PD_ASSIGN_OR_RETURN(double rotary_fraction, get_float(j, "partial_rotary_factor", 1.0f));
  if (rotary_fraction != 1.0)
    return absl::UnimplementedError(absl::StrCat("partial_rotary_factor ", rotary_fraction, " (only 1: RoPE over the whole head)"));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    PD_ASSIGN_OR_RETURN(c.rope_scaling, rope_scaling_of(j[key], key, c.rope_theta));
  }

  // Mistral slides whenever sliding_window is set; Qwen2 and Qwen3 only with use_sliding_window,
  // and then only in layers from max_window_layers on.
  PD_ASSIGN_OR_RETURN(int window, get_int(j, "sliding_window", 0));
  PD_ASSIGN_OR_RETURN(bool use_window, get_bool(j, "use_sliding_window", c.architecture == "mistral"));
  if (use_window && window > 0) {
    if (c.architecture == "qwen2" || c.architecture == "qwen3") {
      PD_ASSIGN_OR_RETURN(int first, get_int(j, "max_window_layers", c.n_layers));
      if (first >= c.n_layers) window = 0;
      else if (first > 0)
        return absl::UnimplementedError(absl::StrCat(
            "sliding window in layers ", first, "+ only (max_window_layers) is not supported"));
    }
    c.sliding_window = window;
  }

  PD_ASSIGN_OR_RETURN(c.bos_id, get_int(j, "bos_token_id", 1));
  PD_ASSIGN_OR_RETURN(c.eos_ids, eos_ids_of(j, c.vocab_size));
  if (c.eos_ids.empty()) c.eos_ids = {2};
  PD_ASSIGN_OR_RETURN(c.layer_attention, layer_attention_of(j));
  PD_RETURN_IF_ERROR(c.validate());
  return c;
}

}  // namespace

StatusOr<ModelConfig> parse_hf_config(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, " is not valid JSON"));
  try {
    auto c = parse(j);
    if (!c.ok()) return Status(c.status().code(), absl::StrCat(source, ": ", c.status().message()));
    return c;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

Status merge_generation_config(const std::string& text, const std::string& source, ModelConfig& config) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(source, " is not a JSON object"));
  try {
    auto ids = eos_ids_of(j, config.vocab_size);
    if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", ids.status().message()));
    for (int id : *ids)
      if (std::find(config.eos_ids.begin(), config.eos_ids.end(), id) == config.eos_ids.end())
        config.eos_ids.push_back(id);
    PD_ASSIGN_OR_RETURN(config.generation_defaults, parse_generation_defaults(text, source));
    return absl::OkStatus();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

StatusOr<ModelConfig> read_hf_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path);
}

StatusOr<std::string> hf_config_json(const ModelConfig& c, DType dtype) {
  if (c.rope_style != RopeStyle::kRotateHalf)
    return absl::InvalidArgumentError("HF checkpoints use rotate-half RoPE; permute adjacent-pair weights first");
  const Arch* arch = nullptr;
  for (const Arch& a : kArchs)
    if (c.architecture == a.model_type) arch = &a;
  if (!arch) return absl::InvalidArgumentError(absl::StrCat("unknown architecture ", c.architecture));
  nlohmann::ordered_json j;
  j["architectures"] = {arch->class_name};
  j["model_type"] = arch->model_type;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type != RopeScalingType::kNone) {
    const RopeScaling& r = c.rope_scaling;
    nlohmann::ordered_json s;
    for (const RopeScalingName& n : kRopeScalingNames)
      if (n.type == r.type) s["rope_type"] = n.name;
    s["factor"] = r.factor;
    if (r.type == RopeScalingType::kLlama3 || (r.type == RopeScalingType::kYarn && r.original_max_position_embeddings > 0))
      s["original_max_position_embeddings"] = r.original_max_position_embeddings;
    if (r.type == RopeScalingType::kLlama3) {
      s["low_freq_factor"] = r.low_freq_factor;
      s["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.type == RopeScalingType::kYarn) {
      s["beta_fast"] = r.beta_fast;
      s["beta_slow"] = r.beta_slow;
      if (r.attention_factor) s["attention_factor"] = *r.attention_factor;
      if (r.mscale != 0.0) s["mscale"] = r.mscale;
      if (r.mscale_all_dim != 0.0) s["mscale_all_dim"] = r.mscale_all_dim;
      s["truncate"] = r.truncate;
    }
    j["rope_scaling"] = s;
  }
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  // Qwen2 always has q/k/v biases, and its loaders do not read attention_bias.
  if (c.architecture != "qwen2") j["attention_bias"] = c.qkv_bias;
  else if (!c.qkv_bias) return absl::InvalidArgumentError("qwen2 models always have q/k/v biases");
  if (c.qk_norm != (c.architecture == "qwen3"))
    return absl::InvalidArgumentError("per-head q/k norms are Qwen3's, and Qwen3 always has them");
  if (c.architecture == "qwen2" || c.architecture == "qwen3") {
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.max_seq_len;
    j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.n_layers;
  } else if (c.sliding_window > 0) {
    if (c.architecture != "mistral")
      return absl::InvalidArgumentError("a sliding window needs the mistral, qwen2 or qwen3 architecture");
    j["sliding_window"] = c.sliding_window;
  }
  for (const LayerAttention& a : c.layer_attention) {
    j["pdserve_layer_attention"].push_back(
        {{"n_kv_heads", a.n_kv_heads}, {"head_dim", a.head_dim}, {"window", a.window},
         {"kv_layout", a.kv_layout == KvLayout::kSeparate ? "separate" : "interleaved"},
         {"kv_order", a.kv_order == KvOrder::kTokenMajor  ? "token_major"
                      : a.kv_order == KvOrder::kHeadMajor ? "head_major"
                                                          : "head_outer"},
         {"index_head_dim", a.index_head_dim}, {"index_top_k", a.index_top_k}});
  }
  j["bos_token_id"] = c.bos_id;
  if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids[0];
  else j["eos_token_id"] = c.eos_ids;
  j["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  return j.dump(2) + "\n";
}

}  // namespace pdserve::engine
