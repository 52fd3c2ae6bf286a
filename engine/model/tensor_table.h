// TensorTable: the WeightSource every file format loads into — named views into memory the
// table keeps alive (memory maps, plus the rare tensor that had to be copied for alignment).
// One implementation for all formats keeps lookups, aliases and diagnostics identical.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/mapped_file.h"
#include "engine/weights.h"

namespace pdserve::engine {

class TensorTable : public WeightSource {
 public:
  StatusOr<TensorView> tensor(std::string_view name) const override;
  std::vector<std::string> names() const override;

  bool contains(std::string_view name) const { return tensors_.count(std::string(name)) > 0; }
  // AlreadyExists if `name` is taken (two shards both claiming a tensor is a corrupt index).
  Status add(std::string name, TensorView view);
  // Makes `alias` another name for `target` (tied embeddings: lm_head.weight = embed).
  Status add_alias(const std::string& alias, const std::string& target);
  // Keeps the memory behind the views alive for the table's lifetime.
  void keep(std::shared_ptr<const MappedFile> file) { files_.push_back(std::move(file)); }
  // Copies `bytes` into memory the table owns and returns it, suitably aligned for any dtype.
  const void* own_copy(const void* bytes, size_t size);

 private:
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<std::unique_ptr<float[]>> copies_;
};

}  // namespace pdserve::engine
