#include "engine/host_kv_tier.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/logging.h"
#include "engine/backend.h"

namespace pdserve::engine {

void HostKvTier::FreeArena::operator()(uint8_t* p) const { std::free(p); }

StatusOr<std::unique_ptr<HostKvTier>> HostKvTier::create(std::vector<DeviceRank> device, uint64_t bytes_per_rank,
                                                         KvEventSink* sink) {
  if (device.empty()) return absl::InvalidArgumentError("a host tier needs at least one rank");
  const KvCacheLayout& d0 = *device[0].layout;
  PD_ASSIGN_OR_RETURN(const uint64_t block_bytes, KvCacheLayout::bytes_per_block(d0.spec(), d0.tp()));
  const uint64_t num_blocks = bytes_per_rank / block_bytes;
  if (num_blocks == 0)
    return absl::InvalidArgumentError(absl::StrCat("--host-kv-bytes ", bytes_per_rank,
                                                   " holds no block (a block takes ", block_bytes, " bytes per rank)"));
  if (num_blocks > (1u << 30)) return absl::InvalidArgumentError("--host-kv-bytes too large");
  std::vector<KvCacheLayout> layouts;
  for (const DeviceRank& r : device) {
    PD_ASSIGN_OR_RETURN(KvCacheLayout l,
                        KvCacheLayout::create(r.layout->spec(), r.layout->rank(), r.layout->tp(), int(num_blocks)));
    layouts.push_back(std::move(l));
  }
  auto tier = std::unique_ptr<HostKvTier>(new HostKvTier(std::move(device), std::move(layouts), int(num_blocks), sink));
  for (size_t r = 0; r < tier->device_.size(); ++r) {
    const uint64_t bytes = tier->layouts_[r].total_bytes();
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr)
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of host tier"));
    std::memset(p, 0, bytes);
    tier->arenas_.emplace_back(static_cast<uint8_t*>(p));
    Backend& backend = *tier->device_[r].backend;
    // Page-locked for a device backend, so that its copies run at DMA speed.
    const bool pin = !backend.host_memory();
    if (pin) PD_RETURN_IF_ERROR(backend.pin_host_memory(p, bytes));
    tier->pinned_.push_back(pin);
  }
  return tier;
}

HostKvTier::HostKvTier(std::vector<DeviceRank> device, std::vector<KvCacheLayout> layouts, int num_blocks,
                       KvEventSink* sink)
    : device_(std::move(device)),
      layouts_(std::move(layouts)),
      slots_(num_blocks, layouts_[0].block_size(), sink, KvTier::kHost) {}

HostKvTier::~HostKvTier() {
  for (size_t r = 0; r < arenas_.size(); ++r)
    if (pinned_[r]) device_[r].backend->unpin_host_memory(arenas_[r].get());
}

Status HostKvTier::copy(int block, int slot, Direction direction) {
  for (size_t r = 0; r < device_.size(); ++r) {
    const KvCacheLayout& dl = *device_[r].layout;
    const KvCacheLayout& hl = layouts_[r];
    Backend& backend = *device_[r].backend;
    uint8_t* host = arenas_[r].get();
    for (int l = 0; l < dl.num_layers(); ++l) {
      for (KvPart part : {KvPart::kK, KvPart::kV}) {
        if (dl.part_bytes(l, part) == 0) continue;
        from_.clear();
        to_.clear();
        dl.ranges(l, block, part, 0, dl.num_local_heads(l), &from_);
        hl.ranges(l, slot, part, 0, hl.num_local_heads(l), &to_);
        // The same bytes in the same order on both sides, though runs may merge differently
        // (adjacency depends on each arena's block count): walk both lists together.
        size_t i = 0, j = 0;
        uint64_t di = 0, hj = 0;
        while (i < from_.size() && j < to_.size()) {
          const uint64_t n = std::min(from_[i].length - di, to_[j].length - hj);
          uint8_t* d = device_[r].arena + from_[i].offset + di;
          uint8_t* h = host + to_[j].offset + hj;
          PD_RETURN_IF_ERROR(direction == Direction::kToHost ? backend.copy_to_host(h, d, n)
                                                             : backend.copy_to_device(d, h, n));
          di += n;
          hj += n;
          if (di == from_[i].length) ++i, di = 0;
          if (hj == to_[j].length) ++j, hj = 0;
        }
        if (i != from_.size() || j != to_.size())
          return absl::InternalError("host tier and device layouts disagree on a block's bytes");
      }
    }
  }
  return absl::OkStatus();
}

