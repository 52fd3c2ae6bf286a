#include "router/approximate_blocks.h"

namespace pdserve::router {

void ApproximateBlocks::insert(const std::string& worker, std::span<const engine::BlockKey> keys, size_t capacity) {
  if (capacity == 0) return;
  std::lock_guard lock(mu_);
  Worker& w = workers_[worker];
  // The chain's head is its most reused block: it goes in last, so it is the most recent.
  for (auto k = keys.rbegin(); k != keys.rend(); ++k) {
    if (auto it = w.where.find(*k); it != w.where.end()) {
      w.order.splice(w.order.begin(), w.order, it->second);
    } else {
      w.order.push_front(*k);
      w.where.emplace(*k, w.order.begin());
    }
  }
  while (w.order.size() > capacity) {
    w.where.erase(w.order.back());
    w.order.pop_back();
  }
}

size_t ApproximateBlocks::match(const std::string& worker, std::span<const engine::BlockKey> chain) const {
  std::lock_guard lock(mu_);
  auto w = workers_.find(worker);
  if (w == workers_.end()) return 0;
  size_t n = 0;
  while (n < chain.size() && w->second.where.contains(chain[n])) ++n;
  return n;
}

void ApproximateBlocks::remove(const std::string& worker) {
  std::lock_guard lock(mu_);
  workers_.erase(worker);
}

size_t ApproximateBlocks::size(const std::string& worker) const {
  std::lock_guard lock(mu_);
  auto w = workers_.find(worker);
  return w == workers_.end() ? 0 : w->second.order.size();
}

}  // namespace pdserve::router
