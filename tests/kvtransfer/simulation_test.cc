// End-to-end byte simulation of rank map + geometry + plan over every TP pair, and mutation
// tests showing that the simulation catches a wrong geometry or a wrong rank map.
#include <utility>

#include "engine/kv_cache_layout.h"
#include "gtest/gtest.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using engine::KvCacheSpec;
using testing::SimFaults;
using testing::SimReport;
using testing::SimRequest;

// Blocks 5,6 -> 2,3 are consecutive on both sides (their copies may merge); the rest are not.
SimRequest scattered(int P, int C) { return {P, C, 7, 9, {5, 6, 0, 3}, {2, 3, 8, 4}}; }
SimRequest consecutive(int P, int C) { return {P, C, 6, 6, {1, 2, 3, 4}, {0, 1, 2, 3}}; }

TEST(SimulationTest, EveryTpPairDeliversEveryByteExactlyOnce) {
  const KvCacheSpec spec = testing::mixed_spec();
  for (int P : {1, 2, 4, 8}) {
    for (int C : {1, 2, 4, 8}) {
      for (const SimRequest& req : {scattered(P, C), consecutive(P, C)}) {
        SCOPED_TRACE(absl::StrCat("P=", P, " C=", C, " blocks ", req.producer_blocks[0], "..."));
        const SimReport r = testing::simulate(spec, req);
        EXPECT_TRUE(r.ok()) << r.describe();
        // Each consumer rank receives exactly its share of the request's blocks.
        const uint64_t per_block = engine::KvCacheLayout::bytes_per_block(spec, C).value();
        EXPECT_EQ(r.bytes, uint64_t(C) * per_block * req.consumer_blocks.size());
      }
    }
  }
}

TEST(SimulationTest, ConsecutiveBlocksNeedFewerOps) {
  const KvCacheSpec spec = testing::mixed_spec();
  SimRequest scattered_req{2, 2, 8, 8, {0, 2, 4, 6}, {1, 3, 5, 7}};
  SimRequest consecutive_req{2, 2, 8, 8, {0, 1, 2, 3}, {4, 5, 6, 7}};
  const SimReport a = testing::simulate(spec, scattered_req), b = testing::simulate(spec, consecutive_req);
  ASSERT_TRUE(a.ok()) << a.describe();
  ASSERT_TRUE(b.ok()) << b.describe();
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_LT(b.ops, a.ops);
  // Equal TP: every layer of every pair is whole local head sets on both sides, so
  // consecutive blocks collapse to one op per part (separate) or per layer (interleaved) —
  // or, head-outer, per local head and part, since a head's run ends before the arena's does.
  int expected = 0;
  for (const auto& s : spec.layers) {
    const int parts = s.layout == engine::KvLayout::kSeparate && s.has_v() ? 2 : 1;
    expected += s.order == engine::KvOrder::kHeadOuter ? parts * s.num_kv_heads / 2 : parts;
  }
  EXPECT_EQ(b.ops, uint64_t(2 * expected));
}

// The bug from the public MI355X report: every layer moved with layer 0's geometry.
TEST(SimulationMutationTest, LayerZeroGeometryForEveryLayerIsCaught) {
  const KvCacheSpec spec = testing::mixed_spec();
  KvCacheSpec wrong = spec;
  for (auto& layer : wrong.layers) layer = spec.layers[0];
  for (auto [P, C] : {std::pair{1, 1}, std::pair{2, 4}, std::pair{8, 2}}) {
    SimFaults faults;
    faults.planning_spec = wrong;
    const SimReport r = testing::simulate(spec, scattered(P, C), faults);
    EXPECT_FALSE(r.ok()) << "P=" << P << " C=" << C;
    EXPECT_GT(r.wrong_elements, 0) << r.describe();
  }
}

TEST(SimulationMutationTest, SwappedProducerRanksAreCaught) {
  // P=4, C=2: producer ranks 0 and 1 hold different heads of the 8-head layers.
  SimFaults faults;
  faults.producer_arena_of = {1, 0, 2, 3};
  const SimReport r = testing::simulate(testing::mixed_spec(), scattered(4, 2), faults);
  EXPECT_FALSE(r.ok());
  EXPECT_GT(r.wrong_elements, 0) << r.describe();
}

TEST(SimulationMutationTest, RankMapWithSwappedProducersIsRefusedByThePlanner) {
  SimFaults faults;
  faults.mutate_map = [](RankMap& map) {
    for (auto& list : map.receives) {
      for (RankMapEntry& e : list) {
        if (e.producer_rank < 2) e.producer_rank = 1 - e.producer_rank;
      }
    }
  };
  const SimReport r = testing::simulate(testing::mixed_spec(), scattered(4, 2), faults);
  EXPECT_EQ(r.plan_status.code(), absl::StatusCode::kInvalidArgument) << r.describe();
  EXPECT_GT(r.unwritten_bytes, 0);
}

TEST(SimulationMutationTest, RankMapThatDropsOrDuplicatesAHeadIsCaught) {
  // Consumer rank 0 loses its first entry: its bytes stay unwritten.
  SimFaults dropped;
  dropped.mutate_map = [](RankMap& map) { map.receives[0].erase(map.receives[0].begin()); };
  SimReport r = testing::simulate(testing::mixed_spec(), scattered(2, 4), dropped);
  EXPECT_GT(r.unwritten_bytes, 0) << r.describe();
  // Consumer rank 0 receives its first entry twice (from the same producer): bytes land twice.
  SimFaults duplicated;
  duplicated.mutate_map = [](RankMap& map) { map.receives[0].push_back(map.receives[0].front()); };
  r = testing::simulate(testing::mixed_spec(), scattered(2, 4), duplicated);
  EXPECT_GT(r.rewritten_bytes, 0) << r.describe();
}

TEST(SimulationMutationTest, CheckerCatchesSingleOpFaults) {
  const KvCacheSpec spec = testing::mixed_spec();
  auto first_nonempty = [](TransferPlan& plan) -> std::vector<CopyOp>* {
    for (LayerCopies& layer : plan.layers) {
      if (!layer.ops.empty()) return &layer.ops;
    }
    return nullptr;
  };
  SimFaults shifted;  // One op lands one byte off.
  shifted.mutate_plan = [&](TransferPlan& plan) {
    if (auto* ops = first_nonempty(plan)) ++ops->front().dst_offset;
  };
  SimReport r = testing::simulate(spec, scattered(2, 2), shifted);
  EXPECT_GT(r.wrong_elements, 0) << r.describe();

  SimFaults truncated;  // One op one byte short.
  truncated.mutate_plan = [&](TransferPlan& plan) {
    if (auto* ops = first_nonempty(plan)) --ops->back().length;
  };
  r = testing::simulate(spec, scattered(2, 2), truncated);
  EXPECT_GT(r.unwritten_bytes, 0) << r.describe();
  EXPECT_GT(r.wrong_elements, 0);

  SimFaults misplaced;  // One op lands a few blocks away from where it belongs.
  misplaced.mutate_plan = [&](TransferPlan& plan) {
    if (auto* ops = first_nonempty(plan)) ops->back().dst_offset += 4 * ops->back().length;
  };
  r = testing::simulate(spec, scattered(1, 1), misplaced);
  EXPECT_FALSE(r.ok()) << r.describe();
  EXPECT_GT(r.unwritten_bytes, 0);

  SimFaults wrong_block;  // Producer reads from the wrong block list order.
  wrong_block.mutate_plan = [&](TransferPlan& plan) {
    for (LayerCopies& layer : plan.layers) {
      if (layer.ops.size() >= 2) std::swap(layer.ops[0].src_offset, layer.ops[1].src_offset);
    }
  };
  r = testing::simulate(spec, scattered(1, 1), wrong_block);
  EXPECT_FALSE(r.ok()) << r.describe();
}

}  // namespace
}  // namespace pdserve::kvtransfer
