// A read-only memory map of a whole file. Model weights are served straight from the map, so a
// multi-gigabyte checkpoint costs page cache, not heap, and loads instantly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace pdserve::engine {

class MappedFile {
 public:
  // Maps `path`. NotFound if it does not exist; InvalidArgument if it is not a regular file or
  // is empty (mmap cannot map zero bytes, and no model file is legitimately empty).
  static StatusOr<std::unique_ptr<MappedFile>> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace pdserve::engine
