// The rank map of a prefill (producer) → decode (consumer) pair of TP groups: which producer
// rank sends which KV heads of which layer to which consumer rank, and the resulting fan-out
// and fan-in sets. It is a pure function of (producer TP, consumer TP, KV spec), so both sides
// and the router compute the same map without exchanging it, and it can be table-tested
// (design lesson 3: heterogeneous TP needs fan-in and fan-out bookkeeping that is right by
// construction). Head ownership comes from engine/tp_shard.h, as the engine's own sharding does.
// See docs/kvtransfer.md for the rules and why.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/kv_spec.h"

namespace pdserve::kvtransfer {

// One producer rank sends global KV heads [head_begin, head_end) of `layer` to a consumer rank.
struct RankMapEntry {
  int producer_rank = 0;
  int layer = 0;
  int head_begin = 0;
  int head_end = 0;
  bool operator==(const RankMapEntry&) const = default;
};

// A plain struct (not a class) so that tests can build or corrupt one by hand.
struct RankMap {
  int producer_tp = 0;
  int consumer_tp = 0;
  // KvCacheSpec::fingerprint() of the spec the map was built for; planning against layouts of
  // any other spec is refused.
  uint64_t spec_fingerprint = 0;
  // receives[c]: what consumer rank c receives, ordered by (layer, head_begin). Together they
  // cover every head every consumer rank holds, each exactly once.
  std::vector<std::vector<RankMapEntry>> receives;
  // fan_out[p]: consumer ranks producer rank p sends to (ascending). In pull mode p frees a
  // request's blocks only once all of them released it.
  std::vector<std::vector<int>> fan_out;
  // fan_in[c]: producer ranks consumer rank c receives from (ascending). Consumer rank c is
  // ready only when all of them sealed.
  std::vector<std::vector<int>> fan_in;

  // The entries producer rank `producer_rank` sends to consumer rank `consumer_rank`, in
  // receives[] order; empty when the pair exchanges nothing.
  std::vector<RankMapEntry> entries_between(int producer_rank, int consumer_rank) const;
};

// Builds the map. Fails (InvalidArgument) when a TP size is not positive, the spec has no
// layers, or a head-sharded layer's KV heads cannot be spread over either TP size.
StatusOr<RankMap> build_rank_map(int producer_tp, int consumer_tp, const engine::KvCacheSpec& spec);

}  // namespace pdserve::kvtransfer
