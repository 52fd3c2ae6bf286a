#include "tests/engine/reference_hf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "reference_hf: %s\n", what.c_str());
  std::abort();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The RoPE table of config.json, transcribed from transformers' modeling_rope_utils
// (_compute_default / linear / dynamic / yarn / llama3 parameters). Dynamic NTK is taken in the
// static form serving engines use (vLLM): HF's frequencies at length max_position_embeddings *
// factor, for every position.
void rope_table(const json& config, int head_dim, std::vector<double>& inv_freq, double& attention_scale) {
  double base = config.value("rope_theta", 10000.0);
  const int max_pos = config.at("max_position_embeddings").get<int>();
  json scaling = config.contains("rope_scaling") ? config["rope_scaling"] : json();
  const std::string type = scaling.is_object() ? scaling.value("rope_type", scaling.value("type", "default")) : "default";
  const int d = head_dim;
  auto default_freqs = [&](double theta) {
    std::vector<double> f;
    for (int j = 0; j < d; j += 2) f.push_back(1.0 / std::pow(theta, double(j) / d));
    return f;
  };
  attention_scale = 1.0;
  if (type == "default") {
    inv_freq = default_freqs(base);
  } else if (type == "linear") {
    inv_freq = default_freqs(base);
    for (double& f : inv_freq) f /= scaling.at("factor").get<double>();
  } else if (type == "dynamic") {
    const double factor = scaling.at("factor").get<double>();
    const double seq_len = max_pos * factor;
    base = base * std::pow(factor * seq_len / max_pos - (factor - 1), double(d) / (d - 2));
    inv_freq = default_freqs(base);
  } else if (type == "llama3") {
    const double factor = scaling.at("factor").get<double>();
    const double low = scaling.at("low_freq_factor").get<double>(), high = scaling.at("high_freq_factor").get<double>();
    const double old_context = scaling.at("original_max_position_embeddings").get<double>();
    const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
    for (double f : default_freqs(base)) {
      const double wavelen = 2 * M_PI / f;
      double scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const double smooth = (old_context / wavelen - low) / (high - low);
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) scaled = (1 - smooth) * scaled / factor + smooth * scaled;
      inv_freq.push_back(scaled);
    }
  } else if (type == "yarn") {
    const double factor = scaling.at("factor").get<double>();
    const int original = scaling.value("original_max_position_embeddings", max_pos);
    auto get_mscale = [](double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; };
    const double mscale = scaling.value("mscale", 0.0), mscale_all_dim = scaling.value("mscale_all_dim", 0.0);
    if (scaling.contains("attention_factor") && !scaling["attention_factor"].is_null())
      attention_scale = scaling["attention_factor"].get<double>();
    else if (mscale != 0 && mscale_all_dim != 0)
      attention_scale = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
    else
      attention_scale = get_mscale(factor, 1.0);
    const double beta_fast = scaling.value("beta_fast", 32.0), beta_slow = scaling.value("beta_slow", 1.0);
    auto correction_dim = [&](double rotations) {
      return d * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (scaling.value("truncate", true)) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, double(d - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < d / 2; ++i) {
      const double pos_freq = std::pow(base, 2.0 * i / d);
      const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (factor * pos_freq);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double extrapolation_factor = 1 - ramp;
      inv_freq.push_back(interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor);
    }
  } else {
    fail("rope type " + type + " is not in the reference");
  }
}

// model.safetensors: an 8-byte little-endian header length, a JSON header, the data.
std::map<std::string, std::vector<double>> read_safetensors(const std::string& path) {
  const std::string file = read_file(path);
  if (file.size() < 8) fail(path + " is too short");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  const json header = json::parse(file.substr(8, header_len));
  const char* data = file.data() + 8 + header_len;
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string dtype = t.at("dtype").get<std::string>();
    const size_t begin = t.at("data_offsets")[0].get<size_t>(), end = t.at("data_offsets")[1].get<size_t>();
    std::vector<double>& v = out[name];
    if (dtype == "F32") {
      for (size_t at = begin; at < end; at += 4) {
        float f;
        std::memcpy(&f, data + at, 4);
        v.push_back(f);
      }
    } else if (dtype == "BF16") {
      for (size_t at = begin; at < end; at += 2) {
        uint16_t h;
        std::memcpy(&h, data + at, 2);
        const uint32_t bits = uint32_t(h) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        v.push_back(f);
      }
    } else {
      fail("tensor " + name + " has dtype " + dtype + ", not in the reference");
    }
  }
  return out;
}

}  // namespace

ReferenceHf::ReferenceHf(const std::string& dir) {
  const json c = json::parse(read_file(dir + "/config.json"));
  const std::string type = c.at("model_type").get<std::string>();
  if (type != "llama" && type != "qwen2" && type != "qwen3") fail("model_type " + type + " is not in the reference");
  if (c.contains("pdserve_layer_attention") || c.value("use_sliding_window", false) ||
      (type != "qwen2" && type != "qwen3" && c.contains("sliding_window") && !c["sliding_window"].is_null()))
    fail("sliding or per-layer attention is not in the reference");
  dim_ = c.at("hidden_size").get<int>();
  hidden_ = c.at("intermediate_size").get<int>();
  layers_ = c.at("num_hidden_layers").get<int>();
  heads_ = c.at("num_attention_heads").get<int>();
  kv_heads_ = c.value("num_key_value_heads", heads_);
  head_dim_ = c.contains("head_dim") ? c["head_dim"].get<int>() : dim_ / heads_;
  vocab_ = c.at("vocab_size").get<int>();
  eps_ = c.at("rms_norm_eps").get<double>();
  bias_ = type == "qwen2" || c.value("attention_bias", false);
  qk_norm_ = type == "qwen3";
  tied_ = c.value("tie_word_embeddings", false);
  rope_table(c, head_dim_, inv_freq_, attention_scale_);
  tensors_ = read_safetensors(dir + "/model.safetensors");
}

