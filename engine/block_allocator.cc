#include "engine/block_allocator.h"

#include <algorithm>

namespace pdserve::engine {

BlockAllocator::BlockAllocator(int num_blocks, int block_size, KvEventSink* sink, KvTier tier)
    : block_size_(block_size),
      refs_(size_t(num_blocks), 0),
      prev_(size_t(num_blocks) + 1, -1),
      next_(size_t(num_blocks) + 1, -1),
      index_(num_blocks, block_size, sink, tier) {
  free_.reserve(size_t(num_blocks));
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  prev_[size_t(num_blocks)] = next_[size_t(num_blocks)] = num_blocks;  // The empty list's sentinel.
}

void BlockAllocator::lru_push_back(int block) {
  const int sentinel = num_blocks();
  const int last = prev_[size_t(sentinel)];
  prev_[size_t(block)] = last;
  next_[size_t(block)] = sentinel;
  next_[size_t(last)] = block;
  prev_[size_t(sentinel)] = block;
  ++lru_size_;
}

void BlockAllocator::lru_unlink(int block) {
  next_[size_t(prev_[size_t(block)])] = next_[size_t(block)];
  prev_[size_t(next_[size_t(block)])] = prev_[size_t(block)];
  prev_[size_t(block)] = next_[size_t(block)] = -1;
  --lru_size_;
}

void BlockAllocator::evict_lru_head() {
  std::vector<int> uncached;
  index_.uncache(next_[size_t(num_blocks())], &uncached);
  // The head and its evictable descendants are free now; descendants in use stay with their
  // holders as private blocks.
  for (int b : uncached) {
    if (!in_lru(b)) continue;
    lru_unlink(b);
    free_.push_back(b);
  }
}

std::vector<int> BlockAllocator::take(int count) {
  std::vector<int> out;
  out.reserve(size_t(count));
  while (int(out.size()) < count) {
    if (free_.empty()) evict_lru_head();
    // Popped off the top, so that a run pushed back by release() comes out ascending again.
    out.push_back(free_.back());
    free_.pop_back();
    refs_[size_t(out.back())] = 1;
  }
  return out;
}

StatusOr<std::vector<int>> BlockAllocator::allocate(int count) {
  std::lock_guard lock(mu_);
  if (count < 0) return absl::InvalidArgumentError("negative block count");
  if (count > int(free_.size()) + lru_size_)
    return absl::ResourceExhaustedError(
        absl::StrCat("need ", count, " KV blocks, ", free_.size() + lru_size_, " free or evictable"));
  return take(count);
}

BlockAllocator::Allocation BlockAllocator::match_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                                        std::span<const int32_t> tokens, int limit) {
  Allocation a;
  for (size_t i = 0; i < keys.size() && int(a.blocks.size()) < limit; ++i) {
    if ((i + 1) * size_t(block_size_) > tokens.size()) break;
    const auto link =
        index_.match(keys[i], a.last_hit, ns_root, tokens.subspan(i * size_t(block_size_), size_t(block_size_)));
    if (!link) break;
    a.blocks.push_back(link->block);
    a.hits.push_back(*link);
    a.last_hit = link;
  }
  return a;
}

StatusOr<BlockAllocator::Allocation> BlockAllocator::allocate_cached(std::span<const BlockKey> keys,
                                                                     const BlockKey& ns_root,
                                                                     std::span<const int32_t> tokens, int total, int spare) {
  std::lock_guard lock(mu_);
  if (total < 0 || spare < 0) return absl::InvalidArgumentError("negative block count");
  Allocation a = match_prefix(keys, ns_root, tokens, total);
  int evictable_hits = 0;
  for (int b : a.blocks) evictable_hits += refs_[size_t(b)] == 0;
  const int fresh = total - int(a.blocks.size());
  if (fresh + spare > int(free_.size()) + lru_size_ - evictable_hits)
    return absl::ResourceExhaustedError(absl::StrCat("need ", fresh, " new KV blocks beside ", a.blocks.size(),
                                                     " cached and ", spare, " spare, ",
                                                     int(free_.size()) + lru_size_ - evictable_hits,
                                                     " free or evictable"));
  for (int b : a.blocks) {
    if (refs_[size_t(b)] == 0) lru_unlink(b);
    ++refs_[size_t(b)];
  }
  a.cached_blocks = int(a.blocks.size());
  std::vector<int> more = take(fresh);
  a.blocks.insert(a.blocks.end(), more.begin(), more.end());
  return a;
}

BlockAllocator::Allocation BlockAllocator::acquire_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                                          std::span<const int32_t> tokens) {
  std::lock_guard lock(mu_);
  Allocation a = match_prefix(keys, ns_root, tokens, int(keys.size()));
  for (int b : a.blocks) {
    if (refs_[size_t(b)] == 0) lru_unlink(b);
    ++refs_[size_t(b)];
  }
  a.cached_blocks = int(a.blocks.size());
  return a;
}

int BlockAllocator::cached_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                  std::span<const int32_t> tokens) {
  std::lock_guard lock(mu_);
  return int(match_prefix(keys, ns_root, tokens, int(keys.size())).blocks.size());
}

