#include "engine/model/make_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_join.h"
#include "engine/model/hf_config.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/model_files.h"
#include "engine/model/safetensors_writer.h"
#include "engine/model_tensors.h"
#include "engine/weights.h"
#include "engine/model/tokenizer_json_writer.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

// How a preset's random weights are drawn.
enum class WeightInit : uint8_t {
  kSmall = 0,  // N(0, 0.02), norm weights 1.
  // N(0, 1/fan-in): unit-variance activations and sharp attention, so positions (RoPE) and KV
  // bytes visibly change the logits; norm weights 1 + N(0, 0.2), so a norm applied with the wrong
  // weights (a q/k norm to the wrong head) does too.
  kFanIn = 1,
};

struct Preset {
  const char* name;
  const char* architecture;
  int dim, hidden_dim, n_layers, n_heads, n_kv_heads, head_dim, vocab, max_seq_len;
  float rope_theta, rms_eps;
  bool qkv_bias, tie;
  int sliding_window;
  RopeScaling rope_scaling = {};
  WeightInit init = WeightInit::kSmall;
};

constexpr RopeScaling llama3_scaling(double factor, double low, double high, int original) {
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = factor;
  s.low_freq_factor = low;
  s.high_freq_factor = high;
  s.original_max_position_embeddings = original;
  return s;
}

constexpr RopeScaling yarn_scaling(double factor, int original) {
  RopeScaling s;
  s.type = RopeScalingType::kYarn;
  s.factor = factor;
  s.original_max_position_embeddings = original;
  return s;
}

constexpr Preset kPresets[] = {
    {"tiny", "llama", 64, 128, 2, 4, 2, 16, 300, 256, 10000.f, 1e-5f, false, false, 0},
    {"tiny-mha", "llama", 64, 128, 2, 4, 4, 16, 300, 256, 10000.f, 1e-5f, false, true, 0},
    {"tiny-qwen2", "qwen2", 64, 128, 2, 4, 2, 16, 300, 256, 1000000.f, 1e-6f, true, false, 0},
    {"tiny-mistral", "mistral", 64, 128, 2, 4, 2, 16, 300, 256, 10000.f, 1e-5f, false, false, 32},
    {"synthetic-100m", "llama", 768, 2048, 12, 12, 4, 64, 32000, 2048, 10000.f, 1e-5f, false, true, 0},
    {"llama-3-8b", "llama", 4096, 14336, 32, 32, 8, 128, 128256, 8192, 500000.f, 1e-5f, false, false, 0},
    {"qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 1000000.f, 1e-6f, true, false, 0},
    // Llama-3.1's RoPE scaling with a 64-token original context: at head dim 16 and theta 10000
    // pair 0 is kept, pairs 1-2 fall in the smoothed band and pairs 3-7 are divided by 8.
    {"tiny-llama31", "llama", 64, 128, 2, 4, 2, 16, 300, 256, 10000.f, 1e-5f, false, false, 0,
     llama3_scaling(8.0, 1.0, 4.0, 64), WeightInit::kFanIn},
    // Qwen3: per-head q/k norms, head_dim 32 != hidden / heads, tied embeddings.
    {"tiny-qwen3", "qwen3", 64, 128, 2, 4, 2, 32, 300, 256, 1000000.f, 1e-6f, false, true, 0, {},
     WeightInit::kFanIn},
    // YaRN x4 over a 64-token original context: pair 0 extrapolated, 1-2 blended, 3-7
    // interpolated, cos/sin scaled by 0.1 ln 4 + 1.
    {"tiny-yarn", "llama", 64, 128, 2, 4, 2, 16, 300, 256, 10000.f, 1e-5f, false, false, 0, yarn_scaling(4.0, 64),
     WeightInit::kFanIn},
};

constexpr float kWeightStd = 0.02f;
constexpr size_t kChunk = 1 << 16;  // Floats generated or copied per write.

// SplitMix64: tiny, fast, and the same on every platform (std::normal_distribution is not).
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]; never 0, so log() below is finite.
  double uniform() { return (double(next() >> 11) + 1.0) * 0x1.0p-53; }
};

// Each tensor's stream depends only on the seed and its name, so tensors are independent of
// the order they are written in.
uint64_t tensor_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return SplitMix{seed ^ h}.next();
}

// The mixed-geometry preset exists to show that a wrongly placed KV byte changes the output,
// so its weights are scaled by 1/sqrt(fan-in) (unit-variance activations, sharp attention)
// rather than the tiny N(0, 0.02) under which attention is nearly uniform and KV barely matters.
constexpr const char* kMixedGeometry = "mixed-geometry";

