// Writing safetensors files by streaming: the tensor list is declared up front (it forms the
// header), then the data is appended in order, so a 32 GB checkpoint never sits in memory.
// Written to `<path>.tmp` and renamed on finish(), so a crash never leaves a plausible file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/dtype.h"

namespace pdserve::engine {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  // Creates the file and writes the header (with `metadata` as "__metadata__").
  static StatusOr<std::unique_ptr<SafetensorsWriter>> create(
      const std::string& path, std::vector<TensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();

  // Appends float values to the data, converted to each tensor's dtype; a call may span
  // tensors. FailedPrecondition past the declared size.
  Status write_floats(const float* values, size_t count);
  // Appends raw bytes already in the current tensor's dtype; must not cross a tensor boundary.
  Status write_bytes(const void* bytes, size_t size);
  // Checks that every declared byte was written, then closes and renames into place.
  Status finish();

 private:
  SafetensorsWriter(std::string path, std::FILE* f, std::vector<TensorSpec> tensors);
  void advance(size_t bytes);
  Status put(const void* bytes, size_t size);

  std::string path_;
  std::FILE* file_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> sizes_;  // Bytes per tensor.
  size_t index_ = 0;             // Current tensor.
  uint64_t written_ = 0;         // Bytes written into the current tensor.
  std::vector<uint8_t> buffer_;  // Conversion scratch.
};

}  // namespace pdserve::engine
