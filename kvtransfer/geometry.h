// Transfer geometry: the byte ranges that move one rank map entry (a layer's head range from one
// producer rank to one consumer rank) for a request's blocks. Every offset comes from the two
// sides' engine::KvCacheLayout, layer by layer — never from one layer's shape or a tensor — so
// a model that mixes separate, interleaved and key-only caches moves each layer by its own
// geometry (design lesson 1). The two sides share one KvCacheSpec but may differ in TP, hence
// in local head counts and strides; the ops carry the mapping between the two. See
// docs/kvtransfer.md for the ordering and coalescing rules.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache_layout.h"
#include "kvtransfer/rank_map.h"

namespace pdserve::kvtransfer {

// One contiguous copy of `length` bytes from the producer rank's KV arena at `src_offset` to
// the consumer rank's KV arena at `dst_offset` (a put in push mode, a get in pull mode).
struct CopyOp {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const CopyOp&) const = default;
};

// Appends to `out` the copies that move global heads [entry.head_begin, entry.head_end) of
// layer entry.layer — K and, unless the layer is key-only, V — from producer block
// producer_blocks[i] to consumer block consumer_blocks[i], for every i. A copy that continues
// the previous one on both sides (including the last op already in `out`) is merged into it.
// Fails when the layouts' specs differ, the block lists differ in length or hold ids outside a
// side's arena, or a side does not hold the entry's heads.
Status append_copy_ops(const engine::KvCacheLayout& producer, const engine::KvCacheLayout& consumer,
                       const RankMapEntry& entry, std::span<const int> producer_blocks,
                       std::span<const int> consumer_blocks, std::vector<CopyOp>* out);

}  // namespace pdserve::kvtransfer
