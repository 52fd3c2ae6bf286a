#include "engine/model/safetensors.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The reference implementation caps headers at 100 MB; anything larger is corruption.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

StatusOr<DType> parse_dtype(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return absl::UnimplementedError(absl::StrCat("dtype ", s, " is not supported (F32, F16, BF16 are)"));
}

// One tensor entry of the header, checked against the data section of `data_size` bytes.
StatusOr<TensorView> parse_entry(const json& entry, const uint8_t* data, uint64_t data_size) {
  if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
      !entry.contains("data_offsets"))
    return absl::InvalidArgumentError("entry lacks dtype, shape or data_offsets");
  const json& jd = entry["dtype"];
  const json& js = entry["shape"];
  const json& jo = entry["data_offsets"];
  if (!jd.is_string()) return absl::InvalidArgumentError("dtype is not a string");
  PD_ASSIGN_OR_RETURN(DType dtype, parse_dtype(jd.get<std::string>()));
  if (!js.is_array()) return absl::InvalidArgumentError("shape is not an array");
  TensorView view;
  view.dtype = dtype;
  uint64_t numel = 1;
  for (const json& d : js) {
    if (!d.is_number_unsigned()) return absl::InvalidArgumentError("shape has a non-integer or negative size");
    uint64_t n = d.get<uint64_t>();
    if (n != 0 && numel > data_size / n) return absl::InvalidArgumentError("shape is larger than the file");
    numel *= n;
    view.shape.push_back(int64_t(n));
  }
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
    return absl::InvalidArgumentError("data_offsets is not a pair of non-negative integers");
  uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
  if (begin > end || end > data_size)
    return absl::InvalidArgumentError(absl::StrCat("data_offsets [", begin, ", ", end,
                                                   ") lie outside the ", data_size, "-byte data section"));
  if (end - begin != numel * dtype_size(dtype))
    return absl::InvalidArgumentError(absl::StrCat("data_offsets span ", end - begin,
                                                   " bytes but the shape needs ", numel * dtype_size(dtype)));
  view.data = data + begin;
  return view;
}

StatusOr<json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON"));
  return j;
}

}  // namespace

Status add_safetensors_file(const std::string& path, TensorTable& table) {
  PD_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> owned, MappedFile::open(path));
  std::shared_ptr<const MappedFile> file = std::move(owned);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid safetensors file: ", why));
  };
  if (file->size() < 8) return bad("shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > kMaxHeaderBytes || header_len > file->size() - 8)
    return bad(absl::StrCat("header length ", header_len, " does not fit in the ", file->size(), "-byte file"));
  const char* text = reinterpret_cast<const char*>(file->data() + 8);
  json header = json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("the header is not a JSON object");
  const uint8_t* data = file->data() + 8 + header_len;
  const uint64_t data_size = file->size() - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    auto view = parse_entry(entry, data, data_size);
    if (!view.ok()) return bad(absl::StrCat("tensor ", name, ": ", view.status().message()));
    // The writer pads the header so data is aligned; files from elsewhere may not be, and the
    // kernels need naturally aligned elements.
    if (reinterpret_cast<uintptr_t>(view->data) % dtype_size(view->dtype) != 0)
      view->data = table.own_copy(view->data, view->bytes());
    Status added = table.add(name, *std::move(view));
    if (!added.ok()) return bad(std::string(added.message()));
  }
  table.keep(std::move(file));
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<TensorTable>> read_safetensors_dir(const std::string& dir) {
  auto table = std::make_unique<TensorTable>();
  const fs::path root(dir);
  const fs::path single = root / "model.safetensors";
  const fs::path index_path = root / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(single, ec)) {
    PD_RETURN_IF_ERROR(add_safetensors_file(single.string(), *table));
    return table;
  }
  if (!fs::exists(index_path, ec))
    return absl::NotFoundError(
        absl::StrCat(dir, " has neither model.safetensors nor model.safetensors.index.json"));
  PD_ASSIGN_OR_RETURN(json index, read_json_file(index_path.string()));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), " has no weight_map object"));
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": weight_map entry ", name, " is not a file name"));
    std::string file = shard.get<std::string>();
    // Shards must live in the model directory; a path elsewhere is a broken or hostile index.
    if (file.empty() || file.find('/') != std::string::npos || file == "..")
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": shard name '", file, "' is not a plain file name"));
    weight_map[name] = file;
    shards.insert(file);
  }
  for (const std::string& shard : shards) {
    PD_RETURN_IF_ERROR(add_safetensors_file((root / shard).string(), *table));
  }
  for (const auto& [name, shard] : weight_map)
    if (!table->contains(name))
      return absl::InvalidArgumentError(absl::StrCat(
          index_path.string(), " maps ", name, " to ", shard, " but no shard holds it"));
  return table;
}

}  // namespace pdserve::engine
