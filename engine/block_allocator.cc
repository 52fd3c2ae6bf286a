#include "engine/block_allocator.h"

#include <algorithm>

namespace pdserve::engine {

BlockAllocator::BlockAllocator(int num_blocks) : refs_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

StatusOr<std::vector<int>> BlockAllocator::allocate(int count) {
  std::lock_guard lock(mu_);
  if (count < 0) return absl::InvalidArgumentError("negative block count");
  if (count > int(free_.size()))
    return absl::ResourceExhaustedError(
        absl::StrCat("need ", count, " KV blocks, ", free_.size(), " free"));
  // Popped off the top, so that a run pushed back by release() comes out ascending again.
  std::vector<int> out(free_.rbegin(), free_.rbegin() + count);
  free_.resize(free_.size() - count);
  for (int b : out) refs_[b] = 1;
  return out;
}

Status BlockAllocator::check_allocated(const std::vector<int>& blocks) const {
  for (int b : blocks) {
    if (b < 0 || b >= int(refs_.size()))
      return absl::OutOfRangeError(absl::StrCat("KV block id ", b, " out of range [0, ", refs_.size(), ")"));
    if (refs_[b] <= 0) return absl::FailedPreconditionError(absl::StrCat("KV block ", b, " is not allocated"));
  }
  return absl::OkStatus();
}

Status BlockAllocator::retain(const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  PD_RETURN_IF_ERROR(check_allocated(blocks));
  for (int b : blocks) ++refs_[b];
  return absl::OkStatus();
}

Status BlockAllocator::release(const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  PD_RETURN_IF_ERROR(check_allocated(blocks));
  // A block listed twice must still hold enough references for both.
  std::vector<int> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0, j; i < sorted.size(); i = j) {
    for (j = i; j < sorted.size() && sorted[j] == sorted[i]; ++j) {}
    if (int(j - i) > refs_[sorted[i]])
      return absl::FailedPreconditionError(
          absl::StrCat("KV block ", sorted[i], " released more often than held"));
  }
  // Pushed in reverse, so that the next allocation pops them in their original order.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (--refs_[*it] == 0) free_.push_back(*it);
  return absl::OkStatus();
}

int BlockAllocator::num_free() const {
  std::lock_guard lock(mu_);
  return int(free_.size());
}

int BlockAllocator::ref_count(int block) const {
  std::lock_guard lock(mu_);
  return block >= 0 && block < int(refs_.size()) ? refs_[block] : 0;
}

}  // namespace pdserve::engine
