// Rank map: table tests over TP sizes and head counts, hand-written tables, and errors.
#include "kvtransfer/rank_map.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "engine/tp_shard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using engine::KvCacheSpec;
using engine::KvSharding;
using engine::LayerKvSpec;
using engine::Range;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

KvCacheSpec uniform_spec(int heads, int layers, KvSharding sharding = KvSharding::kByHead) {
  KvCacheSpec spec;
  LayerKvSpec s;
  s.sharding = sharding;
  s.num_kv_heads = heads;
  s.head_dim = 4;
  s.v_head_dim = 4;
  spec.layers.assign(layers, s);
  return spec;
}

Range held(const LayerKvSpec& s, int tp, int rank) {
  if (s.sharding == KvSharding::kReplicated) return {0, s.num_kv_heads};
  return engine::kv_heads_of_rank(s.num_kv_heads, tp, rank);
}

// Checks every invariant the transport and sessions rely on; returns a description of the
// first violation, or "" when there is none.
std::string check_invariants(const RankMap& map, int P, int C, const KvCacheSpec& spec) {
  auto where = [](int c, const RankMapEntry& e) {
    return absl::StrCat(" (consumer ", c, ", producer ", e.producer_rank, ", layer ", e.layer, ", heads [",
                        e.head_begin, ", ", e.head_end, "))");
  };
  if (map.producer_tp != P || map.consumer_tp != C) return "wrong TP sizes";
  if (map.spec_fingerprint != spec.fingerprint()) return "wrong fingerprint";
  if (int(map.receives.size()) != C || int(map.fan_in.size()) != C || int(map.fan_out.size()) != P)
    return "wrong table sizes";
  // Units received: (consumer, layer, head) -> count.
  std::map<std::tuple<int, int, int>, int> received;
  std::vector<std::set<int>> out_sets(P), in_sets(C);
  for (int c = 0; c < C; ++c) {
    const RankMapEntry* prev = nullptr;
    for (const RankMapEntry& e : map.receives[c]) {
      if (e.producer_rank < 0 || e.producer_rank >= P) return "producer rank out of range" + where(c, e);
      if (e.layer < 0 || e.layer >= int(spec.layers.size())) return "layer out of range" + where(c, e);
      if (e.head_begin >= e.head_end) return "empty head range" + where(c, e);
      if (prev && std::tie(prev->layer, prev->head_begin) >= std::tie(e.layer, e.head_begin))
        return "entries not ordered" + where(c, e);
      const LayerKvSpec& s = spec.layers[e.layer];
      const Range src = held(s, P, e.producer_rank), dst = held(s, C, c);
      if (e.head_begin < src.begin || e.head_end > src.end) return "producer does not hold the heads" + where(c, e);
      if (e.head_begin < dst.begin || e.head_end > dst.end) return "consumer does not hold the heads" + where(c, e);
      for (int h = e.head_begin; h < e.head_end; ++h) ++received[{c, e.layer, h}];
      out_sets[e.producer_rank].insert(c);
      in_sets[c].insert(e.producer_rank);
      prev = &e;
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int l = 0; l < int(spec.layers.size()); ++l) {
      const Range r = held(spec.layers[l], C, c);
      for (int h = r.begin; h < r.end; ++h) {
        const auto it = received.find({c, l, h});
        if (it == received.end() || it->second != 1)
          return absl::StrCat("consumer ", c, " layer ", l, " head ", h, " received ",
                              it == received.end() ? 0 : it->second, " times");
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    if (map.fan_out[p] != std::vector<int>(out_sets[p].begin(), out_sets[p].end()))
      return absl::StrCat("fan_out[", p, "] inconsistent with the entries");
  }
  for (int c = 0; c < C; ++c) {
    if (map.fan_in[c] != std::vector<int>(in_sets[c].begin(), in_sets[c].end()))
      return absl::StrCat("fan_in[", c, "] inconsistent with the entries");
    for (int p : map.fan_in[c]) {
      if (!out_sets[p].count(c)) return "fan_in and fan_out disagree";
    }
  }
  return "";
}

// Load balance: among the replicas of one head in layers of one kind (sharding, head count),
// the number of (consumer, layer, head) units each serves differs by at most one, over all
// such layers and within each layer.
std::string check_balance(const RankMap& map, int P, int C, const KvCacheSpec& spec) {
  // (sharding, heads, head, layer or -1 for all layers of the kind) -> producer -> units.
  std::map<std::tuple<KvSharding, int, int, int>, std::map<int, int>> load;
  for (int l = 0; l < int(spec.layers.size()); ++l) {
    const LayerKvSpec& s = spec.layers[l];
    for (int p = 0; p < P; ++p) {
      const Range r = held(s, P, p);
      for (int h = r.begin; h < r.end; ++h) {
        load[{s.sharding, s.num_kv_heads, h, l}][p] += 0;
        load[{s.sharding, s.num_kv_heads, h, -1}][p] += 0;
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    for (const RankMapEntry& e : map.receives[c]) {
      const LayerKvSpec& s = spec.layers[e.layer];
      for (int h = e.head_begin; h < e.head_end; ++h) {
        ++load[{s.sharding, s.num_kv_heads, h, e.layer}][e.producer_rank];
        ++load[{s.sharding, s.num_kv_heads, h, -1}][e.producer_rank];
      }
    }
  }
  for (const auto& [key, per_rank] : load) {
    int lo = 1 << 30, hi = 0;
    for (const auto& [p, n] : per_rank) lo = std::min(lo, n), hi = std::max(hi, n);
    if (hi - lo > 1) {
      return absl::StrCat("replicas of head ", std::get<2>(key), " (", std::get<1>(key), " heads, layer ",
                          std::get<3>(key), ") serve between ", lo, " and ", hi, " units");
    }
  }
  return "";
}

TEST(RankMapTest, TableOverTpAndHeads) {
  // Powers of two always divide one way or the other, so every combination is valid.
  for (int P : {1, 2, 4, 8}) {
    for (int C : {1, 2, 4, 8}) {
      for (int H : {1, 2, 4, 8, 16}) {
        SCOPED_TRACE(absl::StrCat("P=", P, " C=", C, " H=", H));
        const KvCacheSpec spec = uniform_spec(H, 6);
        StatusOr<RankMap> map = build_rank_map(P, C, spec);
        ASSERT_TRUE(map.ok()) << map.status();
        EXPECT_EQ(check_invariants(*map, P, C, spec), "");
        EXPECT_EQ(check_balance(*map, P, C, spec), "");
        if (P == C) {
          // Equal TP pairs rank c with rank c: no fan-in, no fan-out.
          for (int c = 0; c < C; ++c) EXPECT_THAT(map->fan_in[c], ElementsAre(c));
        }
      }
    }
  }
}

TEST(RankMapTest, NonPowerOfTwoTpStaysExactAndBalanced) {
  for (int P : {1, 2, 3, 4, 6, 8, 12}) {
    for (int C : {1, 2, 3, 4, 6, 8, 12}) {
      for (int H : {1, 2, 3, 4, 6, 12}) {
        if (!engine::kv_heads_divide(H, P) || !engine::kv_heads_divide(H, C)) continue;
        SCOPED_TRACE(absl::StrCat("P=", P, " C=", C, " H=", H));
        for (KvSharding sharding : {KvSharding::kByHead, KvSharding::kReplicated}) {
          const KvCacheSpec spec = uniform_spec(H, 7, sharding);
          StatusOr<RankMap> map = build_rank_map(P, C, spec);
          ASSERT_TRUE(map.ok()) << map.status();
          EXPECT_EQ(check_invariants(*map, P, C, spec), "");
          EXPECT_EQ(check_balance(*map, P, C, spec), "");
        }
      }
    }
  }
}

TEST(RankMapTest, MixedSpecOverAllTp) {
  const KvCacheSpec spec = testing::mixed_spec();
  for (int P : {1, 2, 4, 8}) {
    for (int C : {1, 2, 4, 8}) {
      SCOPED_TRACE(absl::StrCat("P=", P, " C=", C));
      StatusOr<RankMap> map = build_rank_map(P, C, spec);
      ASSERT_TRUE(map.ok()) << map.status();
      EXPECT_EQ(check_invariants(*map, P, C, spec), "");
      EXPECT_EQ(check_balance(*map, P, C, spec), "");
    }
  }
}

TEST(RankMapTest, HandTableP4C8H8) {
  // Producer p holds heads {2p, 2p+1}; consumer c holds head c, so it reads from p = c/2 and
  // each producer rank fans out to two consumer ranks.
  const RankMap map = build_rank_map(4, 8, uniform_spec(8, 2)).value();
  for (int c = 0; c < 8; ++c) {
    EXPECT_THAT(map.receives[c], ElementsAre(RankMapEntry{c / 2, 0, c, c + 1}, RankMapEntry{c / 2, 1, c, c + 1}));
    EXPECT_THAT(map.fan_in[c], ElementsAre(c / 2));
  }
  for (int p = 0; p < 4; ++p) EXPECT_THAT(map.fan_out[p], ElementsAre(2 * p, 2 * p + 1));
}

TEST(RankMapTest, HandTableP8C4H4) {
  // Head h lives on producers {2h, 2h+1}; consumer c holds head c and takes alternate layers
  // from each of its two replicas, so both replicas' links carry half the layers.
  const RankMap map = build_rank_map(8, 4, uniform_spec(4, 4)).value();
  for (int c = 0; c < 4; ++c) {
    EXPECT_THAT(map.receives[c],
                ElementsAre(RankMapEntry{2 * c, 0, c, c + 1}, RankMapEntry{2 * c + 1, 1, c, c + 1},
                            RankMapEntry{2 * c, 2, c, c + 1}, RankMapEntry{2 * c + 1, 3, c, c + 1}));
    EXPECT_THAT(map.fan_in[c], ElementsAre(2 * c, 2 * c + 1));
  }
  for (int p = 0; p < 8; ++p) EXPECT_THAT(map.fan_out[p], ElementsAre(p / 2));
}

TEST(RankMapTest, HandTableP8C2H2) {
  // Head h lives on producers 4h..4h+3; consumer c holds head c and rotates over all four.
  const RankMap map = build_rank_map(8, 2, uniform_spec(2, 5)).value();
  EXPECT_THAT(map.receives[0],
              ElementsAre(RankMapEntry{0, 0, 0, 1}, RankMapEntry{1, 1, 0, 1}, RankMapEntry{2, 2, 0, 1},
                          RankMapEntry{3, 3, 0, 1}, RankMapEntry{0, 4, 0, 1}));
  EXPECT_THAT(map.receives[1],
              ElementsAre(RankMapEntry{4, 0, 1, 2}, RankMapEntry{5, 1, 1, 2}, RankMapEntry{6, 2, 1, 2},
                          RankMapEntry{7, 3, 1, 2}, RankMapEntry{4, 4, 1, 2}));
  EXPECT_THAT(map.fan_in[0], ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(map.fan_in[1], ElementsAre(4, 5, 6, 7));
  for (int p = 0; p < 8; ++p) EXPECT_THAT(map.fan_out[p], ElementsAre(p / 4));
}

TEST(RankMapTest, HandTableFanInOfSeveralProducersPerLayer) {
  // P=2, C=1, H=4: the single consumer gathers each layer from both producer ranks.
  const RankMap map = build_rank_map(2, 1, uniform_spec(4, 1)).value();
  EXPECT_THAT(map.receives[0], ElementsAre(RankMapEntry{0, 0, 0, 2}, RankMapEntry{1, 0, 2, 4}));
  EXPECT_THAT(map.fan_in[0], ElementsAre(0, 1));
  EXPECT_THAT(map.fan_out[0], ElementsAre(0));
  EXPECT_THAT(map.fan_out[1], ElementsAre(0));
}

TEST(RankMapTest, HandTableConsumerReplicas) {
  // P=1, C=4, H=2: consumer c holds head c/2 (two replicas each); all read the one producer.
  const RankMap map = build_rank_map(1, 4, uniform_spec(2, 1)).value();
  for (int c = 0; c < 4; ++c) EXPECT_THAT(map.receives[c], ElementsAre(RankMapEntry{0, 0, c / 2, c / 2 + 1}));
  EXPECT_THAT(map.fan_out[0], ElementsAre(0, 1, 2, 3));
}

TEST(RankMapTest, HandTableReplicatedLayers) {
  // Every rank holds the whole layer. Fewer producers: consumer c reads producer c*P/C, the
  // same one it would read a head-sharded layer from. More producers: each consumer rotates
  // over its own P/C producers.
  const RankMap up = build_rank_map(2, 4, uniform_spec(2, 2, KvSharding::kReplicated)).value();
  for (int c = 0; c < 4; ++c) {
    EXPECT_THAT(up.receives[c], ElementsAre(RankMapEntry{c / 2, 0, 0, 2}, RankMapEntry{c / 2, 1, 0, 2}));
  }
  const RankMap down = build_rank_map(4, 2, uniform_spec(2, 2, KvSharding::kReplicated)).value();
  EXPECT_THAT(down.receives[0], ElementsAre(RankMapEntry{0, 0, 0, 2}, RankMapEntry{1, 1, 0, 2}));
  EXPECT_THAT(down.receives[1], ElementsAre(RankMapEntry{2, 0, 0, 2}, RankMapEntry{3, 1, 0, 2}));
}

TEST(RankMapTest, ReplicaRotationCountsLayersOfOneKind) {
  // Layers of another kind in between must not disturb the rotation over replicas: layers 0
  // and 2 (2 heads over P=4) still alternate their replicas.
  KvCacheSpec spec = uniform_spec(2, 3);
  spec.layers[1].num_kv_heads = 4;
  const RankMap map = build_rank_map(4, 1, spec).value();
  EXPECT_THAT(map.receives[0],
              ElementsAre(RankMapEntry{0, 0, 0, 1}, RankMapEntry{2, 0, 1, 2}, RankMapEntry{0, 1, 0, 1},
                          RankMapEntry{1, 1, 1, 2}, RankMapEntry{2, 1, 2, 3}, RankMapEntry{3, 1, 3, 4},
                          RankMapEntry{1, 2, 0, 1}, RankMapEntry{3, 2, 1, 2}));
}

TEST(RankMapTest, EntriesBetween) {
  const RankMap map = build_rank_map(2, 1, uniform_spec(4, 2)).value();
  EXPECT_THAT(map.entries_between(1, 0), ElementsAre(RankMapEntry{1, 0, 2, 4}, RankMapEntry{1, 1, 2, 4}));
  EXPECT_TRUE(map.entries_between(0, 1).empty());
  EXPECT_TRUE(map.entries_between(5, 0).empty());
}

TEST(RankMapTest, RejectsInvalidTp) {
  StatusOr<RankMap> map = build_rank_map(3, 2, uniform_spec(4, 2));
  EXPECT_EQ(map.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(map.status().message()), HasSubstr("layer 0: 4 KV heads cannot be spread over producer TP 3"));

  map = build_rank_map(3, 8, uniform_spec(3, 1));
  EXPECT_THAT(std::string(map.status().message()), HasSubstr("consumer TP 8"));

  KvCacheSpec mixed = uniform_spec(4, 2);
  mixed.layers[1].num_kv_heads = 6;
  map = build_rank_map(4, 4, mixed);
  EXPECT_THAT(std::string(map.status().message()), HasSubstr("layer 1: 6 KV heads"));

  EXPECT_FALSE(build_rank_map(0, 2, uniform_spec(4, 1)).ok());
  EXPECT_FALSE(build_rank_map(2, -1, uniform_spec(4, 1)).ok());
  EXPECT_FALSE(build_rank_map(2, 2, KvCacheSpec{}).ok());
  // A replicated layer has no divisibility constraint.
  EXPECT_TRUE(build_rank_map(4, 8, uniform_spec(3, 1, KvSharding::kReplicated)).ok());
}

}  // namespace
}  // namespace pdserve::kvtransfer
