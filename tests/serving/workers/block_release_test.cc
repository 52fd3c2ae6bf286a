// The roles' block release: blocks go back once; a second release of the same blocks (a
// bookkeeping bug) is refused and reported, and the pool is unchanged by it.
#include <gtest/gtest.h>

#include "engine/model_loader.h"
#include "tests/engine/test_model.h"
#include "worker/block_release.h"

namespace pdserve::worker {
namespace {

TEST(BlockRelease, ReleasesOnceAndReportsADoubleRelease) {
  auto model = engine::load_model({pdserve::testing::stories_bin()});
  ASSERT_TRUE(model.ok()) << model.status();
  engine::EngineOptions o;
  o.kv_cache_bytes = 4 << 20;
  auto e = engine::Engine::create(std::move(*model), o);
  ASSERT_TRUE(e.ok()) << e.status();
  engine::Engine& engine = **e;
  const int free_before = engine.stats().free_blocks;
  auto blocks = engine.reserve_blocks(40);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_LT(engine.stats().free_blocks, free_before);
  EXPECT_TRUE(release_blocks(engine, *blocks, "test: first release"));
  EXPECT_EQ(engine.stats().free_blocks, free_before);
  EXPECT_FALSE(release_blocks(engine, *blocks, "test: second release"));
  EXPECT_EQ(engine.stats().free_blocks, free_before);
}

}  // namespace
}  // namespace pdserve::worker