constexpr double kNoisyNormStd = 0.2;

// Streams N(0, std) values (Box-Muller); norm weights are ones, or with `noisy_norms` 1 + N(0, 0.2).
Status write_random(SafetensorsWriter& w, const TensorSpec& t, uint64_t seed, bool fan_in_scaled, bool noisy_norms) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  const bool norm = t.name.find("norm") != std::string::npos;
  const bool ones = norm && !noisy_norms;
  const double std_dev = norm                                  ? kNoisyNormStd
                         : fan_in_scaled && t.shape.size() == 2 ? 1.0 / std::sqrt(double(t.shape[1]))
                                                                : kWeightStd;
  auto value = [norm](double v) { return norm ? 1.0f + float(v) : float(v); };
  SplitMix rng{tensor_seed(seed, t.name)};
  std::vector<float> buf(kChunk);
  for (int64_t done = 0; done < n;) {
    size_t k = size_t(std::min<int64_t>(n - done, int64_t(kChunk)));
    if (ones) {
      std::fill(buf.begin(), buf.begin() + k, 1.0f);
    } else {
      for (size_t i = 0; i < k; i += 2) {
        double r = std::sqrt(-2.0 * std::log(rng.uniform())) * std_dev;
        double a = 2.0 * M_PI * rng.uniform();
        buf[i] = value(r * std::cos(a));
        if (i + 1 < k) buf[i + 1] = value(r * std::sin(a));
      }
    }
    PD_RETURN_IF_ERROR(w.write_floats(buf.data(), k));
    done += int64_t(k);
  }
  return absl::OkStatus();
}

// The tensors of an HF Llama-family model with config `c`, in file order (a tied classifier
// is not written: the embedding serves).
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c, DType dtype) {
  std::vector<TensorSpec> t;
  for (TensorShape& e : model_tensors(c))
    if (!e.optional) t.push_back({std::move(e.name), dtype, std::move(e.shape)});
  return t;
}

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

Status make_preset(const MakeModelOptions& o, const fs::path& out) {
  PD_ASSIGN_OR_RETURN(ModelConfig c, make_model_preset_config(o.preset));
  std::vector<TensorSpec> tensors = model_tensor_specs(c, o.dtype);
  PD_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(
                                       (out / "model.safetensors").string(), tensors,
                                       {{"format", "pt"}, {"pdserve_preset", o.preset},
                                        {"pdserve_seed", std::to_string(o.seed)}}));
  const Preset* preset = find_preset(o.preset);
  const bool fan_in = o.preset == kMixedGeometry || (preset && preset->init == WeightInit::kFanIn);
  const bool noisy_norms = preset && preset->init == WeightInit::kFanIn;
  for (const TensorSpec& t : tensors) PD_RETURN_IF_ERROR(write_random(*writer, t, o.seed, fan_in, noisy_norms));
  PD_RETURN_IF_ERROR(writer->finish());
  PD_RETURN_IF_ERROR(write_byte_level_tokenizer(out.string()));
  PD_ASSIGN_OR_RETURN(std::string config_json, hf_config_json(c, o.dtype));
  // config.json last: a directory interrupted mid-write is not mistaken for a model.
  return write_text(out / "config.json", config_json);
}

Status export_llama2c(const MakeModelOptions& o, const fs::path& out) {
  PD_ASSIGN_OR_RETURN(Llama2cCheckpoint ckpt, read_llama2c_checkpoint(o.from));
  PD_ASSIGN_OR_RETURN(std::string tokenizer, find_llama2c_tokenizer(fs::path(o.from).parent_path().string()));
  ModelConfig c = ckpt.config;
  c.rope_style = RopeStyle::kRotateHalf;
  std::vector<TensorSpec> tensors = model_tensor_specs(c, o.dtype);
  PD_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(
                                       (out / "model.safetensors").string(), tensors,
                                       {{"format", "pt"}, {"pdserve_exported_from", fs::path(o.from).filename().string()}}));
  const int64_t hd = c.head_dim;
  for (const TensorSpec& t : tensors) {
    PD_ASSIGN_OR_RETURN(TensorView v, ckpt.weights->tensor(t.name));
    const float* src = static_cast<const float*>(v.data);
    const bool permute = t.name.ends_with("q_proj.weight") || t.name.ends_with("k_proj.weight");
    if (!permute) {
      for (int64_t done = 0; done < v.numel(); done += int64_t(kChunk))
        PD_RETURN_IF_ERROR(writer->write_floats(src + done, size_t(std::min<int64_t>(kChunk, v.numel() - done))));
      continue;
    }
    const int64_t rows = v.shape[0], cols = v.shape[1];
    for (int64_t r = 0; r < rows; ++r) {
      // New row r of head h at position i takes old row 2i (first half) or 2i+1 (second half).
      int64_t h = r / hd, i = r % hd;
      int64_t old = h * hd + (i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1);
      PD_RETURN_IF_ERROR(writer->write_floats(src + old * cols, size_t(cols)));
    }
  }
  PD_RETURN_IF_ERROR(writer->finish());
  std::error_code ec;
  fs::copy_file(tokenizer, out / "tokenizer.bin", fs::copy_options::overwrite_existing, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot copy ", tokenizer, ": ", ec.message()));
  PD_ASSIGN_OR_RETURN(std::string config_json, hf_config_json(c, o.dtype));
  return write_text(out / "config.json", config_json);
}

}  // namespace