std::optional<CachedLink> BlockAllocator::cache(int block, const BlockKey& key, const std::optional<CachedLink>& parent,
                                                const BlockKey& ns_root, uint32_t index,
                                                std::span<const int32_t> tokens) {
  std::lock_guard lock(mu_);
  if (block < 0 || block >= num_blocks() || refs_[size_t(block)] <= 0) return std::nullopt;
  return index_.insert(block, key, parent, ns_root, index, tokens);
}

bool BlockAllocator::valid(const CachedLink& link) const {
  std::lock_guard lock(mu_);
  return index_.valid(link);
}

bool BlockAllocator::holds(const CachedLink& link, const BlockKey& key) const {
  std::lock_guard lock(mu_);
  return index_.holds(link, key);
}

void BlockAllocator::reset_cache() {
  std::lock_guard lock(mu_);
  std::vector<int> uncached;
  index_.clear(&uncached);
  for (int b : uncached) {
    if (!in_lru(b)) continue;
    lru_unlink(b);
    free_.push_back(b);
  }
}

Status BlockAllocator::check_held(const std::vector<int>& blocks) const {
  for (int b : blocks) {
    if (b < 0 || b >= num_blocks())
      return absl::OutOfRangeError(absl::StrCat("KV block id ", b, " out of range [0, ", refs_.size(), ")"));
    if (refs_[size_t(b)] <= 0) return absl::FailedPreconditionError(absl::StrCat("KV block ", b, " is not allocated"));
  }
  return absl::OkStatus();
}

Status BlockAllocator::retain(const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  PD_RETURN_IF_ERROR(check_held(blocks));
  for (int b : blocks) ++refs_[size_t(b)];
  return absl::OkStatus();
}

Status BlockAllocator::release(const std::vector<int>& blocks) {
  std::lock_guard lock(mu_);
  PD_RETURN_IF_ERROR(check_held(blocks));
  // A block listed twice must still hold enough references for both.
  std::vector<int> sorted = blocks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0, j; i < sorted.size(); i = j) {
    for (j = i; j < sorted.size() && sorted[j] == sorted[i]; ++j) {
    }
    if (int(j - i) > refs_[size_t(sorted[i])])
      return absl::FailedPreconditionError(absl::StrCat("KV block ", sorted[i], " released more often than held"));
  }
  // In reverse: the next allocation pops free blocks in their original order, and the LRU list
  // evicts a sequence's last blocks before its first.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    if (--refs_[size_t(*it)] > 0) continue;
    if (index_.cached(*it)) {
      lru_push_back(*it);
    } else {
      free_.push_back(*it);
    }
  }
  return absl::OkStatus();
}

int BlockAllocator::num_free() const {
  std::lock_guard lock(mu_);
  return int(free_.size()) + lru_size_;
}

BlockAllocator::Counts BlockAllocator::counts() const {
  std::lock_guard lock(mu_);
  return {int(free_.size()) + lru_size_, lru_size_, int(index_.size()), index_.collisions()};
}

int BlockAllocator::ref_count(int block) const {
  std::lock_guard lock(mu_);
  return block >= 0 && block < num_blocks() ? refs_[size_t(block)] : 0;
}

std::vector<BlockKey> BlockAllocator::cached_keys() const {
  std::lock_guard lock(mu_);
  return index_.keys();
}

Status BlockAllocator::check_invariants() const {
  std::lock_guard lock(mu_);
  const int n = num_blocks();
  std::vector<int> where(size_t(n), 0);  // 1 free, 2 evictable.
  for (int b : free_) {
    if (b < 0 || b >= n || where[size_t(b)] != 0)
      return absl::InternalError(absl::StrCat("free list holds ", b, " twice"));
    if (refs_[size_t(b)] != 0 || index_.cached(b) || in_lru(b))
      return absl::InternalError(absl::StrCat("free block ", b, " is held, cached or in the LRU list"));
    where[size_t(b)] = 1;
  }
  int walked = 0;
  for (int b = next_[size_t(n)], prev = n; b != n; prev = b, b = next_[size_t(b)]) {
    if (b < 0 || b >= n || where[size_t(b)] != 0 || prev_[size_t(b)] != prev || ++walked > n)
      return absl::InternalError("LRU list is broken");
    if (refs_[size_t(b)] != 0 || !index_.cached(b))
      return absl::InternalError(absl::StrCat("evictable block ", b, " is held or uncached"));
    where[size_t(b)] = 2;
  }
  if (walked != lru_size_) return absl::InternalError("LRU size disagrees with its list");
  for (int b = 0; b < n; ++b) {
    if (refs_[size_t(b)] < 0) return absl::InternalError(absl::StrCat("block ", b, " has a negative count"));
    if (where[size_t(b)] == 0 && refs_[size_t(b)] == 0)
      return absl::InternalError(absl::StrCat("block ", b, " is in no set"));
    if (where[size_t(b)] == 0 && in_lru(b)) return absl::InternalError("a held block is in the LRU list");
  }
  if (!index_.consistent()) return absl::InternalError("prefix index tree is inconsistent");
  return absl::OkStatus();
}

}  // namespace pdserve::engine
