// ApproximateBlocks: the router's own record of what it sent each worker, for placement by cache
// while the worker's KV-event index is not EXACT (docs/router.md, "Placement"): a worker whose
// events were lost (DEGRADED: replays keep failing) or not yet replayed (RECOVERING) would
// otherwise get credit only for the 2 s predicted entries, and conversations would scatter.
// Per worker, the block keys of the prompts dispatched there, most recently sent first, capped
// at the worker's KV capacity in blocks (its Info's num_blocks), so the oldest fall out as an
// LRU cache would evict them — the approximation llm-d's approximate prefix scorer makes.
// Thread-safe.
#pragma once

#include <list>
#include <mutex>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "engine/prefix/block_key.h"

namespace pdserve::router {

class ApproximateBlocks {
 public:
  // `keys` (a prompt's chain) were sent to `worker`, which holds at most `capacity` blocks: they
  // become its most recent; beyond `capacity` the least recent go.
  void insert(const std::string& worker, std::span<const engine::BlockKey> keys, size_t capacity);
  // The longest prefix of `chain` recorded for `worker`.
  size_t match(const std::string& worker, std::span<const engine::BlockKey> chain) const;
  // Forgets a worker (it left, or restarted with an empty cache).
  void remove(const std::string& worker);
  // Keys recorded for `worker` (tests).
  size_t size(const std::string& worker) const;

 private:
  struct Worker {
    std::list<engine::BlockKey> order;  // Most recent first.
    absl::flat_hash_map<engine::BlockKey, std::list<engine::BlockKey>::iterator> where;
  };
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Worker> workers_;  // Guarded by mu_.
};

}  // namespace pdserve::router
