#include "engine/model/llama2c_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/splitmix64.h"

#include "engine/weights.h"

namespace pdserve::engine {
namespace {

// Bounds well beyond any real model; they exist so that byte counts cannot overflow and a
// garbage header is rejected before any arithmetic on it.
constexpr int32_t kMaxDim = 1 << 17;
constexpr int32_t kMaxLayers = 4096;
constexpr int32_t kMaxVocab = 1 << 22;
constexpr int32_t kMaxSeqLen = 1 << 24;

std::string header_text(const Llama2cHeader& h) {
  return absl::StrCat("dim=", h.dim, " hidden_dim=", h.hidden_dim, " n_layers=", h.n_layers,
                      " n_heads=", h.n_heads, " n_kv_heads=", h.n_kv_heads,
                      " vocab_size=", h.vocab_size, " seq_len=", h.seq_len);
}

}  // namespace

StatusOr<ModelConfig> llama2c_config(const Llama2cHeader& h) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("llama2.c header is not a valid model (", why, "): ", header_text(h)));
  };
  if (h.dim <= 0 || h.dim > kMaxDim) return bad("dim out of range");
  if (h.hidden_dim <= 0 || h.hidden_dim > 8 * kMaxDim) return bad("hidden_dim out of range");
  if (h.n_layers <= 0 || h.n_layers > kMaxLayers) return bad("n_layers out of range");
  if (h.n_heads <= 0 || h.n_heads > h.dim) return bad("n_heads out of range");
  if (h.dim % h.n_heads != 0) return bad("dim is not a multiple of n_heads");
  if (h.n_kv_heads <= 0 || h.n_kv_heads > h.n_heads) return bad("n_kv_heads out of range");
  if (h.n_heads % h.n_kv_heads != 0) return bad("n_heads is not a multiple of n_kv_heads");
  if ((h.dim / h.n_heads) % 2 != 0) return bad("head size is odd");
  if (h.vocab_size == 0 || std::abs(int64_t{h.vocab_size}) > kMaxVocab)
    return bad("vocab_size out of range");
  if (h.seq_len <= 0 || h.seq_len > kMaxSeqLen) return bad("seq_len out of range");

  ModelConfig c;
  c.architecture = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.vocab_size = std::abs(h.vocab_size);
  c.max_seq_len = h.seq_len;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.rope_style = RopeStyle::kAdjacentPairs;
  c.tie_embeddings = h.vocab_size > 0;
  c.bos_id = 1;
  c.eos_ids = {1};  // llama2.c's generate loop stops when the model emits BOS.
  PD_RETURN_IF_ERROR(c.validate());
  return c;
}

uint64_t llama2c_file_size(const Llama2cHeader& h) {
  const uint64_t dim = h.dim, hidden = h.hidden_dim, layers = h.n_layers;
  const uint64_t vocab = std::abs(int64_t{h.vocab_size});
  const uint64_t kv_dim = dim * h.n_kv_heads / h.n_heads;
  const uint64_t head_size = dim / h.n_heads;
  uint64_t floats = vocab * dim;                                  // token embedding
  floats += layers * (dim + dim * dim + 2 * kv_dim * dim + dim * dim + dim);  // attn + norms
  floats += layers * 3 * hidden * dim;                            // w1, w2, w3
  floats += dim;                                                  // final norm
  floats += uint64_t(h.seq_len) * head_size;                      // two legacy RoPE tables
  if (h.vocab_size < 0) floats += vocab * dim;                    // classifier
  return sizeof(Llama2cHeader) + floats * sizeof(float);
}