std::vector<std::string> make_model_presets() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.push_back(p.name);
  out.push_back(kMixedGeometry);
  return out;
}

// Every per-layer cache geometry pdserve supports, in one small model that runs at TP 1-8:
// separate and interleaved K/V, token- and head-major blocks, KV heads 1 to 8 (replicated at
// high TP), head dims 4 to 16, a sliding window, and a key-only index cache that picks the
// blocks its layer attends to.
ModelConfig mixed_geometry_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = 64;
  c.hidden_dim = 128;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 300;
  c.max_seq_len = 256;
  c.rope_style = RopeStyle::kRotateHalf;
  c.bos_id = kByteTokenizerBos;
  c.eos_ids = {kByteTokenizerEos};
  using L = LayerAttention;
  c.layer_attention = {
      L{4, 8, 0, KvLayout::kSeparate, KvOrder::kTokenMajor, 0, 0},
      L{2, 16, 0, KvLayout::kInterleaved, KvOrder::kHeadMajor, 0, 0},
      L{8, 8, 24, KvLayout::kSeparate, KvOrder::kHeadMajor, 0, 0},
      L{1, 8, 0, KvLayout::kInterleaved, KvOrder::kTokenMajor, 8, 2},
      L{4, 4, 0, KvLayout::kSeparate, KvOrder::kHeadOuter, 0, 0},
  };
  return c;
}

StatusOr<ModelConfig> make_model_preset_config(const std::string& preset) {
  if (preset == kMixedGeometry) return mixed_geometry_config();
  if (const Preset* found = find_preset(preset)) {
    const Preset& p = *found;
    ModelConfig c;
    c.architecture = p.architecture;
    c.dim = p.dim;
    c.hidden_dim = p.hidden_dim;
    c.n_layers = p.n_layers;
    c.n_heads = p.n_heads;
    c.n_kv_heads = p.n_kv_heads;
    c.head_dim = p.head_dim;
    c.vocab_size = p.vocab;
    c.max_seq_len = p.max_seq_len;
    c.rope_theta = p.rope_theta;
    c.rope_scaling = p.rope_scaling;
    c.qk_norm = c.architecture == "qwen3";
    c.rms_eps = p.rms_eps;
    c.rope_style = RopeStyle::kRotateHalf;
    c.qkv_bias = p.qkv_bias;
    c.tie_embeddings = p.tie;
    c.sliding_window = p.sliding_window;
    c.bos_id = kByteTokenizerBos;
    c.eos_ids = {kByteTokenizerEos};
    return c;
  }
  return absl::NotFoundError(absl::StrCat("unknown preset '", preset, "'; presets: ",
                                          absl::StrJoin(make_model_presets(), ", ")));
}

Status make_model(const MakeModelOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("make-model needs an output directory");
  if (options.preset.empty() == options.from.empty())
    return absl::InvalidArgumentError("make-model needs exactly one of a preset or --from FILE.bin");
  std::error_code ec;
  const fs::path out(options.out_dir);
  fs::create_directories(out, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", options.out_dir, ": ", ec.message()));
  // Stale files from an earlier, different model in the same directory would be picked up
  // by the loader (an index overriding nothing, a tokenizer.json shadowing tokenizer.bin).
  for (const char* stale : {"model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.bin"})
    fs::remove(out / stale, ec);
  return options.from.empty() ? make_preset(options, out) : export_llama2c(options, out);
}

}  // namespace pdserve::engine