StatusOr<int> HostKvTier::store(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                std::span<const int32_t> tokens, std::span<const int> device_blocks, int count) {
  std::lock_guard lock(mu_);
  const int b = layouts_[0].block_size();
  count = std::min({count, int(keys.size()), int(device_blocks.size()), int(tokens.size()) / b});
  // Held while the rest is stored: a slot taken below must not evict the chain it extends.
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys.first(size_t(count)), ns_root, tokens);
  std::vector<int> slots = held.blocks;
  std::optional<CachedLink> parent = held.last_hit;
  int held_now = int(slots.size());
  Status error;
  for (int i = held_now; i < count; ++i) {
    auto slot = slots_.allocate(1);
    if (!slot.ok()) break;  // Every slot is being read: the rest stays on the device only.
    const int s = slot->front();
    slots.push_back(s);
    error = copy(device_blocks[size_t(i)], s, Direction::kToHost);
    if (!error.ok()) break;  // The slot stays uncached and goes back free.
    ++copies_.stored;
    parent = slots_.cache(s, keys[size_t(i)], parent, ns_root, uint32_t(i), tokens.subspan(size_t(i) * b, size_t(b)));
    if (!parent) break;  // A collision: the chain cannot go on here.
    held_now = i + 1;
  }
  // Released in chain order: the deepest blocks become the least recently used.
  PD_RETURN_IF_ERROR(slots_.release(slots));
  PD_RETURN_IF_ERROR(error);
  return held_now;
}

StatusOr<int> HostKvTier::load(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens,
                               std::span<const int> device_blocks, int from, int limit) {
  limit = std::min({limit, int(keys.size()), int(device_blocks.size())});
  if (from >= limit) return from;
  std::lock_guard lock(mu_);
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys.first(size_t(limit)), ns_root, tokens);
  int end = from;
  Status error;
  for (int i = from; i < int(held.blocks.size()); ++i) {
    error = copy(device_blocks[size_t(i)], held.blocks[size_t(i)], Direction::kToDevice);
    if (!error.ok()) break;
    ++copies_.loaded;
    end = i + 1;
  }
  PD_RETURN_IF_ERROR(slots_.release(held.blocks));
  PD_RETURN_IF_ERROR(error);
  return end;
}

StatusOr<std::vector<int>> HostKvTier::lease(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                             std::span<const int32_t> tokens, std::span<const int> device_blocks) {
  std::lock_guard lock(mu_);
  keys = keys.first(std::min(keys.size(), device_blocks.size()));
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys, ns_root, tokens);
  const size_t shared = held.blocks.size();
  StatusOr<std::vector<int>> fresh = slots_.allocate(int(device_blocks.size() - shared));
  if (!fresh.ok()) {
    (void)slots_.release(held.blocks);
    return fresh.status();
  }
  std::vector<int> slots = std::move(held.blocks);
  slots.insert(slots.end(), fresh->begin(), fresh->end());
  Status error;
  for (size_t i = shared; i < slots.size() && error.ok(); ++i)
    error = copy(device_blocks[i], slots[i], Direction::kToHost);
  // A device backend queues the copies on its stream, and the reader is another process; after
  // a failed copy too, before the slots can be taken again.
  for (size_t r = 0; r < device_.size(); ++r)
    if (!device_[r].backend->host_memory()) {
      const Status synced = device_[r].backend->synchronize();
      if (error.ok()) error = synced;
    }
  if (!error.ok()) {
    (void)slots_.release(slots);
    return error;
  }
  copies_.lease_shared += shared;
  copies_.lease_copied += slots.size() - shared;
  return slots;
}

