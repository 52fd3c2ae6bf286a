// upload_shard: a rank's weight shard copied into a device backend's memory. Only what the rank
// computes with travels (its head, column and vocabulary slices, compacted), so a GPU holds
// 1/TP of the sharded tensors rather than the whole model.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/backend_buffer.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace pdserve::engine {

// A RankShard whose pointers are backend memory, and the buffers that hold it.
struct UploadedShard {
  RankShard shard;
  std::vector<std::unique_ptr<BackendBuffer>> buffers;
  uint64_t bytes = 0;
};

// Copies `host` (pointers into f32 host tensors, as shard_weights makes them) to `backend`, the
// GEMM weights as `weight_dtype` (f32, or bf16 rounded to nearest even). A tied classifier's
// rows stay a view into the uploaded embedding table when both are f32.
StatusOr<std::unique_ptr<UploadedShard>> upload_shard(const ModelConfig& config, const RankShard& host,
                                                      Backend* backend, DType weight_dtype = DType::kF32);

// The bytes upload_shard(config, host, backend, weight_dtype) places in device memory, counted
// by the same code without copying anything: the weights' share of a device, for sizing the KV
// cache beside them.
StatusOr<uint64_t> uploaded_bytes(const ModelConfig& config, const RankShard& host, DType weight_dtype);

}  // namespace pdserve::engine
