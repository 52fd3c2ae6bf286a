#include "engine/model/model_files.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_join.h"

namespace pdserve::engine {
namespace {

namespace fs = std::filesystem;

bool is_tokenizer_name(const std::string& f) { return f.rfind("tok", 0) == 0; }

// Regular files in `dir` ending in `.bin`, sorted by name so choices are deterministic.
StatusOr<std::vector<std::string>> bin_files(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string f = entry.path().filename().string();
    if (entry.is_regular_file(ec) && entry.path().extension() == ".bin") out.push_back(f);
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

StatusOr<std::string> find_llama2c_checkpoint(const std::string& dir) {
  PD_ASSIGN_OR_RETURN(std::vector<std::string> bins, bin_files(dir));
  std::erase_if(bins, is_tokenizer_name);
  if (bins.empty())
    return absl::NotFoundError(absl::StrCat(
        dir, " holds no model: expected config.json (Hugging Face) or a llama2.c *.bin checkpoint"));
  if (bins.size() > 1)
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " holds several llama2.c checkpoints (", absl::StrJoin(bins, ", "), "); name the file"));
  return (fs::path(dir) / bins[0]).string();
}

StatusOr<std::string> find_llama2c_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.bin", ec))
    return (fs::path(dir) / "tokenizer.bin").string();
  PD_ASSIGN_OR_RETURN(std::vector<std::string> bins, bin_files(dir));
  for (const std::string& f : bins)
    if (is_tokenizer_name(f)) return (fs::path(dir) / f).string();
  return absl::NotFoundError(absl::StrCat(
      "no tokenizer (tokenizer.bin or tok*.bin) in ", dir, "; pass one with --tokenizer"));
}

StatusOr<std::string> find_hf_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "tokenizer.json", ec))
    return (fs::path(dir) / "tokenizer.json").string();
  auto bin = find_llama2c_tokenizer(dir);
  if (bin.ok()) return bin;
  return absl::NotFoundError(absl::StrCat(
      "no tokenizer (tokenizer.json, tokenizer.bin or tok*.bin) in ", dir, "; pass one with --tokenizer"));
}

}  // namespace pdserve::engine
