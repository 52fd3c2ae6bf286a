#include "engine/model/tensor_table.h"

#include <cstring>

namespace pdserve::engine {

StatusOr<TensorView> TensorTable::tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return absl::NotFoundError(absl::StrCat("the model has no tensor named ", std::string(name)));
  return it->second;
}

std::vector<std::string> TensorTable::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) out.push_back(name);
  return out;
}

Status TensorTable::add(std::string name, TensorView view) {
  auto [it, inserted] = tensors_.emplace(std::move(name), std::move(view));
  if (!inserted) return absl::AlreadyExistsError(absl::StrCat("tensor ", it->first, " appears twice"));
  return absl::OkStatus();
}

Status TensorTable::add_alias(const std::string& alias, const std::string& target) {
  PD_ASSIGN_OR_RETURN(TensorView view, tensor(target));
  return add(alias, std::move(view));
}

const void* TensorTable::own_copy(const void* bytes, size_t size) {
  auto buf = std::make_unique<float[]>((size + sizeof(float) - 1) / sizeof(float));
  std::memcpy(buf.get(), bytes, size);
  copies_.push_back(std::move(buf));
  return copies_.back().get();
}

}  // namespace pdserve::engine
