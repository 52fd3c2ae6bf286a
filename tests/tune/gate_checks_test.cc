#include "tune/gate_checks.h"

#include <gtest/gtest.h>

namespace pdserve::tune {
namespace {

using namespace std::chrono_literals;

struct MismatchCase {
  std::string name;
  std::vector<int> want, got;
  GatePolicy policy;
  int prefix;
  std::optional<int> at;
};

TEST(GateChecksTest, FirstMismatchUnderEachPolicy) {
  const std::vector<MismatchCase> cases = {
      {"exact equal", {5, 6, 7}, {5, 6, 7}, GatePolicy::kExact, 16, std::nullopt},
      {"exact differs", {5, 6, 7, 8}, {5, 6, 9, 8}, GatePolicy::kExact, 16, 2},
      {"exact output short", {5, 6, 7}, {5, 6}, GatePolicy::kExact, 16, 2},
      {"exact output long", {5, 6}, {5, 6, 7}, GatePolicy::kExact, 16, 2},
      {"exact empty output", {5}, {}, GatePolicy::kExact, 16, 0},
      {"prefix differs after N", {1, 2, 3, 4}, {1, 2, 9, 9}, GatePolicy::kPrefix, 2, std::nullopt},
      {"prefix differs within N", {1, 2, 3, 4}, {1, 9, 3, 4}, GatePolicy::kPrefix, 2, 1},
      {"prefix output shorter than N", {1, 2, 3, 4}, {1}, GatePolicy::kPrefix, 3, 1},
      {"prefix reference shorter than N", {1, 2}, {1, 2, 7}, GatePolicy::kPrefix, 16, std::nullopt},
      {"prefix of zero", {1, 2}, {3}, GatePolicy::kPrefix, 0, std::nullopt},
  };
  for (const MismatchCase& c : cases) EXPECT_EQ(first_mismatch(c.want, c.got, c.policy, c.prefix), c.at) << c.name;
}

TEST(GateChecksTest, FirstDivergenceNamesTheFirstBadPromptAndTheTokens) {
  std::vector<GoldenPrompt> prompts(3);
  prompts[0].tokens = {1};
  prompts[1].kind = GoldenKind::kBlock;
  prompts[1].tokens = std::vector<int>(16, 4);
  prompts[2].tokens = {1, 2};
  const Reference ref{{{10, 11}, {20, 21, 22}, {30}}};
  EXPECT_FALSE(first_divergence(prompts, ref, ref.tokens, GatePolicy::kExact, 16));

  const std::optional<Divergence> d =
      first_divergence(prompts, ref, {{10, 11}, {20, 21, 99}, {31}}, GatePolicy::kExact, 16);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->prompt, 1);
  EXPECT_EQ(d->kind, GoldenKind::kBlock);
  EXPECT_EQ(d->prompt_length, 16);
  EXPECT_EQ(d->position, 2);
  EXPECT_EQ(d->expected, 22);
  EXPECT_EQ(d->got, 99);

  const std::optional<Divergence> ended = first_divergence(prompts, ref, {{10}, {}, {}}, GatePolicy::kExact, 16);
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->prompt, 0);
  EXPECT_EQ(ended->position, 1);
  EXPECT_EQ(ended->expected, 11);
  EXPECT_EQ(ended->got, -1);
}

TEST(GateChecksTest, TopologyPairsAreEveryPrefillWithEveryDecodeAndAggregatedWithThemselves) {
  using worker::ROLE_AGGREGATED;
  using worker::ROLE_DECODE;
  using worker::ROLE_PREFILL;
  EXPECT_EQ(topology_pairs({{"p0", ROLE_PREFILL}, {"p1", ROLE_PREFILL}, {"d0", ROLE_DECODE}}),
            (std::set<WorkerPair>{{"p0", "d0"}, {"p1", "d0"}}));
  EXPECT_EQ(topology_pairs({{"d0", ROLE_DECODE}, {"p0", ROLE_PREFILL}, {"d1", ROLE_DECODE}}),
            (std::set<WorkerPair>{{"p0", "d0"}, {"p0", "d1"}}));
  EXPECT_EQ(topology_pairs({{"a0", ROLE_AGGREGATED}, {"a1", ROLE_AGGREGATED}}),
            (std::set<WorkerPair>{{"a0", "a0"}, {"a1", "a1"}}));
  EXPECT_TRUE(topology_pairs({{"p0", ROLE_PREFILL}}).empty());
}

TEST(GateChecksTest, DrainWaitReturnsOnceEveryBlockIsFree) {
  FakeClock clock;
  std::vector<BlockCount> readings = {{100, 90}, {100, 97}, {100, 100}};
  size_t reads = 0;
  int pauses = 0;
  StatusOr<BlockCount> last = wait_for_free_blocks([&]() -> StatusOr<BlockCount> { return readings[reads++]; },
                                                   clock, 1s, [&] { ++pauses, clock.advance(10ms); });
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->in_use(), 0);
  EXPECT_EQ(reads, 3u);
  EXPECT_EQ(pauses, 2);
}

TEST(GateChecksTest, DrainWaitGivesUpAtTheDeadlineWithTheLeak) {
  FakeClock clock;
  int pauses = 0;
  // A wait that ignored the deadline would read forever: the 50th read fails it instead.
  StatusOr<BlockCount> last = wait_for_free_blocks(
      [&]() -> StatusOr<BlockCount> {
        if (pauses >= 50) return absl::DeadlineExceededError("still polling past the deadline");
        return BlockCount{100, 98};
      },
      clock, 1s, [&] { ++pauses, clock.advance(100ms); });
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->in_use(), 2);
  EXPECT_EQ(pauses, 10);
}

TEST(GateChecksTest, DrainWaitReturnsAFailedReadAtOnce) {
  FakeClock clock;
  int pauses = 0;
  StatusOr<BlockCount> last = wait_for_free_blocks(
      []() -> StatusOr<BlockCount> { return absl::UnavailableError("gone"); }, clock, 1s, [&] { ++pauses; });
  EXPECT_EQ(last.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(pauses, 0);
}

}  // namespace
}  // namespace pdserve::tune
