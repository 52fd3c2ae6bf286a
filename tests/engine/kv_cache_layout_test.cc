#include "engine/kv_cache_layout.h"

#include <gtest/gtest.h>

#include <set>

namespace pdserve::engine {
namespace {

KvCacheSpec mixed_spec() {
  KvCacheSpec spec;
  spec.block_size = 4;
  spec.layers = {
      {KvKind::kKv, KvSharding::kByHead, 4, 8, 8, DType::kF32, KvLayout::kSeparate, KvOrder::kTokenMajor},
      {KvKind::kKv, KvSharding::kByHead, 2, 16, 8, DType::kBF16, KvLayout::kInterleaved, KvOrder::kHeadMajor},
      {KvKind::kKeyOnly, KvSharding::kByHead, 1, 4, 0, DType::kF16, KvLayout::kSeparate, KvOrder::kTokenMajor},
      {KvKind::kKv, KvSharding::kReplicated, 2, 8, 8, DType::kF32, KvLayout::kInterleaved, KvOrder::kTokenMajor},
      {KvKind::kKv, KvSharding::kByHead, 4, 8, 4, DType::kBF16, KvLayout::kSeparate, KvOrder::kHeadOuter},
      {KvKind::kKeyOnly, KvSharding::kByHead, 2, 4, 0, DType::kF32, KvLayout::kSeparate, KvOrder::kHeadOuter},
  };
  return spec;
}

TEST(KvCacheLayout, EveryElementHasOneDistinctByteRangeInsideTheArena) {
  for (int tp : {1, 2, 4}) {
    for (int rank = 0; rank < tp; ++rank) {
      auto layout = KvCacheLayout::create(mixed_spec(), rank, tp, 3);
      ASSERT_TRUE(layout.ok()) << layout.status();
      std::set<uint64_t> seen;
      uint64_t covered = 0;
      for (int l = 0; l < layout->num_layers(); ++l) {
        const LayerKvSpec& s = layout->spec().layers[l];
        const uint64_t esize = dtype_size(s.dtype);
        for (KvPart part : {KvPart::kK, KvPart::kV}) {
          if (part == KvPart::kV && !s.has_v()) continue;
          const int hd = layout->part_head_dim(l, part);
          for (int b = 0; b < 3; ++b)
            for (int slot = 0; slot < 4; ++slot)
              for (int h = 0; h < layout->num_local_heads(l); ++h) {
                const uint64_t off = layout->offset(l, part, b, slot, h);
                for (int d = 0; d < hd; ++d) {
                  ASSERT_TRUE(seen.insert(off + d * esize).second) << "overlap at layer " << l;
                  ASSERT_LT(off + (d + 1) * esize, layout->total_bytes() + 1);
                }
                covered += hd * esize;
              }
        }
      }
      EXPECT_EQ(covered, layout->total_bytes()) << "the arena has gaps";
    }
  }
}

TEST(KvCacheLayout, RangesCoverExactlyTheRequestedHeads) {
  auto layout = KvCacheLayout::create(mixed_spec(), 0, 1, 2);
  ASSERT_TRUE(layout.ok());
  for (int l = 0; l < layout->num_layers(); ++l) {
    const LayerKvSpec& s = layout->spec().layers[l];
    const int heads = layout->num_local_heads(l);
    for (int h0 = 0; h0 < heads; ++h0)
      for (int h1 = h0 + 1; h1 <= heads; ++h1) {
        std::vector<ByteRange> ranges;
        layout->ranges(l, 1, KvPart::kK, h0, h1, &ranges);
        uint64_t total = 0;
        for (const ByteRange& r : ranges) total += r.length;
        EXPECT_EQ(total, uint64_t(4) * (h1 - h0) * s.head_dim * dtype_size(s.dtype));
        // The first element of the first head of slot 0 is where the ranges begin.
        EXPECT_EQ(ranges.front().offset, layout->offset(l, KvPart::kK, 1, 0, h0));
      }
  }
}

TEST(KvCacheLayout, HeadMajorFullRangeIsOneRangeTokenMajorSubsetIsPerToken) {
  auto layout = KvCacheLayout::create(mixed_spec(), 0, 1, 2);
  ASSERT_TRUE(layout.ok());
  std::vector<ByteRange> r;
  layout->ranges(1, 0, KvPart::kK, 0, 1, &r);  // Head-major: one range per head run.
  EXPECT_EQ(r.size(), 1u);
  r.clear();
  layout->ranges(0, 0, KvPart::kK, 1, 3, &r);  // Token-major subset: one per token.
  EXPECT_EQ(r.size(), 4u);
  r.clear();
  layout->ranges(0, 0, KvPart::kK, 0, 4, &r);  // Token-major, all heads: contiguous.
  EXPECT_EQ(r.size(), 1u);
}

TEST(KvCacheLayout, HeadOuterKeepsEachHeadsBlocksContiguous) {
  auto layout = KvCacheLayout::create(mixed_spec(), 0, 1, 3);
  ASSERT_TRUE(layout.ok());
  const int l = 4;  // 4 bf16 heads of K dim 8: one head of one block is 4 x 8 x 2 = 64 bytes.
  EXPECT_EQ(layout->block_stride(l, KvPart::kK), 64u);
  EXPECT_EQ(layout->head_stride(l, KvPart::kK), 3 * 4 * 8);  // Elements: 3 blocks of a head.
  EXPECT_EQ(layout->offset(l, KvPart::kK, 1, 0, 0) + 64, layout->offset(l, KvPart::kK, 2, 0, 0));
  EXPECT_EQ(layout->offset(l, KvPart::kK, 2, 3, 0) + 16, layout->offset(l, KvPart::kK, 0, 0, 1));
  std::vector<ByteRange> r;
  layout->ranges(l, 1, KvPart::kK, 1, 3, &r);  // One range per head.
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], (ByteRange{layout->offset(l, KvPart::kK, 1, 0, 1), 64}));
  EXPECT_EQ(r[1].offset - r[0].offset, 3u * 64u);
}