const std::vector<double>& ReferenceHf::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("no tensor " + name);
  return it->second;
}

// y = W x (+ b), W stored [out][in] as nn.Linear keeps it.
std::vector<double> ReferenceHf::linear(const std::string& weight, const std::vector<double>& x,
                                        const std::string& bias) const {
  const std::vector<double>& w = tensor(weight);
  const size_t in = x.size(), out = w.size() / in;
  std::vector<double> y(out, 0.0);
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
    if (!bias.empty()) y[o] += tensor(bias)[o];
  }
  return y;
}

std::vector<double> ReferenceHf::rms_norm(const std::vector<double>& x, const double* w) const {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps_);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * (x[i] * inv);
  return y;
}

std::vector<std::vector<float>> ReferenceHf::logits(const std::vector<int>& tokens) const {
  const int n = int(tokens.size()), d = head_dim_, half = d / 2, group = heads_ / kv_heads_;
  const std::vector<double>& embed = tensor("model.embed_tokens.weight");
  std::vector<std::vector<double>> x(n);
  for (int t = 0; t < n; ++t) x[t].assign(embed.begin() + int64_t(tokens[t]) * dim_, embed.begin() + int64_t(tokens[t] + 1) * dim_);
  // HF's apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, rotate_half(q) = [-q2, q1], with
  // cos/sin = cat(freqs, freqs) scaled by the attention factor.
  auto rotate = [&](double* head, int pos) {
    std::vector<double> rotated(d);
    for (int j = 0; j < d; ++j) {
      const double angle = pos * inv_freq_[j % half];
      const double cos = std::cos(angle) * attention_scale_, sin = std::sin(angle) * attention_scale_;
      const double rotate_half = j < half ? -head[j + half] : head[j - half];
      rotated[j] = head[j] * cos + rotate_half * sin;
    }
    std::copy(rotated.begin(), rotated.end(), head);
  };
  for (int l = 0; l < layers_; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const std::vector<double> h = rms_norm(x[t], tensor(p + "input_layernorm.weight").data());
      q[t] = linear(p + "self_attn.q_proj.weight", h, bias_ ? p + "self_attn.q_proj.bias" : "");
      k[t] = linear(p + "self_attn.k_proj.weight", h, bias_ ? p + "self_attn.k_proj.bias" : "");
      v[t] = linear(p + "self_attn.v_proj.weight", h, bias_ ? p + "self_attn.v_proj.bias" : "");
      for (int hd = 0; hd < heads_; ++hd) {
        double* head = q[t].data() + hd * d;
        if (qk_norm_) {
          const std::vector<double> normed = rms_norm(std::vector<double>(head, head + d), tensor(p + "self_attn.q_norm.weight").data());
          std::copy(normed.begin(), normed.end(), head);
        }
        rotate(head, t);
      }
      for (int hd = 0; hd < kv_heads_; ++hd) {
        double* head = k[t].data() + hd * d;
        if (qk_norm_) {
          const std::vector<double> normed = rms_norm(std::vector<double>(head, head + d), tensor(p + "self_attn.k_norm.weight").data());
          std::copy(normed.begin(), normed.end(), head);
        }
        rotate(head, t);
      }
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> attn(size_t(heads_) * d, 0.0);
      for (int hd = 0; hd < heads_; ++hd) {
        const int kvh = hd / group;
        std::vector<double> scores(t + 1);
        double top = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int j = 0; j < d; ++j) dot += q[t][hd * d + j] * k[s][kvh * d + j];
          scores[s] = dot / std::sqrt(double(d));
          top = std::max(top, scores[s]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - top));
        for (int s = 0; s <= t; ++s)
          for (int j = 0; j < d; ++j) attn[hd * d + j] += scores[s] / sum * v[s][kvh * d + j];
      }
      const std::vector<double> o = linear(p + "self_attn.o_proj.weight", attn);
      for (int i = 0; i < dim_; ++i) x[t][i] += o[i];
      const std::vector<double> h = rms_norm(x[t], tensor(p + "post_attention_layernorm.weight").data());
      std::vector<double> gate = linear(p + "mlp.gate_proj.weight", h);
      const std::vector<double> up = linear(p + "mlp.up_proj.weight", h);
      for (int i = 0; i < hidden_; ++i) gate[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const std::vector<double> down = linear(p + "mlp.down_proj.weight", gate);
      for (int i = 0; i < dim_; ++i) x[t][i] += down[i];
    }
  }
  std::vector<std::vector<float>> out(n);
  const std::string head = tied_ ? "model.embed_tokens.weight" : "lm_head.weight";
  for (int t = 0; t < n; ++t) {
    const std::vector<double> logits = linear(head, rms_norm(x[t], tensor("model.norm.weight").data()));
    out[t].assign(logits.begin(), logits.end());
  }
  return out;
}

}  // namespace pdserve::testing
