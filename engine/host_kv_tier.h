// The host tier of the KV cache (docs/kv_offload.md): a second pool of blocks in host memory,
// one arena per TP rank in the same per-rank layout as the device arena, so that a block moves
// between the tiers as the same byte ranges. Its slots are a BlockAllocator of their own — the
// same exact, content-keyed index as the device's prefix cache (tokens and parent chain
// checked on every hit; evicting a slot uncaches its descendants), an LRU list of the slots no
// one reads, and KV events naming the host tier — so a block evicted from the device is found
// here, by the same keys, and copied back instead of recomputed.
//
// Chains only: a block is stored after every block before it in its sequence (stored, or
// already held), and a lookup walks from the sequence's first block; so the tier's holdings
// of a sequence are always a prefix, exact on its own, and a load continues a device hit with
// the host's blocks after it. Copies run on the caller's thread through each rank's backend,
// queued on the rank's compute stream: a store follows the step that wrote the block, a load
// precedes the step that reads it (the device→host / host→device ordering vLLM had to mend,
// vllm#45704, #47282, holds by construction). Thread-safe: the scheduler stores and loads, and
// so do the decode side's reservations (Engine::reserve_cached_blocks) on their own threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/block_allocator.h"
#include "engine/kv_cache_layout.h"
#include "engine/prefix/block_key.h"

namespace pdserve::engine {

class Backend;

class HostKvTier {
 public:
  // A rank's device side: its backend and KV arena (laid out by `layout`).
  struct DeviceRank {
    Backend* backend = nullptr;
    uint8_t* arena = nullptr;
    const KvCacheLayout* layout = nullptr;
  };
  // `bytes_per_rank` of host memory per rank (whole blocks of the device layout's size); the
  // arenas are pinned for device backends. `sink` (may be null) gets the host tier's events.
  static StatusOr<std::unique_ptr<HostKvTier>> create(std::vector<DeviceRank> device, uint64_t bytes_per_rank,
                                                      KvEventSink* sink);
  ~HostKvTier();
  HostKvTier(const HostKvTier&) = delete;
  HostKvTier& operator=(const HostKvTier&) = delete;

