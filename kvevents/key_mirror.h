// KeyMirror: the set of keys present per tier, as the events given to a publisher say, so
// that a snapshot taken on the publisher's I/O thread is consistent with the last seq it
// published, without asking the engine (whose lock the publisher must not take).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"

namespace pdserve::kvevents {

inline constexpr size_t kNumTiers = 3;
inline size_t tier_index(engine::KvTier tier) { return size_t(tier) - 1; }

class KeyMirror {
 public:
  void stored(engine::KvTier tier, std::span<const engine::BlockKey> keys);
  void removed(engine::KvTier tier, std::span<const engine::BlockKey> keys);
  void cleared(engine::KvTier tier);
  size_t size(engine::KvTier tier) const { return sets_[tier_index(tier)].size(); }
  // The tier's keys, in no particular order.
  std::vector<engine::BlockKey> keys(engine::KvTier tier) const;

 private:
  std::array<absl::flat_hash_set<engine::BlockKey>, kNumTiers> sets_;
};

}  // namespace pdserve::kvevents