StatusOr<Llama2cCheckpoint> read_llama2c_checkpoint(const std::string& path) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  Llama2cCheckpoint ckpt;
  if (file->size() < sizeof(Llama2cHeader))
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file->size(), " bytes is too small for a llama2.c checkpoint header"));
  std::memcpy(&ckpt.header, file->data(), sizeof(Llama2cHeader));
  auto config = llama2c_config(ckpt.header);
  if (!config.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  ckpt.config = *std::move(config);
  const Llama2cHeader& h = ckpt.header;
  uint64_t expected = llama2c_file_size(h);
  if (expected != file->size())
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the header (", header_text(h), ") implies ", expected, " bytes but the file has ",
        file->size(), expected > file->size() ? " (truncated?)" : " (trailing data?)"));

  const ModelConfig& c = ckpt.config;
  const int64_t dim = c.dim, hidden = c.hidden_dim, kv_dim = c.kv_dim(), vocab = c.vocab_size;
  auto table = std::make_unique<TensorTable>();
  const float* p = reinterpret_cast<const float*>(file->data() + sizeof(Llama2cHeader));
  // Each array is stacked over layers; `stacked` walks one and names each layer's slice.
  auto take = [&](const std::string& name, std::vector<int64_t> shape) -> Status {
    TensorView v{DType::kF32, std::move(shape), p};
    p += v.numel();
    return table->add(name, std::move(v));
  };
  auto stacked = [&](const std::string& suffix, std::vector<int64_t> shape) -> Status {
    for (int l = 0; l < c.n_layers; ++l) PD_RETURN_IF_ERROR(take(layer_tensor_name(l, suffix), shape));
    return absl::OkStatus();
  };
  PD_RETURN_IF_ERROR(take("model.embed_tokens.weight", {vocab, dim}));
  PD_RETURN_IF_ERROR(stacked("input_layernorm.weight", {dim}));
  PD_RETURN_IF_ERROR(stacked("self_attn.q_proj.weight", {dim, dim}));
  PD_RETURN_IF_ERROR(stacked("self_attn.k_proj.weight", {kv_dim, dim}));
  PD_RETURN_IF_ERROR(stacked("self_attn.v_proj.weight", {kv_dim, dim}));
  PD_RETURN_IF_ERROR(stacked("self_attn.o_proj.weight", {dim, dim}));
  PD_RETURN_IF_ERROR(stacked("post_attention_layernorm.weight", {dim}));
  PD_RETURN_IF_ERROR(stacked("mlp.gate_proj.weight", {hidden, dim}));
  PD_RETURN_IF_ERROR(stacked("mlp.down_proj.weight", {dim, hidden}));
  PD_RETURN_IF_ERROR(stacked("mlp.up_proj.weight", {hidden, dim}));
  PD_RETURN_IF_ERROR(take("model.norm.weight", {dim}));
  p += int64_t{h.seq_len} * c.head_dim;  // Skips the legacy RoPE tables.
  if (c.tie_embeddings) {
    PD_RETURN_IF_ERROR(table->add_alias("lm_head.weight", "model.embed_tokens.weight"));
  } else {
    PD_RETURN_IF_ERROR(take("lm_head.weight", {vocab, dim}));
  }
  table->keep(std::move(file));
  ckpt.weights = std::move(table);
  return ckpt;
}

Status write_random_llama2c_checkpoint(const Llama2cHeader& header, uint64_t seed, const std::string& path) {
  PD_RETURN_IF_ERROR(llama2c_config(header).status());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  out.write(reinterpret_cast<const char*>(&header), sizeof(header));
  const uint64_t dim = header.dim, layers = header.n_layers;
  uint64_t counter = splitmix64(seed);
  std::vector<float> buf(1 << 16);
  // Uniform on [-a, a] has standard deviation a / sqrt(3).
  const float a = 0.02f * std::sqrt(3.0f);
  // n floats: seeded uniform weights, or `fill` (norm gains of 1, RoPE tables of 0).
  enum class Values { kRandom, kFill };
  auto write = [&](uint64_t n, Values values, float fill = 0.0f) {
    while (n > 0) {
      const uint64_t k = std::min<uint64_t>(n, buf.size());
      for (uint64_t i = 0; i < k; ++i)
        buf[i] = values == Values::kFill ? fill : a * (2.0f * float(splitmix64(counter++) >> 40) / float(1 << 24) - 1.0f);
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(k * sizeof(float)));
      n -= k;
    }
  };
  const uint64_t kv_dim = dim * header.n_kv_heads / header.n_heads;
  const uint64_t vocab = std::abs(int64_t{header.vocab_size});
  write(vocab * dim, Values::kRandom);                                          // token embedding
  write(layers * dim, Values::kFill, 1.0f);                                     // attention norms
  write(layers * (dim * dim + 2 * kv_dim * dim + dim * dim), Values::kRandom);  // wq, wk, wv, wo
  write(layers * dim, Values::kFill, 1.0f);                                     // ffn norms
  write(layers * 3 * uint64_t(header.hidden_dim) * dim, Values::kRandom);       // w1, w2, w3
  write(dim, Values::kFill, 1.0f);                                              // final norm
  write(uint64_t(header.seq_len) * (dim / header.n_heads), Values::kFill);      // RoPE tables
  if (header.vocab_size < 0) write(vocab * dim, Values::kRandom);  // classifier
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace pdserve::engine
