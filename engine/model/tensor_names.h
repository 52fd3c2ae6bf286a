// The Hugging Face Llama name of a per-layer tensor, as the file readers and writers here
// spell it. (engine/weights.h declares the same as layer_tensor_name, defined in
// pdserve_engine, which links this library rather than the reverse.)
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

inline std::string hf_layer_name(int layer, std::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", std::string(suffix));
}

}  // namespace pdserve::engine
