// Where every byte of one rank's paged KV cache lives. The cache of a rank is one contiguous
// arena (registered once with the transport); each layer owns a region of it laid out as its
// LayerKvSpec says. All offsets — for the attention kernels and for kvtransfer — come from
// here, computed per layer from the spec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "engine/kv_spec.h"
#include "engine/tp_shard.h"
#include "kernels/abi.h"

namespace pdserve::engine {

// Supplies rank `rank`'s KV arena of `bytes` bytes from memory someone else owns (see
// EngineOptions::kv_arena_allocator).
using KvArenaAllocator = std::function<StatusOr<void*>(int rank, size_t bytes)>;

// A byte range inside a rank's KV arena.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const ByteRange&) const = default;
};

class KvCacheLayout {
 public:
  // Lays out `num_blocks` blocks of every layer for rank `rank` of `tp`. Fails when a layer's
  // KV heads cannot be spread over `tp` ranks or the spec is malformed.
  static StatusOr<KvCacheLayout> create(const KvCacheSpec& spec, int rank, int tp, int num_blocks);

  // Bytes one block of every layer takes on one rank of `tp` (rank 0's share; all ranks hold
  // the same number of heads). Used to turn a byte budget into a block count.
  static StatusOr<uint64_t> bytes_per_block(const KvCacheSpec& spec, int tp);

  const KvCacheSpec& spec() const { return spec_; }
  // spec().fingerprint(), computed once: transfer planning checks it for every pair.
  uint64_t spec_fingerprint() const { return spec_fingerprint_; }
  int rank() const { return rank_; }
  int tp() const { return tp_; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return spec_.block_size; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  uint64_t total_bytes() const { return total_bytes_; }

  // The global KV heads this rank holds for `layer`.
  Range heads(int layer) const { return layers_[layer].heads; }
  int num_local_heads(int layer) const { return layers_[layer].heads.size(); }
  // Head dim of the part (K or V) of `layer`.
  int part_head_dim(int layer, KvPart part) const;
  // Bytes of one block's K (or V) part of `layer`.
  uint64_t part_bytes(int layer, KvPart part) const;

  // Byte offset of element [slot][local_head][0] (or its head-major equivalent) of `part` of
  // `block` in `layer`.
  uint64_t offset(int layer, KvPart part, int block, int slot, int local_head) const;
  // Distance in bytes between the same part of consecutive blocks.
  uint64_t block_stride(int layer, KvPart part) const;
  // Distance in elements between consecutive tokens (slots) and between consecutive heads.
  int64_t token_stride(int layer, KvPart part) const;
  int64_t head_stride(int layer, KvPart part) const;

  // The kernels' description of `layer` in an arena of this layout starting at `arena`: part
  // bases, element strides and storage.
  kernels::PagedLayerView view(int layer, void* arena) const;

  // Appends the byte ranges holding local heads [head_begin, head_end) of `part` of `block` in
  // `layer`, in address order, adjacent ranges merged.
  void ranges(int layer, int block, KvPart part, int head_begin, int head_end,
              std::vector<ByteRange>* out) const;

 private:
  struct LayerPlacement {
    Range heads;
    uint64_t base = 0;        // Start of the layer's region in the arena.
    uint64_t k_bytes = 0;     // One block's K part.
    uint64_t v_bytes = 0;     // One block's V part (0 for key-only).
  };
  KvCacheSpec spec_;
  uint64_t spec_fingerprint_ = 0;
  int rank_ = 0, tp_ = 1, num_blocks_ = 0;
  uint64_t total_bytes_ = 0;
  std::vector<LayerPlacement> layers_;
};

}  // namespace pdserve::engine
