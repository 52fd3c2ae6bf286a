// The pool of KV cache blocks of one engine (the same block ids on every TP rank), with the
// prefix cache over it. Blocks are reference counted: a sequence holds its blocks, and
// kvtransfer holds them while a transfer reads or writes them. A block whose last holder lets
// go returns to the free stack, unless it is cached (its full contents are named by a block
// key, engine/prefix/prefix_index.h): then it waits in an LRU list, still hittable, until an
// allocation needs it and evicts it — which also uncaches its cached descendants, as nothing
// could reach them any more. So every block is in exactly one of three sets: free (uncached,
// no holder), evictable (cached, no holder) or in use. Thread-safe: transfers complete on
// other threads than the scheduler.
#pragma once

#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/prefix/prefix_index.h"

namespace pdserve::engine {

class BlockAllocator {
 public:
  // `block_size` is the prefix cache's unit (tokens per block); `sink`, which may be null,
  // gets the cache's KV events, naming `tier` (the host tier's slots are a pool of their own:
  // engine/host_kv_tier.h).
  explicit BlockAllocator(int num_blocks, int block_size = 16, KvEventSink* sink = nullptr,
                          KvTier tier = KvTier::kDevice);

  // Takes `count` blocks (reference count 1 each), free ones first, then the least recently
  // used evictable ones; ResourceExhausted (and no change) if too few are free or evictable.
  // A fresh pool hands out ascending ids, and a request's blocks released together come back
  // in the same order: long ascending runs let kvtransfer coalesce consecutive blocks.
  StatusOr<std::vector<int>> allocate(int count);

  // A request's blocks with its cached prefix first.
  struct Allocation {
    std::vector<int> blocks;
    int cached_blocks = 0;               // blocks[0, cached_blocks) came from the cache.
    std::optional<CachedLink> last_hit;  // Where the request's chain goes on from (none: its start).
    std::vector<CachedLink> hits;        // The links of blocks[0, cached_blocks), in chain order.
  };
  // Takes `total` blocks for a request: first the longest cached prefix of `keys` (the keys of
  // its leading full blocks of `tokens`, chained from `ns_root`; every hit is checked against
  // the tokens exactly), each retained, then new ones. ResourceExhausted (and no change) when
  // the new ones do not fit with `spare` blocks left free or evictable beside them; a hit block
  // that was evictable does not count as room.
  StatusOr<Allocation> allocate_cached(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                       std::span<const int32_t> tokens, int total, int spare = 0);
  // Retains the longest cached prefix of `keys` (as allocate_cached's hits, with no new blocks).
  Allocation acquire_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens);
  // How many leading blocks of `keys` are cached (read only but for the collision count).
  int cached_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens);
  // Caches `block` (held, its KV written on every rank) as PrefixIndex::insert does.
  std::optional<CachedLink> cache(int block, const BlockKey& key, const std::optional<CachedLink>& parent,
                                  const BlockKey& ns_root, uint32_t index, std::span<const int32_t> tokens);
  // Whether `link` still names a cached block.
  bool valid(const CachedLink& link) const;
  // Whether `link` still names a cached block, cached under `key` (PrefixIndex::holds).
  bool holds(const CachedLink& link, const BlockKey& key) const;
  // Uncaches every block (evictable ones become free); the sink gets one "cleared".
  void reset_cache();

  // Adds one reference to each block (they must be in use).
  Status retain(const std::vector<int>& blocks);
  // Drops one reference from each block; blocks reaching zero become free, or evictable when
  // cached (in reverse order, so that a sequence's deepest blocks are evicted first).
  // FailedPrecondition (and no change at all) if any block is not in use: a double free is a
  // bug to surface.
  Status release(const std::vector<int>& blocks);

  int num_blocks() const { return int(refs_.size()); }
  // Blocks an allocation can take: free plus evictable.
  int num_free() const;
  // The pool's counts, read together (one lock for EngineStats).
  struct Counts {
    int free = 0;       // num_free().
    int evictable = 0;  // Cached blocks no one holds.
    int cached = 0;     // Cached keys (evictable or in use).
    uint64_t collisions = 0;  // Lookups whose key matched but whose tokens or parent did not.
  };
  Counts counts() const;
  int ref_count(int block) const;
  std::vector<BlockKey> cached_keys() const;
  // Checks every invariant (the three sets partition the pool, counts, LRU links, the index's
  // tree); for property tests.
  Status check_invariants() const;

 private:
  // Caller holds mu_ for all of these.
  // The longest cached prefix of `keys` (at most `limit` blocks), not retained: the shared
  // walk of allocate_cached and cached_prefix.
  Allocation match_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                          int limit);
  Status check_held(const std::vector<int>& blocks) const;
  std::vector<int> take(int count);
  void evict_lru_head();
  void lru_push_back(int block);
  void lru_unlink(int block);
  bool in_lru(int block) const { return prev_[size_t(block)] >= 0; }

  mutable std::mutex mu_;
  int block_size_;
  std::vector<int> refs_;
  std::vector<int> free_;  // A stack: recently freed blocks are reused first (warm in cache).
  // The evictable blocks' LRU list: least recently used first, through a sentinel at index
  // num_blocks; prev_ is -1 for a block not in the list.
  std::vector<int> prev_, next_;
  int lru_size_ = 0;
  PrefixIndex index_;
};

}  // namespace pdserve::engine