HostKvTier::PeerLease HostKvTier::lease_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                               std::span<const int32_t> tokens, int limit) {
  keys = keys.first(std::min(keys.size(), size_t(std::max(limit, 0))));
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys, ns_root, tokens);
  PeerLease lease;
  lease.slots = std::move(held.blocks);
  lease.keys.assign(keys.begin(), keys.begin() + ptrdiff_t(lease.slots.size()));
  lease.stamps = std::move(held.hits);
  return lease;
}

bool HostKvTier::stamps_hold(const PeerLease& lease) const {
  for (size_t i = 0; i < lease.stamps.size(); ++i)
    if (!slots_.holds(lease.stamps[i], lease.keys[i])) return false;
  return true;
}

StatusOr<bool> HostKvTier::release_peer_lease(const PeerLease& lease, bool unpin) {
  // Checked before unpinning: once unpinned, an eviction may take a slot at any moment, which
  // says nothing about the read that ended before.
  const bool intact = stamps_hold(lease);
  if (unpin) PD_RETURN_IF_ERROR(slots_.release(lease.slots));
  return intact;
}

StatusOr<std::vector<int>> HostKvTier::reserve(int count) {
  std::lock_guard lock(mu_);
  PD_ASSIGN_OR_RETURN(std::vector<int> slots, slots_.allocate(count));
  // A load's host→device copies are queued on the rank's stream and may still read a slot that
  // was evictable; another process writes these next.
  for (size_t r = 0; r < device_.size(); ++r)
    if (!device_[r].backend->host_memory()) {
      if (Status s = device_[r].backend->synchronize(); !s.ok()) {
        (void)slots_.release(slots);
        return s;
      }
    }
  return slots;
}

StatusOr<int> HostKvTier::adopt(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                std::span<const int32_t> tokens, int from, const std::vector<int>& slots) {
  std::lock_guard lock(mu_);
  const int b = layouts_[0].block_size();
  const int end = std::min({from + int(slots.size()), int(keys.size()), int(tokens.size()) / b});
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys.first(size_t(std::max(end, 0))), ns_root, tokens);
  int held_now = int(held.blocks.size());
  if (held_now >= from) {  // Blocks the tier came to hold meanwhile keep their slots.
    std::optional<CachedLink> parent = held.last_hit;
    for (int i = held_now; i < end; ++i) {
      parent = slots_.cache(slots[size_t(i - from)], keys[size_t(i)], parent, ns_root, uint32_t(i),
                            tokens.subspan(size_t(i) * b, size_t(b)));
      if (!parent) break;
      held_now = i + 1;
    }
  }
  const Status unheld = slots_.release(held.blocks);
  PD_RETURN_IF_ERROR(slots_.release(slots));
  PD_RETURN_IF_ERROR(unheld);
  return held_now;
}

HostKvTier::Copies HostKvTier::copies() const {
  std::lock_guard lock(mu_);
  return copies_;
}

template <typename F>
void HostKvTier::walk_canonical(std::span<const int> slots, bool all_ranks, F&& f) const {
  const KvCacheSpec& spec = layouts_[0].spec();
  const int b = spec.block_size;
  uint64_t at = 0;
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const LayerKvSpec& ls = spec.layers[size_t(l)];
    for (KvPart part : {KvPart::kK, KvPart::kV}) {
      if (part == KvPart::kV && !ls.has_v()) continue;
      const uint64_t row = uint64_t(layouts_[0].part_head_dim(l, part)) * dtype_size(ls.dtype);
      for (int h = 0; h < ls.num_kv_heads; ++h) {
        for (size_t j = 0; j < slots.size(); ++j) {
          for (int t = 0; t < b; ++t, at += row) {
            if (slots[j] < 0) continue;  // Not to be copied (its bytes are still skipped).
            for (size_t r = 0; r < layouts_.size(); ++r) {
              const Range heads = layouts_[r].heads(l);
              if (h < heads.begin || h >= heads.end) continue;
              f(int(r), layouts_[r].offset(l, part, slots[j], t, h - heads.begin), at, row);
              if (!all_ranks) break;
            }
          }
        }
      }
    }
  }
}

