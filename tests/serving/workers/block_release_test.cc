// The roles' block release: blocks go back once; a second release of the same blocks (a
// bookkeeping bug) is refused and reported, and the pool is unchanged by it; and the per-rank
// progress (RankProgress) that decides when every rank let go of them.
#include <gtest/gtest.h>

#include "engine/model_loader.h"
#include "tests/engine/test_model.h"
#include "worker/block_release.h"
#include "worker/rank_progress.h"

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
  auto blocks = engine.reserve_cached_blocks({}, "", 40);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_LT(engine.stats().free_blocks, free_before);
  EXPECT_TRUE(release_blocks(engine, blocks->blocks, "test: first release"));
  EXPECT_EQ(engine.stats().free_blocks, free_before);
  EXPECT_FALSE(release_blocks(engine, blocks->blocks, "test: second release"));
  EXPECT_EQ(engine.stats().free_blocks, free_before);
}

}  // namespace
}  // namespace pdserve::worker

namespace pdserve::worker {
namespace {

// RankProgress: marks per rank, and the questions the roles ask of them.
TEST(RankProgress, MarksPerRankAndTheRolesQuestions) {
  RankProgress p(3);
  EXPECT_FALSE(p.all(RankProgress::kPosted));
  EXPECT_FALSE(p.all_released());
  for (int r = 0; r < 3; ++r) p.mark(r, RankProgress::kPosted);
  EXPECT_TRUE(p.all(RankProgress::kPosted));
  EXPECT_FALSE(p.has(1, RankProgress::kReady));
  // A decode job is quiet when each rank is ready or gave its blocks back.
  const uint8_t quiet = RankProgress::kReady | RankProgress::kReleased;
  p.mark(0, RankProgress::kReady);
  p.mark(1, RankProgress::kReleased);
  EXPECT_FALSE(p.all_of_any(quiet));
  p.mark(2, RankProgress::kReady);
  EXPECT_TRUE(p.all_of_any(quiet));
  EXPECT_FALSE(p.all(RankProgress::kReady));
  EXPECT_FALSE(p.all_released());
  p.mark(0, RankProgress::kReleased);
  p.mark(2, RankProgress::kReleased);
  EXPECT_TRUE(p.all_released());
  EXPECT_TRUE(p.has(0, RankProgress::kPosted)) << "marks add up";
  EXPECT_EQ(p.tp(), 3);
  EXPECT_TRUE(RankProgress(0).all_released()) << "no rank holds anything";
}

}  // namespace
}  // namespace pdserve::worker
