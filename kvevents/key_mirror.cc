#include "kvevents/key_mirror.h"

namespace pdserve::kvevents {

void KeyMirror::stored(engine::KvTier tier, std::span<const engine::BlockKey> keys) {
  sets_[tier_index(tier)].insert(keys.begin(), keys.end());
}

void KeyMirror::removed(engine::KvTier tier, std::span<const engine::BlockKey> keys) {
  auto& set = sets_[tier_index(tier)];
  for (const auto& k : keys) set.erase(k);
}

void KeyMirror::cleared(engine::KvTier tier) { sets_[tier_index(tier)].clear(); }

std::vector<engine::BlockKey> KeyMirror::keys(engine::KvTier tier) const {
  const auto& set = sets_[tier_index(tier)];
  return std::vector<engine::BlockKey>(set.begin(), set.end());
}

}  // namespace pdserve::kvevents
