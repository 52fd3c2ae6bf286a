// Reading safetensors files (8-byte little-endian header length, a JSON header mapping tensor
// names to dtype/shape/data_offsets, then the data), single or sharded through
// model.safetensors.index.json. Tensors are views into the memory-mapped files.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "engine/model/tensor_table.h"

namespace pdserve::engine {

// Adds every tensor of the safetensors file `path` to `table` (which keeps the file mapped).
// Only F32, F16 and BF16 tensors are accepted. Every offset is checked against the file, so a
// corrupt file gives an error naming it, never a crash.
Status add_safetensors_file(const std::string& path, TensorTable& table);

// Loads the weights of a Hugging Face model directory: `model.safetensors`, or the shards
// listed in `model.safetensors.index.json` (every tensor the index names must be present).
StatusOr<std::unique_ptr<TensorTable>> read_safetensors_dir(const std::string& dir);

}  // namespace pdserve::engine
