// The prefix cache's index over a block pool: which blocks hold which key (one canonical block
// per key, set semantics), their tokens and their parent block, so that a hit is checked
// exactly — every hit block's tokens and parent are compared, so a key collision is a counted
// miss, never wrong KV — and so that evicting a block also uncaches its descendants (nothing
// unreachable stays advertised). It knows nothing of reference counts or free lists: the
// BlockAllocator owns those and calls it under its lock. Every change is reported to the
// KvEventSink as a set transition.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/prefix/block_key.h"
#include "engine/prefix/kv_event_sink.h"

namespace pdserve::engine {

// A cached block as a chain link: the block id and its cache generation, which changes every
// time the block stops being cached, so that a stale link (the block was evicted and perhaps
// cached again for other content) is never mistaken for the block it was.
struct CachedLink {
  int block = -1;
  uint64_t generation = 0;
};

class PrefixIndex {
 public:
  // `sink` may be null (no events); its events name `tier` (the device's pool, or the host tier's).
  PrefixIndex(int num_blocks, int block_size, KvEventSink* sink, KvTier tier = KvTier::kDevice);

  // The canonical block of `key` if it holds exactly `tokens` (block_size ids) after `parent`
  // (nullopt: the chain starts at `ns_root`); nullopt on a miss. A present key whose tokens or
  // parent differ is a collision: counted, and a miss.
  std::optional<CachedLink> match(const BlockKey& key, const std::optional<CachedLink>& parent, const BlockKey& ns_root,
                                  std::span<const int32_t> tokens);

  // Makes `block` (in use by its owner, holding `tokens`) the canonical block of `key`, as
  // block `index` of its sequence after `parent` (nullopt: the chain's first block, from
  // `ns_root`). Returns the link that now stands for this content: `block`'s own; or, when
  // the key is already cached with the same tokens and parent, the existing block's (the
  // duplicate stays private to its owner); nullopt when the chain cannot go on from here (a
  // stale parent, or a collision, which is counted).
  std::optional<CachedLink> insert(int block, const BlockKey& key, const std::optional<CachedLink>& parent,
                                   const BlockKey& ns_root, uint32_t index, std::span<const int32_t> tokens);

  // Uncaches `block` and every cached descendant; appends them to `uncached` (block first).
  void uncache(int block, std::vector<int>* uncached);
  // Uncaches every block; appends them to `uncached`.
  void clear(std::vector<int>* uncached);

  // Whether `link` still names a cached block.
  bool valid(const CachedLink& link) const;
  // Whether `link` is valid and its block is cached under `key`: a peer-tier stamp, checked
  // before and after another worker reads the block (HostKvTier::PeerLease).
  bool holds(const CachedLink& link, const BlockKey& key) const {
    return valid(link) && meta_[size_t(link.block)].key == key;
  }
  bool cached(int block) const { return meta_[size_t(block)].cached; }
  size_t size() const { return map_.size(); }
  uint64_t collisions() const { return collisions_; }
  // The cached keys, in no particular order (debugging; the KV events' exactness checks).
  std::vector<BlockKey> keys() const;
  // Checks the tree: every cached block is its key's canonical block, its parent is cached
  // and lists it as a child, and child lists hold only cached blocks. For property tests.
  bool consistent() const;

 private:
  struct Meta {
    bool cached = false;
    uint64_t generation = 0;
    BlockKey key;
    BlockKey ns_root;  // For chain starts (parent -1).
    int parent = -1;
    std::vector<int> children;
  };
  bool same_content(const Meta& m, int block, const std::optional<CachedLink>& parent, const BlockKey& ns_root,
                    std::span<const int32_t> tokens) const;
  std::span<const int32_t> tokens_of(int block) const;

  int block_size_;
  KvEventSink* sink_;
  KvTier tier_;
  std::vector<Meta> meta_;
  std::vector<int32_t> tokens_;  // block_size ids per block.
  absl::flat_hash_map<BlockKey, int> map_;
  uint64_t collisions_ = 0;
};

}  // namespace pdserve::engine