TEST(KvCacheLayout, RejectsHeadOuterInterleaved) {
  KvCacheSpec spec = mixed_spec();
  spec.layers[1].order = KvOrder::kHeadOuter;
  const auto layout = KvCacheLayout::create(spec, 0, 1, 1);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("head-outer"), std::string::npos) << layout.status();
}

TEST(KvCacheLayout, RejectsHeadsThatDoNotSpread) {
  KvCacheSpec spec = mixed_spec();
  spec.layers[0].num_kv_heads = 3;
  EXPECT_FALSE(KvCacheLayout::create(spec, 0, 2, 1).ok());
  EXPECT_FALSE(KvCacheLayout::create(mixed_spec(), 2, 2, 1).ok());
}

TEST(KvCacheSpec, FingerprintChangesWithAnyField) {
  const uint64_t base = mixed_spec().fingerprint();
  KvCacheSpec s = mixed_spec();
  s.layers[2].order = KvOrder::kHeadMajor;
  EXPECT_NE(s.fingerprint(), base);
  s = mixed_spec();
  s.block_size = 8;
  EXPECT_NE(s.fingerprint(), base);
  EXPECT_EQ(mixed_spec().fingerprint(), base);
}

TEST(TpShard, KvHeadOwnership) {
  EXPECT_EQ(kv_heads_of_rank(8, 4, 1), (Range{2, 4}));
  EXPECT_EQ(kv_heads_of_rank(4, 8, 5), (Range{2, 3}));  // Replicated on ranks 4 and 5.
  EXPECT_TRUE(kv_heads_divide(4, 8));
  EXPECT_FALSE(kv_heads_divide(4, 3));
  EXPECT_FALSE(kv_heads_divide(6, 4));
  EXPECT_EQ(even_split(172, 8, 0), (Range{0, 22}));
  EXPECT_EQ(even_split(172, 8, 7), (Range{151, 172}));
}

}  // namespace
}  // namespace pdserve::engine