  // Makes blocks [0, count) of a sequence — keys[i] holding tokens[i·B, (i+1)·B) in namespace
  // `ns_root`, in device blocks device_blocks[i] — present here, copying those not held yet
  // (least recently used slots give way). Returns how many leading blocks the tier holds now
  // (fewer than `count` when every slot is being read, or on a collision).
  StatusOr<int> store(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                      std::span<const int> device_blocks, int count);
  // Copies the blocks the tier holds of keys[from, limit) (its chain from keys[0] must reach
  // them) into device_blocks[from, ...). Returns the end of the loaded run: `from` when the
  // tier holds nothing past it.
  StatusOr<int> load(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                     std::span<const int> device_blocks, int from, int limit);
  // The filesystem tier's canonical, TP-independent form of blocks [from, from + count)
  // ([layer][K|V][kv head][token][dim], engine/fs_kv_tier.h), read from the tier's slots when it
  // holds blocks [0, from + count) of the chain; nullopt otherwise.
  std::optional<std::vector<uint8_t>> export_canonical(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                                       std::span<const int32_t> tokens, int from, int count);
  // Makes blocks [from, from + count) present from their canonical form (the chain before them
  // must be held). Returns how many leading blocks the tier holds now.
  StatusOr<int> import_canonical(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                 std::span<const int32_t> tokens, int from, int count,
                                 std::span<const uint8_t> payload);
  // Slots holding a prompt's blocks `device_blocks` for the caller until release_lease():
  // pull-host's copy, which a decode worker reads from here once this returns (the bytes are in
  // host memory). The leading full blocks the tier holds already under keys[i] (in namespace
  // `ns_root`, tokens `tokens`; the write-through stored them as their step ended) are shared —
  // pinned, so no eviction takes them — and the rest, the partial last block at least, are
  // copied (every rank) into slots taken for the caller alone (uncached, so no lookup finds
  // them). ResourceExhausted (nothing taken) when too few slots are free or evictable.
  StatusOr<std::vector<int>> lease(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                   std::span<const int32_t> tokens, std::span<const int> device_blocks);
  Status release_lease(const std::vector<int>& slots) { return slots_.release(slots); }
  // Peer tier, source side (docs/kv_offload.md): the leading blocks of keys[0, limit) the tier
  // holds, pinned (no eviction takes them) for another worker to read until
  // release_peer_lease, each with its stamp: its key and cache link (slot and generation).
  struct PeerLease {
    std::vector<int> slots;
    std::vector<BlockKey> keys;
    std::vector<CachedLink> stamps;
  };
  PeerLease lease_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                         int limit);
  // Unpins a lease's slots (none when `unpin` is false: the lease ran out and unpinned them
  // already). Whether every slot still holds its key at its generation: false when one was
  // uncached (evicted and perhaps reused for other content) since the lease, so a reader's
  // copy of it may be another prompt's KV and must be dropped (vllm#52234).
  StatusOr<bool> release_peer_lease(const PeerLease& lease, bool unpin = true);
  // Whether every slot of `lease` still holds its key at its generation.
  bool stamps_hold(const PeerLease& lease) const;
  // Peer tier, reader side: `count` slots taken for the caller (uncached: no lookup finds
  // them), to receive blocks read from a peer; ResourceExhausted (none taken) when too few are
  // free or evictable. adopt() or release_lease() gives them back. A device backend's queued
  // copies out of evicted slots are done before this returns (a peer writes them next).
  StatusOr<std::vector<int>> reserve(int count);
  // Caches reserved `slots`, now holding blocks [from, from + slots.size()) of the chain
  // (keys[i] holding tokens[i·B, (i+1)·B) in namespace `ns_root`), in chain order after the
  // blocks [0, from) the tier holds, and gives them back (evictable). Slots past a break of
  // the chain (the tier does not hold [0, from), a collision) and those of blocks it holds
  // already go back uncached. Returns how many leading blocks the tier holds now.
  StatusOr<int> adopt(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                      int from, const std::vector<int>& slots);
  // Bytes of the canonical form of `count` blocks.
  uint64_t canonical_bytes(int count) const;
  // Leading blocks of keys[0, limit) the tier holds (read only).
  int held_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens);
  std::vector<BlockKey> cached_keys() const { return slots_.cached_keys(); }
  // Forgets every block (events: "cleared").
  void clear() { slots_.reset_cache(); }

  int num_blocks() const { return slots_.num_blocks(); }
  BlockAllocator::Counts counts() const { return slots_.counts(); }
  // Blocks since start: copied in and out by store and load (leases are not the tier's stores),
  // and leased: shared with the cache instead of copied, and copied.
  struct Copies {
    uint64_t stored = 0, loaded = 0;
    uint64_t lease_shared = 0, lease_copied = 0;
  };
  Copies copies() const;
  uint8_t* arena(int rank) const { return arenas_[size_t(rank)].get(); }
  const KvCacheLayout& layout(int rank) const { return layouts_[size_t(rank)]; }

 private:
  HostKvTier(std::vector<DeviceRank> device, std::vector<KvCacheLayout> layouts, int num_blocks, KvEventSink* sink);
  enum class Direction { kToHost, kToDevice };
  // Copies device block `block` and host slot `slot` of every rank one way.
  Status copy(int block, int slot, Direction direction);
  // Walks the canonical form of slots[0, n) in order, calling `f(rank, host byte offset,
  // canonical byte offset, bytes)` for every rank holding each head (`all_ranks`), or for the
  // first only; a slot of -1 is skipped (its canonical bytes too).
  template <typename F>
  void walk_canonical(std::span<const int> slots, bool all_ranks, F&& f) const;

  struct FreeArena {
    void operator()(uint8_t* p) const;
  };
  std::vector<DeviceRank> device_;
  std::vector<KvCacheLayout> layouts_;
  std::vector<std::unique_ptr<uint8_t[], FreeArena>> arenas_;
  std::vector<bool> pinned_;
  BlockAllocator slots_;                            // Thread-safe itself.
  mutable std::mutex mu_;                           // Serializes store and load (their copies and scratch).
  Copies copies_;                                   // Guarded by mu_.
  std::vector<ByteRange> from_, to_;                // copy()'s scratch, guarded by mu_.
};

}  // namespace pdserve::engine
