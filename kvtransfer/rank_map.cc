#include "kvtransfer/rank_map.h"

#include <map>
#include <set>
#include <utility>

#include "engine/tp_shard.h"

namespace pdserve::kvtransfer {
namespace {

using engine::KvSharding;
using engine::LayerKvSpec;
using engine::Range;

// The global heads rank `rank` of `tp` holds, exactly as KvCacheLayout places them.
Range held_heads(const LayerKvSpec& s, int tp, int rank) {
  if (s.sharding == KvSharding::kReplicated) return {0, s.num_kv_heads};
  return engine::kv_heads_of_rank(s.num_kv_heads, tp, rank);
}

// Which of a head's `replicas` producer holders serves the k-th of the `consumers` consumer
// ranks that need it, in the n-th layer of its kind (same sharding and head count). Every
// branch balances the replicas' load to within one unit; the first two also keep each
// consumer's fan-in minimal and aligned with the rank ratio (docs/kvtransfer.md).
int pick_replica(int n, int k, int consumers, int replicas) {
  if (consumers % replicas == 0) return k / (consumers / replicas);  // Contiguous blocks.
  if (replicas % consumers == 0) {
    const int own = replicas / consumers;  // Each consumer rotates over its own sub-block.
    return k * own + n % own;
  }
  return static_cast<int>((int64_t(n) * consumers + k) % replicas);  // Plain round robin.
}

}  // namespace

std::vector<RankMapEntry> RankMap::entries_between(int producer_rank, int consumer_rank) const {
  std::vector<RankMapEntry> out;
  if (consumer_rank < 0 || consumer_rank >= static_cast<int>(receives.size())) return out;
  for (const RankMapEntry& e : receives[consumer_rank]) {
    if (e.producer_rank == producer_rank) out.push_back(e);
  }
  return out;
}

StatusOr<RankMap> build_rank_map(int producer_tp, int consumer_tp, const engine::KvCacheSpec& spec) {
  if (producer_tp <= 0 || consumer_tp <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank map: TP sizes must be positive (producer TP ", producer_tp,
                     ", consumer TP ", consumer_tp, ")"));
  }
  if (spec.layers.empty()) return absl::InvalidArgumentError("rank map: KV cache spec has no layers");
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerKvSpec& s = spec.layers[l];
    if (s.num_kv_heads <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank map: layer ", l, " has ", s.num_kv_heads, " KV heads"));
    }
    if (s.sharding != KvSharding::kByHead) continue;
    for (const auto& [side, tp] : {std::pair{"producer", producer_tp}, std::pair{"consumer", consumer_tp}}) {
      if (!engine::kv_heads_divide(s.num_kv_heads, tp)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank map: layer ", l, ": ", s.num_kv_heads, " KV heads cannot be spread over ",
                         side, " TP ", tp, " (one must divide the other)"));
      }
    }
  }

  RankMap map;
  map.producer_tp = producer_tp;
  map.consumer_tp = consumer_tp;
  map.spec_fingerprint = spec.fingerprint();
  map.receives.resize(consumer_tp);
  // Layers of one kind share their replica sets, so the rotation that spreads load over
  // replicas counts layers per kind rather than by layer index.
  std::map<std::pair<KvSharding, int>, int> layers_of_kind;
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerKvSpec& s = spec.layers[l];
    const int n = layers_of_kind[{s.sharding, s.num_kv_heads}]++;
    std::vector<std::vector<int>> holders(s.num_kv_heads), needers(s.num_kv_heads);
    for (int p = 0; p < producer_tp; ++p) {
      const Range r = held_heads(s, producer_tp, p);
      for (int h = r.begin; h < r.end; ++h) holders[h].push_back(p);
    }
    for (int c = 0; c < consumer_tp; ++c) {
      const Range r = held_heads(s, consumer_tp, c);
      for (int h = r.begin; h < r.end; ++h) needers[h].push_back(c);
    }
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const int consumers = static_cast<int>(needers[h].size());
      const int replicas = static_cast<int>(holders[h].size());
      for (int k = 0; k < consumers; ++k) {
        const int p = holders[h][pick_replica(n, k, consumers, replicas)];
        std::vector<RankMapEntry>& list = map.receives[needers[h][k]];
        // Heads are visited in ascending order, so a run from one producer extends in place.
        if (!list.empty() && list.back().producer_rank == p && list.back().layer == static_cast<int>(l) &&
            list.back().head_end == h) {
          ++list.back().head_end;
        } else {
          list.push_back({p, static_cast<int>(l), h, h + 1});
        }
      }
    }
  }

  std::vector<std::set<int>> out_sets(producer_tp), in_sets(consumer_tp);
  for (int c = 0; c < consumer_tp; ++c) {
    for (const RankMapEntry& e : map.receives[c]) {
      out_sets[e.producer_rank].insert(c);
      in_sets[c].insert(e.producer_rank);
    }
  }
  for (const auto& s : out_sets) map.fan_out.emplace_back(s.begin(), s.end());
  for (const auto& s : in_sets) map.fan_in.emplace_back(s.begin(), s.end());
  return map;
}

}  // namespace pdserve::kvtransfer
