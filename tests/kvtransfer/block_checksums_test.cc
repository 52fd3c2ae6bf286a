// Block checksums and the finished-id memory as pure functions: the producer's source sums equal
// the consumer's destination sums after the plan's copies ran, a flipped byte changes exactly its
// block's sum and is named by compare_block_checksums, skipped blocks are not summed.
#include "kvtransfer/block_checksums.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/finished_ids.h"
#include "kvtransfer/rank_map.h"
#include "tests/kvtransfer/kv_sim.h"

namespace pdserve::kvtransfer {
namespace {

using ::testing::HasSubstr;

// Runs the plan's copies from `src` into `dst`, as the transport would.
void copy(const TransferPlan& plan, const std::vector<uint8_t>& src, std::vector<uint8_t>& dst) {
  for (const LayerCopies& layer : plan.layers) {
    for (const CopyOp& op : layer.ops) std::memcpy(dst.data() + op.dst_offset, src.data() + op.src_offset, op.length);
  }
}

TEST(BlockChecksumsTest, SourceAndDestinationAgreeAndAFlipIsNamed) {
  const engine::KvCacheSpec spec = testing::mixed_spec();
  const RankMap map = build_rank_map(2, 1, spec).value();
  const auto p = engine::KvCacheLayout::create(spec, 1, 2, 6).value();
  const auto c = engine::KvCacheLayout::create(spec, 0, 1, 5).value();
  const std::vector<int> pb{5, 0, 1, 4}, cb{0, 3, 4, 2};
  for (int skip : {0, 2}) {
    const TransferPlan plan = plan_for_pair(1, 0, map, p, c, pb, cb, skip).value();
    std::vector<uint8_t> src(p.total_bytes()), dst(c.total_bytes(), 0xEE);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
    copy(plan, src, dst);
    const std::span<const int> sent = std::span<const int>(cb).subspan(skip);
    const auto sent_sums = block_checksums(c, src.data(), sent, plan, ChecksumSide::kSource);
    const auto got_sums = block_checksums(c, dst.data(), sent, plan, ChecksumSide::kDestination);
    ASSERT_EQ(sent_sums.size(), cb.size() - skip);
    EXPECT_EQ(sent_sums, got_sums);
    EXPECT_TRUE(compare_block_checksums(got_sums, sent_sums, "r", 1, 0, pb, cb, skip).ok());

    // Flip a byte the plan wrote: exactly one block's sum changes, and that block is named.
    const CopyOp* op = nullptr;
    for (const LayerCopies& layer : plan.layers) {
      if (!layer.ops.empty()) op = &layer.ops.back();
    }
    ASSERT_NE(op, nullptr);
    dst[op->dst_offset] ^= 0x5a;
    const auto bad = block_checksums(c, dst.data(), sent, plan, ChecksumSide::kDestination);
    size_t differing = 0, which = 0;
    for (size_t s = 0; s < bad.size(); ++s) {
      if (bad[s] != sent_sums[s]) ++differing, which = s;
    }
    EXPECT_EQ(differing, 1u);
    const Status st = compare_block_checksums(bad, sent_sums, "r", 1, 0, pb, cb, skip);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    const size_t i = which + skip;
    EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat("consumer block ", cb[i], " (producer block ", pb[i],
                                                                  ", request block ", i, ")")));
  }
  EXPECT_EQ(compare_block_checksums(std::vector<uint64_t>{1}, std::vector<uint64_t>{1, 2}, "r", 0, 0, pb, cb, 0).code(),
            absl::StatusCode::kDataLoss);
}

TEST(FinishedIdsTest, RemembersTheFirstReasonAndForgetsTheOldest) {
  FinishedIds ids(2);
  ids.remember("a", "one");
  ids.remember("a", "two");
  ASSERT_NE(ids.find("a"), nullptr);
  EXPECT_EQ(*ids.find("a"), "one");
  ids.remember("b", "x");
  ids.remember("c", "y");
  EXPECT_FALSE(ids.contains("a"));
  EXPECT_TRUE(ids.contains("b"));
  EXPECT_TRUE(ids.contains("c"));
  EXPECT_EQ(ids.size(), 2u);
}

}  // namespace
}  // namespace pdserve::kvtransfer
