#include "router/predicted_blocks.h"

namespace pdserve::router {

void PredictedBlocks::insert(const std::string& worker, std::span<const engine::BlockKey> keys) {
  const TimePoint now = clock_.now();
  std::lock_guard lock(mu_);
  Expiries& e = workers_[worker];
  // Expired entries go on each insert, so the map holds what ttl's worth of dispatches sent.
  absl::erase_if(e, [now](const auto& kv) { return kv.second <= now; });
  for (const engine::BlockKey& k : keys) e[k] = now + ttl_;
}

size_t PredictedBlocks::match(const std::string& worker, std::span<const engine::BlockKey> chain) const {
  const TimePoint now = clock_.now();
  std::lock_guard lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end()) return 0;
  size_t n = 0;
  for (; n < chain.size(); ++n) {
    auto it = w->second.find(chain[n]);
    if (it == w->second.end() || it->second <= now) break;
  }
  return n;
}

void PredictedBlocks::remove(const std::string& worker) {
  std::lock_guard lock(mu_);
  workers_.erase(worker);
}

}  // namespace pdserve::router
