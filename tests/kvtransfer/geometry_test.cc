// Geometry and plan: op lists for known layouts (coalescing), validation, and plan totals.
#include "kvtransfer/geometry.h"

#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/transfer_plan.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using engine::DType;
using engine::KvCacheLayout;
using engine::KvCacheSpec;
using engine::KvKind;
using engine::KvLayout;
using engine::KvOrder;
using engine::LayerKvSpec;
using ::testing::ElementsAre;
using ::testing::Each;
using ::testing::Field;
using ::testing::HasSubstr;

// One layer of 4 f32 heads of dim 4 (V dim 4), 4 tokens per block: one head of one block's
// part is 64 bytes, a whole part 256 bytes.
KvCacheSpec one_layer(KvLayout layout, KvOrder order, KvKind kind = KvKind::kKv) {
  LayerKvSpec s;
  s.kind = kind;
  s.num_kv_heads = 4;
  s.head_dim = 4;
  s.v_head_dim = kind == KvKind::kKv ? 4 : 0;
  s.dtype = DType::kF32;
  s.layout = layout;
  s.order = order;
  KvCacheSpec spec;
  spec.block_size = 4;
  spec.layers = {s};
  return spec;
}

KvCacheLayout layout_of(const KvCacheSpec& spec, int rank, int tp, int num_blocks = 4) {
  return KvCacheLayout::create(spec, rank, tp, num_blocks).value();
}

std::vector<CopyOp> ops_for(const KvCacheLayout& producer, const KvCacheLayout& consumer, const RankMapEntry& entry,
                            const std::vector<int>& producer_blocks, const std::vector<int>& consumer_blocks) {
  std::vector<CopyOp> ops;
  const Status st = append_copy_ops(producer, consumer, entry, producer_blocks, consumer_blocks, &ops);
  EXPECT_TRUE(st.ok()) << st;
  return ops;
}

TEST(GeometryTest, HeadMajorFullHeadsMergesConsecutiveBlocksPerPart) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadMajor);
  const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 0, 1);
  const RankMapEntry all{0, 0, 0, 4};
  // K region: 4 blocks x 256 bytes, then the V region.
  EXPECT_THAT(ops_for(p, c, all, {0, 1, 2}, {1, 2, 3}),
              ElementsAre(CopyOp{0, 256, 768}, CopyOp{1024, 1280, 768}));
  // Consecutive only in part: blocks 0,1 -> 2,3 merge, block 3 -> 0 stands alone.
  EXPECT_THAT(ops_for(p, c, all, {0, 1, 3}, {2, 3, 0}),
              ElementsAre(CopyOp{0, 512, 512}, CopyOp{768, 0, 256}, CopyOp{1024, 1536, 512},
                          CopyOp{1792, 1024, 256}));
  // Consecutive on one side only: one op per block part.
  EXPECT_EQ(ops_for(p, c, all, {0, 2, 1}, {1, 2, 3}).size(), 6u);
}

TEST(GeometryTest, InterleavedFullHeadsIsOneOpForConsecutiveBlocks) {
  for (KvOrder order : {KvOrder::kTokenMajor, KvOrder::kHeadMajor}) {
    const KvCacheSpec spec = one_layer(KvLayout::kInterleaved, order);
    const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 0, 1);
    EXPECT_THAT(ops_for(p, c, {0, 0, 0, 4}, {1, 2, 3}, {0, 1, 2}), ElementsAre(CopyOp{512, 0, 1536}));
  }
}

TEST(GeometryTest, KeyOnlyInterleavedBlocksAreAdjacent) {
  const KvCacheSpec spec = one_layer(KvLayout::kInterleaved, KvOrder::kHeadMajor, KvKind::kKeyOnly);
  const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 0, 1);
  EXPECT_THAT(ops_for(p, c, {0, 0, 0, 4}, {0, 1, 2, 3}, {0, 1, 2, 3}), ElementsAre(CopyOp{0, 0, 1024}));
}

TEST(GeometryTest, TokenMajorSameTpMergesWholeLocalHeadSets) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kTokenMajor);
  const KvCacheLayout p = layout_of(spec, 1, 2), c = layout_of(spec, 1, 2);
  // Rank 1 of TP 2 holds heads [2, 4): 128 bytes per block part.
  EXPECT_THAT(ops_for(p, c, {1, 0, 2, 4}, {0, 1}, {2, 3}), ElementsAre(CopyOp{0, 256, 256}, CopyOp{512, 768, 256}));
}

