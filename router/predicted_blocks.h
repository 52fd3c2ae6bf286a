// PredictedBlocks: the router's guess of what a worker's prefix cache will hold once the
// requests it just sent there are computed, for the race before the worker's KV events arrive
// (docs/router.md, "Placement"). After a dispatch the router inserts the prompt's block keys
// for the chosen workers; each entry lives `ttl` (2 s, llm-d's default) on the injected clock,
// long enough for the events to confirm it. So a burst of same-prefix requests lands on the
// worker the first one went to. Thread-safe.
#pragma once

#include <mutex>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "engine/prefix/block_key.h"

namespace pdserve::router {

class PredictedBlocks {
 public:
  PredictedBlocks(const Clock& clock, Duration ttl) : clock_(clock), ttl_(ttl) {}

  // `keys` (a prompt's chain) will be on `worker` soon: each one expires ttl from now.
  void insert(const std::string& worker, std::span<const engine::BlockKey> keys);
  // The longest prefix of `chain` predicted on `worker` and not yet expired.
  size_t match(const std::string& worker, std::span<const engine::BlockKey> chain) const;
  // Forgets a worker (it left the registry).
  void remove(const std::string& worker);

 private:
  using Expiries = absl::flat_hash_map<engine::BlockKey, TimePoint>;
  const Clock& clock_;
  const Duration ttl_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Expiries> workers_;  // Guarded by mu_.
};

}  // namespace pdserve::router
