// Locating the files of a model on disk: the llama2.c checkpoint in a directory and the
// tokenizer that goes with a model, by the conventions llama2.c and Hugging Face use.
#pragma once

#include <string>

#include "common/status.h"

namespace pdserve::engine {

// The single llama2.c checkpoint (`*.bin` that is not a tokenizer) in `dir`. NotFound if there
// is none; InvalidArgument if there are several (the choice would be a guess).
StatusOr<std::string> find_llama2c_checkpoint(const std::string& dir);

// The llama2.c tokenizer in `dir`: `tokenizer.bin`, else the first `tok*.bin` by name.
StatusOr<std::string> find_llama2c_tokenizer(const std::string& dir);

// The tokenizer of a Hugging Face model directory: `tokenizer.json`, else a llama2.c one.
StatusOr<std::string> find_hf_tokenizer(const std::string& dir);

}  // namespace pdserve::engine
