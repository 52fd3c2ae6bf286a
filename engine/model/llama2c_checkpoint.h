// Reading llama2.c "version 0" checkpoints (see shared/models/stories260K/README.md): a header
// of seven int32 followed by stacked float32 arrays. The arrays are exposed, without copying,
// under the Hugging Face Llama tensor names so the engine sees one naming for every format.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/model/tensor_table.h"
#include "engine/model_config.h"

namespace pdserve::engine {

struct Llama2cHeader {
  int32_t dim = 0;
  int32_t hidden_dim = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;  // Negative: the classifier has its own matrix at the end.
  int32_t seq_len = 0;
};

// The config a header implies (adjacent-pair RoPE, eps 1e-5, theta 10000, BOS 1, generation
// stopping at BOS as llama2.c does). InvalidArgument for nonsense values.
StatusOr<ModelConfig> llama2c_config(const Llama2cHeader& header);

// The exact size in bytes of a checkpoint with this (already validated) header.
uint64_t llama2c_file_size(const Llama2cHeader& header);

struct Llama2cCheckpoint {
  Llama2cHeader header;
  ModelConfig config;
  std::unique_ptr<TensorTable> weights;  // lm_head.weight aliases the embedding when shared.
};

// Maps and validates `path`: the header must be sane and the file exactly the size it implies.
// Errors name the file; a corrupt file is an error, never a crash.
StatusOr<Llama2cCheckpoint> read_llama2c_checkpoint(const std::string& path);

// Writes a checkpoint with this header and seeded random weights (uniform, standard deviation
// 0.02; norm weights 1; the legacy RoPE tables zero) to `path`: a stand-in of any size for
// benchmarks against llama2.c's run.c, which reads the same file. Same header + seed: the same
// bytes. Streams, so a large model needs no memory beyond a buffer.
Status write_random_llama2c_checkpoint(const Llama2cHeader& header, uint64_t seed, const std::string& path);

}  // namespace pdserve::engine
