// Access to a model's tensors by their Hugging Face Llama names, whatever file they came from
// ("model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight", "lm_head.weight").
// Tensors stay where the loader put them (usually a read-only memory map); views borrow.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/dtype.h"

namespace pdserve::engine {

// A borrowed, row-major tensor.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The tensor named `name`; NotFound if the model has none by that name.
  virtual StatusOr<TensorView> tensor(std::string_view name) const = 0;
  // Every tensor name, for diagnostics.
  virtual std::vector<std::string> names() const = 0;
};

// Canonical tensor names.
std::string layer_tensor_name(int layer, std::string_view suffix);  // "model.layers.L.<suffix>"

}  // namespace pdserve::engine
