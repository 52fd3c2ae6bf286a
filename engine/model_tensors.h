// The tensors a Llama-family model with a given config consists of: names (Hugging Face
// spelling) and shapes. One list, read by the loader's shape checks, the engine's weight
// table and make-model's writer, so that the three never disagree about a model's layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model_config.h"

namespace pdserve::engine {

struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
  // Tied classifiers have no lm_head tensor of their own (the embedding serves).
  bool optional = false;
};

// In file order: embedding, per layer (norms, attention with optional biases and index
// projections, MLP), final norm, classifier.
std::vector<TensorShape> model_tensors(const ModelConfig& config);

}  // namespace pdserve::engine
