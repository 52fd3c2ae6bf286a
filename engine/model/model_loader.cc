// load_model (engine/model_loader.h): decides the format from what the path holds, loads
// config, weights and tokenizer, and checks that they fit together.
#include "engine/model_loader.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "engine/model/generation_config.h"
#include "engine/model/hf_config.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/model_files.h"
#include "engine/model/model_resolver.h"
#include "engine/model/safetensors.h"
#include "engine/model_tensors.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/weights.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Every tensor the forward pass reads must exist with the shape the config implies.
Status check_tensors(const ModelConfig& c, const WeightSource& weights, const std::string& source) {
  for (const TensorShape& e : model_tensors(c)) {
    auto t = weights.tensor(e.name);
    if (!t.ok()) {
      if (e.optional) continue;
      return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensor ", e.name));
    }
    if (t->shape != e.shape)
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor ", e.name, " has shape ",
                                                     shape_text(t->shape), ", the config implies ",
                                                     shape_text(e.shape)));
  }
  return absl::OkStatus();
}

Status attach_tokenizer(LoadedModel& m, const std::string& path) {
  auto tok = load_tokenizer(path);
  if (!tok.ok())
    return Status(tok.status().code(), absl::StrCat("tokenizer ", path, ": ", tok.status().message()));
  if ((*tok)->vocab_size() > m.config.vocab_size)
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", path, " has ", (*tok)->vocab_size(),
                                                   " tokens but the model only ", m.config.vocab_size));
  m.tokenizer = *std::move(tok);
  // The chat template travels with the tokenizer (tokenizer_config.json beside it); llama2.c
  // tokenizers have none and keep the plain format. Falling back is said at load, since a
  // model then sees prompts in a format it was not trained on.
  std::ifstream config(fs::path(path).parent_path() / "tokenizer_config.json", std::ios::binary);
  if (config) {
    std::ostringstream text;
    text << config.rdbuf();
    m.chat_template = ChatTemplate::from_tokenizer_config(text.str());
  }
  if (m.chat_template.format() == ChatFormat::kPlain)
    PD_LOG_WARN("model {}: chat prompts use the plain \"<role>: <content>\" format: {}", path,
                m.chat_template.fallback_reason());
  return absl::OkStatus();
}

Status load_llama2c(const std::string& file, const ModelLoadOptions& options, LoadedModel& m) {
  PD_ASSIGN_OR_RETURN(Llama2cCheckpoint ckpt, read_llama2c_checkpoint(file));
  m.config = ckpt.config;
  m.weights = std::move(ckpt.weights);
  m.format = "llama2c";
  m.path = file;
  PD_RETURN_IF_ERROR(check_tensors(m.config, *m.weights, file));
  std::string tokenizer = options.tokenizer;
  if (tokenizer.empty()) {
    PD_ASSIGN_OR_RETURN(tokenizer, find_llama2c_tokenizer(fs::path(file).parent_path().string()));
  }
  return attach_tokenizer(m, tokenizer);
}

Status load_hf(const std::string& dir, const ModelLoadOptions& options, LoadedModel& m) {
  PD_ASSIGN_OR_RETURN(m.config, read_hf_config((fs::path(dir) / "config.json").string()));
  const fs::path generation = fs::path(dir) / "generation_config.json";
  std::error_code ec;
  if (fs::is_regular_file(generation, ec)) {
    std::ifstream in(generation);
    std::stringstream text;
    text << in.rdbuf();
    PD_RETURN_IF_ERROR(merge_generation_config(text.str(), generation.string(), m.config));
    const GenerationDefaults& defaults = m.config.generation_defaults;
    if (!defaults.not_applied.empty()) PD_LOG_WARN("{}: {}", generation.string(), describe_generation_defaults(defaults));
    else if (!defaults.empty()) PD_LOG_INFO("{}: {}", generation.string(), describe_generation_defaults(defaults));
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<TensorTable> table, read_safetensors_dir(dir));
  // Tied checkpoints store the embedding once; the engine always reads lm_head.weight.
  if (m.config.tie_embeddings && !table->contains("lm_head.weight") &&
      table->contains("model.embed_tokens.weight"))
    PD_RETURN_IF_ERROR(table->add_alias("lm_head.weight", "model.embed_tokens.weight"));
  m.weights = std::move(table);
  m.format = "hf";
  m.path = dir;
  PD_RETURN_IF_ERROR(check_tensors(m.config, *m.weights, dir));
  std::string tokenizer = options.tokenizer;
  if (tokenizer.empty()) {
    PD_ASSIGN_OR_RETURN(tokenizer, find_hf_tokenizer(dir));
  }
  return attach_tokenizer(m, tokenizer);
}

}  // namespace

StatusOr<LoadedModel> load_model(const ModelLoadOptions& options) {
  if (options.model.empty()) return absl::InvalidArgumentError("no model given");
  LoadedModel m;
  std::error_code ec;
  fs::path path(options.model);
  if (fs::exists(path, ec)) {
    path = fs::absolute(path, ec).lexically_normal();
    if (!path.has_filename()) path = path.parent_path();  // "dir/" names "dir".
    m.name = fs::is_directory(path, ec) ? path.filename().string() : path.stem().string();
  } else {
    PD_ASSIGN_OR_RETURN(std::string dir, resolve_model(options.model, {.allow_download = options.allow_download}));
    path = dir;
    m.name = options.model;
  }

  if (fs::is_regular_file(path, ec)) {
    if (path.extension() != ".bin")
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), " is not a llama2.c .bin checkpoint; for Hugging Face models pass the directory"));
    PD_RETURN_IF_ERROR(load_llama2c(path.string(), options, m));
  } else if (fs::is_regular_file(path / "config.json", ec)) {
    PD_RETURN_IF_ERROR(load_hf(path.string(), options, m));
  } else {
    PD_ASSIGN_OR_RETURN(std::string file, find_llama2c_checkpoint(path.string()));
    PD_RETURN_IF_ERROR(load_llama2c(file, options, m));
  }
  return m;
}

}  // namespace pdserve::engine