TEST(GeometryTest, TokenMajorHeadSubsetIsOneOpPerToken) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kTokenMajor);
  // TP1 -> TP2: consumer rank 1 takes heads [2, 4), which are strided in the producer.
  const KvCacheLayout p1 = layout_of(spec, 0, 1), c2 = layout_of(spec, 1, 2);
  std::vector<CopyOp> ops = ops_for(p1, c2, {0, 0, 2, 4}, {0, 1, 2}, {0, 1, 2});
  ASSERT_EQ(ops.size(), 3u * 4u * 2u);  // blocks x tokens x parts
  EXPECT_THAT(ops, Each(Field(&CopyOp::length, 32u)));
  EXPECT_EQ(ops[0], (CopyOp{32, 0, 32}));   // token 0: heads 2,3 sit after heads 0,1
  EXPECT_EQ(ops[1], (CopyOp{96, 32, 32}));  // token 1: producer token stride is 4 heads
  // TP2 -> TP1: the source run is contiguous but the destination is strided.
  const KvCacheLayout p2 = layout_of(spec, 1, 2), c1 = layout_of(spec, 0, 1);
  ops = ops_for(p2, c1, {1, 0, 2, 4}, {0, 1, 2}, {0, 1, 2});
  ASSERT_EQ(ops.size(), 24u);
  EXPECT_EQ(ops[1], (CopyOp{32, 96, 32}));
}

TEST(GeometryTest, HeadMajorHeadSubsetIsOneOpPerBlockPart) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadMajor);
  const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 1, 2);
  const std::vector<CopyOp> ops = ops_for(p, c, {0, 0, 2, 4}, {0, 1, 2}, {0, 1, 2});
  // Heads 2,3 of each producer block are one 128-byte run, not adjacent to the next block's.
  EXPECT_THAT(ops, ElementsAre(CopyOp{128, 0, 128}, CopyOp{384, 128, 128}, CopyOp{640, 256, 128},
                               CopyOp{1152, 512, 128}, CopyOp{1408, 640, 128}, CopyOp{1664, 768, 128}));
}

TEST(GeometryTest, HeadOuterHeadSubsetMergesARunOfBlocksPerHead) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadOuter);
  // One head of one block is 64 bytes; a head's 4 blocks are 256 bytes, a part 1024 bytes.
  const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 1, 2);
  // TP1 -> TP2 rank 1 (heads 2, 3): one op per head and part for the run 0..2 -> 1..3.
  EXPECT_THAT(ops_for(p, c, {0, 0, 2, 4}, {0, 1, 2}, {1, 2, 3}),
              ElementsAre(CopyOp{512, 64, 192}, CopyOp{768, 320, 192}, CopyOp{1536, 576, 192},
                          CopyOp{1792, 832, 192}));
  // A break in the run on either side splits the op there.
  EXPECT_EQ(ops_for(p, c, {0, 0, 2, 4}, {0, 1, 3}, {0, 1, 2}).size(), 8u);
  EXPECT_EQ(ops_for(p, c, {0, 0, 2, 4}, {0, 1, 2}, {2, 1, 0}).size(), 12u);
  // Same TP, all heads, the whole arena: one op.
  const KvCacheLayout p1 = layout_of(spec, 0, 1), c1 = layout_of(spec, 0, 1);
  EXPECT_THAT(ops_for(p1, c1, {0, 0, 0, 4}, {0, 1, 2, 3}, {0, 1, 2, 3}), ElementsAre(CopyOp{0, 0, 2048}));
}

TEST(GeometryTest, MergesIntoTheLastOpAlreadyInTheList) {
  const KvCacheSpec spec = one_layer(KvLayout::kInterleaved, KvOrder::kHeadMajor);
  const KvCacheLayout p = layout_of(spec, 0, 1), c = layout_of(spec, 0, 1);
  std::vector<CopyOp> ops;
  ASSERT_TRUE(append_copy_ops(p, c, {0, 0, 0, 4}, std::vector<int>{0}, std::vector<int>{0}, &ops).ok());
  ASSERT_TRUE(append_copy_ops(p, c, {0, 0, 0, 4}, std::vector<int>{1}, std::vector<int>{1}, &ops).ok());
  EXPECT_THAT(ops, ElementsAre(CopyOp{0, 0, 1024}));
}

