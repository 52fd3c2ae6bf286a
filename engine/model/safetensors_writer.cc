#include "engine/model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "engine/model/float_convert.h"

namespace pdserve::engine {
namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

uint64_t tensor_bytes(const TensorSpec& t) {
  uint64_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= uint64_t(d);
  return n;
}

}  // namespace

StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(
    const std::string& path, std::vector<TensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    for (int64_t d : t.shape)
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " has a negative dimension"));
    if (header.contains(t.name))
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " declared twice"));
    uint64_t n = tensor_bytes(t);
    header[t.name] = {{"dtype", st_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // Names that are not valid UTF-8.
    return absl::InvalidArgumentError(absl::StrCat("cannot write the header of ", path, ": ", e.what()));
  }
  // Padding the header with spaces to a multiple of 8 aligns every tensor for any dtype.
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  // Large sequential writes: the default 4 KiB stdio buffer makes a 32 GB file slow.
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter(path, f, std::move(tensors)));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  PD_RETURN_IF_ERROR(w->put(len, 8));
  PD_RETURN_IF_ERROR(w->put(text.data(), text.size()));
  return w;
}

SafetensorsWriter::SafetensorsWriter(std::string path, std::FILE* f, std::vector<TensorSpec> tensors)
    : path_(std::move(path)), file_(f), tensors_(std::move(tensors)) {
  for (const TensorSpec& t : tensors_) sizes_.push_back(tensor_bytes(t));
  // Zero-sized tensors need no data; start at the first tensor that does.
  while (index_ < tensors_.size() && sizes_[index_] == 0) ++index_;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove((path_ + ".tmp").c_str());
  }
}

Status SafetensorsWriter::put(const void* bytes, size_t size) {
  if (size && std::fwrite(bytes, 1, size, file_) != size)
    return absl::DataLossError(absl::StrCat("writing ", path_, ".tmp failed: ", std::strerror(errno)));
  return absl::OkStatus();
}

void SafetensorsWriter::advance(size_t bytes) {
  written_ += bytes;
  if (written_ == sizes_[index_]) {
    written_ = 0;
    ++index_;
    while (index_ < tensors_.size() && sizes_[index_] == 0) ++index_;
  }
}

Status SafetensorsWriter::write_bytes(const void* bytes, size_t size) {
  if (size == 0) return absl::OkStatus();
  if (index_ >= tensors_.size() || written_ + size > sizes_[index_])
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", size, " bytes do not fit in the current tensor"));
  PD_RETURN_IF_ERROR(put(bytes, size));
  advance(size);
  return absl::OkStatus();
}

Status SafetensorsWriter::write_floats(const float* values, size_t count) {
  while (count > 0) {
    if (index_ >= tensors_.size())
      return absl::FailedPreconditionError(absl::StrCat(path_, ": more data than the declared tensors hold"));
    const DType dtype = tensors_[index_].dtype;
    const size_t esize = dtype_size(dtype);
    const size_t n = std::min<uint64_t>(count, (sizes_[index_] - written_) / esize);
    if (dtype == DType::kF32) {
      PD_RETURN_IF_ERROR(put(values, n * 4));
    } else {
      buffer_.resize(n * 2);
      auto* out = reinterpret_cast<uint16_t*>(buffer_.data());
      for (size_t i = 0; i < n; ++i)
        out[i] = dtype == DType::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      PD_RETURN_IF_ERROR(put(out, n * 2));
    }
    advance(n * esize);
    values += n;
    count -= n;
  }
  return absl::OkStatus();
}

Status SafetensorsWriter::finish() {
  if (index_ < tensors_.size())
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": tensor ", tensors_[index_].name, " is missing ", sizes_[index_] - written_, " bytes"));
  std::FILE* f = file_;
  file_ = nullptr;
  const std::string tmp = path_ + ".tmp";
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("closing ", tmp, " failed: ", std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("cannot rename ", tmp, " to ", path_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine
