#include "engine/block_allocator.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

TEST(BlockAllocator, AllocatesUntilExhaustedThenRefuses) {
  BlockAllocator a(4);
  auto x = a.allocate(3);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(absl::IsResourceExhausted(a.allocate(2).status()));
  EXPECT_EQ(a.num_free(), 1);
  ASSERT_TRUE(a.release(*x).ok());
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockAllocator, SharedBlocksFreeWithTheirLastHolder) {
  BlockAllocator a(2);
  auto x = a.allocate(2);
  ASSERT_TRUE(a.retain(*x).ok());
  ASSERT_TRUE(a.release(*x).ok());
  EXPECT_EQ(a.num_free(), 0);
  ASSERT_TRUE(a.release(*x).ok());
  EXPECT_EQ(a.num_free(), 2);
}

TEST(BlockAllocator, DoubleFreeAndBadIdsAreRefusedWithoutChange) {
  BlockAllocator a(3);
  auto x = a.allocate(1);
  ASSERT_TRUE(a.release(*x).ok());
  EXPECT_FALSE(a.release(*x).ok());
  EXPECT_FALSE(a.release({7}).ok());
  auto y = a.allocate(2);
  EXPECT_FALSE(a.release({(*y)[0], (*y)[0]}).ok());  // One reference, released twice.
  EXPECT_EQ(a.ref_count((*y)[0]), 1);
  EXPECT_EQ(a.num_free(), 1);
}

}  // namespace
}  // namespace pdserve::engine