TEST(GeometryTest, RejectsBadInput) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadMajor);
  const KvCacheLayout p = layout_of(spec, 0, 2), c = layout_of(spec, 0, 2);
  const std::vector<int> one{0};
  std::vector<CopyOp> ops;
  auto code = [&](const KvCacheLayout& pl, const KvCacheLayout& cl, RankMapEntry e, std::vector<int> pb,
                  std::vector<int> cb) { return append_copy_ops(pl, cl, e, pb, cb, &ops).code(); };
  EXPECT_EQ(code(p, c, {0, 0, 0, 2}, {0, 1}, {0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, c, {0, 0, 0, 2}, {4}, {0}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, c, {0, 0, 0, 2}, {0}, {-1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, c, {0, 1, 0, 2}, one, one), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, c, {0, 0, 1, 1}, one, one), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, layout_of(spec, 1, 2), {0, 0, 0, 2}, one, one), absl::StatusCode::kInvalidArgument);
  KvCacheSpec other = spec;
  other.layers[0].dtype = DType::kBF16;
  EXPECT_EQ(code(p, layout_of(other, 0, 2), {0, 0, 0, 2}, one, one), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ops.empty());

  const Status st = append_copy_ops(p, layout_of(spec, 1, 2), {0, 0, 0, 2}, one, one, &ops);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not held by consumer rank 1 of TP 2, which holds [2, 4)"));
}

TEST(TransferPlanTest, GroupsByLayerWithTotals) {
  const KvCacheSpec spec = testing::mixed_spec();
  const RankMap map = build_rank_map(2, 2, spec).value();
  const KvCacheLayout p = layout_of(spec, 1, 2, 6), c = layout_of(spec, 1, 2, 5);
  const std::vector<int> pb{5, 0, 1}, cb{0, 3, 4};
  const TransferPlan plan = plan_for_pair(1, 1, map, p, c, pb, cb).value();
  EXPECT_EQ(plan.producer_rank, 1);
  EXPECT_EQ(plan.consumer_rank, 1);
  ASSERT_EQ(plan.layers.size(), spec.layers.size());
  uint64_t bytes = 0, ops = 0;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    uint64_t layer_bytes = 0;
    for (const CopyOp& op : plan.layers[l].ops) layer_bytes += op.length;
    EXPECT_EQ(plan.layers[l].bytes, layer_bytes);
    // Equal TP: each rank sends its whole share of every layer to its peer rank.
    const uint64_t part_bytes = c.part_bytes(l, engine::KvPart::kK) + c.part_bytes(l, engine::KvPart::kV);
    EXPECT_EQ(layer_bytes, pb.size() * part_bytes) << "layer " << l;
    bytes += layer_bytes;
    ops += plan.layers[l].ops.size();
  }
  EXPECT_EQ(plan.total_bytes, bytes);
  EXPECT_EQ(plan.total_ops, ops);
}

TEST(TransferPlanTest, PairWithoutEntriesGetsAnEmptyPlan) {
  KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadMajor);
  const RankMap map = build_rank_map(2, 4, spec).value();
  const TransferPlan plan =
      plan_for_pair(0, 3, map, layout_of(spec, 0, 2), layout_of(spec, 3, 4), std::vector<int>{0}, std::vector<int>{0})
          .value();
  EXPECT_EQ(plan.total_ops, 0u);
  EXPECT_EQ(plan.total_bytes, 0u);
  ASSERT_EQ(plan.layers.size(), 1u);
  EXPECT_TRUE(plan.layers[0].ops.empty());
}