uint64_t HostKvTier::canonical_bytes(int count) const {
  const KvCacheSpec& spec = layouts_[0].spec();
  uint64_t bytes = 0;
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const LayerKvSpec& ls = spec.layers[size_t(l)];
    for (KvPart part : {KvPart::kK, KvPart::kV})
      if (part == KvPart::kK || ls.has_v())
        bytes += uint64_t(layouts_[0].part_head_dim(l, part)) * dtype_size(ls.dtype) * ls.num_kv_heads;
  }
  return bytes * uint64_t(spec.block_size) * uint64_t(count);
}

std::optional<std::vector<uint8_t>> HostKvTier::export_canonical(std::span<const BlockKey> keys,
                                                                 const BlockKey& ns_root,
                                                                 std::span<const int32_t> tokens, int from, int count) {
  std::lock_guard lock(mu_);
  if (from + count > int(keys.size())) return std::nullopt;
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys.first(size_t(from + count)), ns_root, tokens);
  std::optional<std::vector<uint8_t>> out;
  if (int(held.blocks.size()) == from + count) {
    out.emplace(canonical_bytes(count));
    walk_canonical(std::span<const int>(held.blocks).subspan(size_t(from)), false,
                   [&](int rank, uint64_t host_at, uint64_t at, uint64_t n) {
                     std::memcpy(out->data() + at, arenas_[size_t(rank)].get() + host_at, n);
                   });
  }
  (void)slots_.release(held.blocks);
  return out;
}

StatusOr<int> HostKvTier::import_canonical(std::span<const BlockKey> keys, const BlockKey& ns_root,
                                           std::span<const int32_t> tokens, int from, int count,
                                           std::span<const uint8_t> payload) {
  if (payload.size() != canonical_bytes(count))
    return absl::InvalidArgumentError(absl::StrCat("a canonical payload of ", payload.size(), " bytes for ", count,
                                                   " blocks (", canonical_bytes(count), " expected)"));
  std::lock_guard lock(mu_);
  const int b = layouts_[0].block_size();
  const int end = std::min({from + count, int(keys.size()), int(tokens.size()) / b});
  BlockAllocator::Allocation held = slots_.acquire_prefix(keys.first(size_t(end)), ns_root, tokens);
  std::vector<int> slots = held.blocks;
  int held_now = int(slots.size());
  if (held_now >= from && held_now < end) {
    // The chunk's blocks not held yet get fresh slots (-1: held, or no slot free), filled from
    // the payload, then cached in chain order.
    std::vector<int> chunk_slots(size_t(count), -1);
    for (int i = held_now; i < end; ++i) {
      auto slot = slots_.allocate(1);
      if (!slot.ok()) break;
      chunk_slots[size_t(i - from)] = slot->front();
      slots.push_back(slot->front());
    }
    walk_canonical(chunk_slots, true, [&](int rank, uint64_t host_at, uint64_t at, uint64_t n) {
      std::memcpy(arenas_[size_t(rank)].get() + host_at, payload.data() + at, n);
    });
    std::optional<CachedLink> parent = held.last_hit;
    for (int i = held_now; i < end && chunk_slots[size_t(i - from)] >= 0; ++i) {
      parent = slots_.cache(chunk_slots[size_t(i - from)], keys[size_t(i)], parent, ns_root, uint32_t(i),
                            tokens.subspan(size_t(i) * b, size_t(b)));
      if (!parent) break;
      held_now = i + 1;
    }
  }
  PD_RETURN_IF_ERROR(slots_.release(slots));
  return held_now;
}

int HostKvTier::held_prefix(std::span<const BlockKey> keys, const BlockKey& ns_root, std::span<const int32_t> tokens) {
  return slots_.cached_prefix(keys, ns_root, tokens);
}

}  // namespace pdserve::engine
