// Loading a model: resolve a name or path, read its config and weights (memory-mapped), and
// its tokenizer. Supports llama2.c checkpoints (`*.bin`, tokenizer found beside it) and Hugging
// Face directories (`config.json` + `model.safetensors`, single or sharded).
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/weights.h"

namespace pdserve::engine {

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string path;    // The resolved file or directory.
  std::string format;  // "llama2c" or "hf".
  std::string name;    // Short name for APIs (e.g. "stories260K").
  // From tokenizer_config.json's chat_template; plain (with the reason) when there is none.
  ChatTemplate chat_template = ChatTemplate::plain("no tokenizer_config.json beside the tokenizer");
};

struct ModelLoadOptions {
  std::string model;      // A path (file or directory) or a registered name such as "stories260K".
  std::string tokenizer;  // Optional explicit tokenizer path.
  bool allow_download = true;  // Resolve unknown local names from their public home.
};

// Resolves, loads and validates. Errors name the file and what is wrong with it.
StatusOr<LoadedModel> load_model(const ModelLoadOptions& options);

}  // namespace pdserve::engine