TEST(TransferPlanTest, RejectsMismatchedInput) {
  const KvCacheSpec spec = one_layer(KvLayout::kSeparate, KvOrder::kHeadMajor);
  const RankMap map = build_rank_map(2, 2, spec).value();
  const KvCacheLayout p0 = layout_of(spec, 0, 2), c0 = layout_of(spec, 0, 2);
  const std::vector<int> b{0, 1};
  // Layout of another rank or TP than the plan is for.
  EXPECT_EQ(plan_for_pair(1, 0, map, p0, c0, b, b).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_for_pair(0, 0, map, p0, layout_of(spec, 0, 4), b, b).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Layouts of a spec other than the map's.
  KvCacheSpec other = spec;
  other.block_size = 8;
  EXPECT_EQ(plan_for_pair(0, 0, map, layout_of(other, 0, 2), layout_of(other, 0, 2), b, b).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A consumer block listed twice, or lists of different lengths.
  EXPECT_EQ(plan_for_pair(0, 0, map, p0, c0, b, std::vector<int>{2, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_for_pair(0, 0, map, p0, c0, b, std::vector<int>{2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}


TEST(TransferPlanTest, SentBlocksTable) {
  const std::vector<int> blocks{7, 3, 5, 1};
  struct Case {
    int skip;
    std::vector<int> want;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {0, {7, 3, 5, 1}, absl::StatusCode::kOk}, {1, {3, 5, 1}, absl::StatusCode::kOk},
      {3, {1}, absl::StatusCode::kOk},          {4, {}, absl::StatusCode::kOk},
      {5, {}, absl::StatusCode::kOutOfRange},   {-1, {}, absl::StatusCode::kOutOfRange},
  };
  for (const Case& c : cases) {
    StatusOr<std::span<const int>> sent = sent_blocks(blocks, c.skip);
    EXPECT_EQ(sent.status().code(), c.code) << "skip " << c.skip;
    if (sent.ok()) EXPECT_EQ(std::vector<int>(sent->begin(), sent->end()), c.want) << "skip " << c.skip;
  }
}

// Skipping k blocks plans exactly what a transfer of blocks [k, n) alone would: same ops (no op
// touches a consumer block below k), and totals that count only the sent blocks. Over TP pairs
// including heterogeneous ones (2->1, 1->2, 4->2).
TEST(TransferPlanTest, SkipBlocksPlansOnlyTheSentSuffix) {
  const KvCacheSpec spec = testing::mixed_spec();
  const std::vector<int> pb{5, 0, 1, 4}, cb{0, 3, 4, 2};
  for (auto [P, C] : {std::pair{1, 1}, {2, 1}, {1, 2}, {4, 2}, {2, 2}}) {
    const RankMap map = build_rank_map(P, C, spec).value();
    for (int p = 0; p < P; ++p) {
      for (int c = 0; c < C; ++c) {
        const KvCacheLayout pl = layout_of(spec, p, P, 6), cl = layout_of(spec, c, C, 5);
        for (int k = 0; k <= static_cast<int>(pb.size()); ++k) {
          const std::string where = absl::StrCat(P, "->", C, " pair ", p, ",", c, " k=", k);
          const TransferPlan skipped = plan_for_pair(p, c, map, pl, cl, pb, cb, k).value();
          const std::vector<int> pb_sent(pb.begin() + k, pb.end()), cb_sent(cb.begin() + k, cb.end());
          const TransferPlan suffix = plan_for_pair(p, c, map, pl, cl, pb_sent, cb_sent).value();
          EXPECT_EQ(skipped.total_ops, suffix.total_ops) << where;
          EXPECT_EQ(skipped.total_bytes, suffix.total_bytes) << where;
          ASSERT_EQ(skipped.layers.size(), suffix.layers.size());
          for (size_t l = 0; l < skipped.layers.size(); ++l) {
            ASSERT_EQ(skipped.layers[l].ops.size(), suffix.layers[l].ops.size()) << where;
            for (size_t i = 0; i < skipped.layers[l].ops.size(); ++i) {
              const CopyOp& a = skipped.layers[l].ops[i];
              const CopyOp& b = suffix.layers[l].ops[i];
              EXPECT_EQ(std::tie(a.src_offset, a.dst_offset, a.length),
                        std::tie(b.src_offset, b.dst_offset, b.length))
                  << where;
              // No destination byte lies in a skipped consumer block.
              for (int s = 0; s < k; ++s) {
                std::vector<engine::ByteRange> ranges;
                for (engine::KvPart part : {engine::KvPart::kK, engine::KvPart::kV}) {
                  if (part == engine::KvPart::kV && !spec.layers[l].has_v()) continue;
                  cl.ranges(static_cast<int>(l), cb[s], part, 0, cl.num_local_heads(static_cast<int>(l)), &ranges);
                }
                for (const engine::ByteRange& r : ranges) {
                  EXPECT_TRUE(a.dst_offset + a.length <= r.offset || a.dst_offset >= r.offset + r.length)
                      << where << " op writes skipped consumer block " << cb[s];
                }
              }
            }
          }
          if (k == static_cast<int>(pb.size())) EXPECT_EQ(skipped.total_ops, 0u) << where;
        }
      }
    }
  }
  const RankMap map = build_rank_map(1, 1, spec).value();
  EXPECT_EQ(plan_for_pair(0, 0, map, layout_of(spec, 0, 1, 6), layout_of(spec, 0, 1, 5), pb, cb, 5).status().code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace pdserve::kvtransfer
