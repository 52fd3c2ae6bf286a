// The transfer plan of one request between one producer rank and one consumer rank: every copy
// the pair exchanges, grouped by layer so that push mode can post a layer's copies as soon as
// the forward pass has computed it, with the byte and op totals the session seals (design
// lesson 2: the producer seals the count of writes it actually scheduled). The UCX transport
// posts each CopyOp as one put (push) or get (pull).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache_layout.h"
#include "kvtransfer/geometry.h"
#include "kvtransfer/rank_map.h"

namespace pdserve::kvtransfer {

// The copies of one layer.
struct LayerCopies {
  std::vector<CopyOp> ops;
  uint64_t bytes = 0;
};

struct TransferPlan {
  int producer_rank = 0;
  int consumer_rank = 0;
  // Indexed by layer (one per spec layer); empty for layers the pair does not exchange.
  std::vector<LayerCopies> layers;
  uint64_t total_bytes = 0;
  uint64_t total_ops = 0;
};

// The request blocks a transfer that starts at request block `skip_blocks` moves: [k, n) of
// `blocks`. Prefix reuse: the consumer's first k blocks already hold that KV (its own prefix
// cache), so neither side plans, moves, counts or checksums them. Fails unless 0 <= k <= n.
StatusOr<std::span<const int>> sent_blocks(std::span<const int> blocks, int skip_blocks);

// Plans the request whose KV sits in producer blocks `producer_blocks` and goes to consumer
// blocks `consumer_blocks` (block i ↔ block i), from request block `skip_blocks` on (see
// sent_blocks(): only blocks [k, n) are planned, so the totals count only what is sent). `producer` and `consumer` are the two ranks'
// cache layouts; they must be of ranks `producer_rank` and `consumer_rank` of the map's TP
// sizes and of the spec the map was built for. A pair that exchanges nothing gets an empty
// plan. Fails on any mismatch, or when a consumer block appears twice (two copies would land
// in one block).
StatusOr<TransferPlan> plan_for_pair(int producer_rank, int consumer_rank, const RankMap& map,
                                     const engine::KvCacheLayout& producer,
                                     const engine::KvCacheLayout& consumer,
                                     std::span<const int> producer_blocks,
                                     std::span<const int> consumer_blocks,
                                     int skip_blocks = 0);

}  // namespace pdserve::kvtransfer
