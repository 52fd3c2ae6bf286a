// tools/bench_workload.h: the session generators are seeded and share what they should (system
// prompts by session, nothing across turns), the Mooncake trace parser maps equal hash ids to
// equal blocks and refuses malformed lines, and the reuse oracle follows the engine's rules
// (full blocks, the last prompt token always computed, generated blocks reusable after the end).
#include "tools/bench_workload.h"

#include <gtest/gtest.h>

namespace pdserve::tools {
namespace {

TEST(BenchWorkload, NamesRoundTripAndUnknownOnesAreRefused) {
  for (Workload w : {Workload::kRandom, Workload::kMultiturn, Workload::kAgentic, Workload::kTrace})
    EXPECT_EQ(*parse_workload(workload_name(w)), w);
  EXPECT_FALSE(parse_workload("chat").ok());
}

TEST(BenchWorkload, SessionsShareTheirSystemPromptAndNothingElse) {
  SessionSpec spec;
  spec.shared_prefixes = 2;
  spec.prefix_len = 40;
  spec.turn_len = 8;
  const TokenRange range{64, {1, 2, 10}};
  const SessionTokens a(spec, range, 5), b(spec, range, 5), other_seed(spec, range, 6);
  EXPECT_EQ(a.prefix(0), a.prefix(2));  // Sessions 0 and 2 share system prompt 0.
  EXPECT_NE(a.prefix(0), a.prefix(1));
  EXPECT_EQ(a.prefix(0).size(), 40u);
  EXPECT_EQ(a.turn(3, 1), b.turn(3, 1));  // Seeded.
  EXPECT_NE(a.turn(3, 1), a.turn(3, 2));
  EXPECT_NE(a.turn(3, 1), a.turn(4, 1));
  EXPECT_NE(a.prefix(0), other_seed.prefix(0));
  for (int s = 0; s < 6; ++s)
    for (int t : a.turn(s, 0)) {
      EXPECT_GE(t, 3);
      EXPECT_LT(t, 64);
      EXPECT_NE(t, 10) << "an avoided id";
    }
}

TEST(BenchWorkload, MooncakeTraceBlocksFollowTheirHashIds) {
  const TokenRange range{512, {}};
  const std::string text =
      "{\"timestamp\": 1000, \"input_length\": 20, \"output_length\": 4, \"hash_ids\": [7, 8]}\n"
      "\n"
      "{\"timestamp\": 3000, \"input_length\": 12, \"output_length\": 2, \"hash_ids\": [7, 9]}\n"
      "{\"timestamp\": 2000, \"input_length\": 30, \"output_length\": 1, \"hash_ids\": [7]}\n";
  auto trace = parse_mooncake_trace(text, 8, range, 2.0, 1);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 3u);
  // Sorted by arrival, rescaled by 1 / speed from the first line's timestamp.
  EXPECT_DOUBLE_EQ((*trace)[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ((*trace)[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ((*trace)[2].arrival_s, 1.0);
  const auto& first = (*trace)[0].prompt;  // [7, 8] and 4 tokens of its own.
  const auto& third = (*trace)[1].prompt;  // [7] and 22 of its own.
  const auto& second = (*trace)[2].prompt;  // [7, 9] cut to 12.
  EXPECT_EQ(first.size(), 20u);
  EXPECT_EQ(third.size(), 30u);
  EXPECT_EQ(second.size(), 12u);
  EXPECT_EQ((*trace)[0].output_len, 4);
  EXPECT_TRUE(std::equal(first.begin(), first.begin() + 8, third.begin())) << "hash id 7 is one block";
  EXPECT_TRUE(std::equal(first.begin(), first.begin() + 8, second.begin()));
  EXPECT_FALSE(std::equal(first.begin() + 8, first.begin() + 12, second.begin() + 8)) << "ids 8 and 9 differ";
  EXPECT_FALSE(std::equal(first.begin() + 16, first.begin() + 20, third.begin() + 16)) << "own tokens differ";

  for (const char* bad : {"{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1}", "not json",
                          "{\"timestamp\": 1, \"output_length\": 1}",
                          "{\"timestamp\": 1, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [\"x\"]}"}) {
    auto r = parse_mooncake_trace(std::string("{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1}\n") + bad,
                                  8, range, 1.0, 1);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("line 2"), std::string::npos) << r.status();
  }
  EXPECT_FALSE(parse_mooncake_trace("", 8, range, 1.0, 1).ok());
}

TEST(BenchWorkload, OracleReusesFullBlocksButNeverTheLastPromptToken) {
  ReuseOracle oracle(4);
  const std::vector<int> p = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(oracle.on_send(p), 0);
  EXPECT_EQ(oracle.on_send(p), 4) << "8 tokens, 2 blocks: the second holds the last token";
  std::vector<int> longer = p;
  longer.push_back(9);
  EXPECT_EQ(oracle.on_send(longer), 8);
  std::vector<int> other = p;
  other[1] = 99;
  other.push_back(9);
  EXPECT_EQ(oracle.on_send(other), 0) << "a different first block: nothing after it either";
  // Generated tokens are reusable once the request ended: the next turn resends them.
  // The last output token's KV is never computed: 13 tokens, 3 computed blocks.
  const std::vector<int> seq = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23, 24};
  std::vector<int> next_turn = seq;
  next_turn.insert(next_turn.end(), {30, 31});
  ReuseOracle ended(4), running(4);
  for (ReuseOracle* o : {&ended, &running}) EXPECT_EQ(o->on_send(p), 0);
  ended.on_end(seq);
  EXPECT_EQ(ended.on_send(next_turn), 12);
  EXPECT_EQ(running.on_send(next_turn), 8) << "the output is not cached before its request ended";
  ReuseOracle short_end(4);
  EXPECT_EQ(short_end.on_send(p), 0);
  short_end.on_end({1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23});
  EXPECT_EQ(short_end.on_send(next_turn), 8) << "the block ending in the last output token is not computed";
}

TEST(BenchWorkload, SessionSummaryBucketsTurns) {
  std::vector<TurnRecord> r = {{0, true, 0.100, 100, 0, 0},
                               {0, true, 0.300, 100, 50, 80},
                               {1, true, 0.010, 200, 180, 190},
                               {2, true, 0.030, 300, 280, 290},
                               {1, false, 9.0, 500, 0, 400}};  // Failed: not counted.
  const SessionSummary s = summarize_sessions(r);
  EXPECT_EQ(s.turn1_requests, 2);
  EXPECT_EQ(s.later_requests, 2);
  EXPECT_DOUBLE_EQ(s.turn1_ttft_p50_ms, 200);
  EXPECT_DOUBLE_EQ(s.later_ttft_p50_ms, 20);
  EXPECT_DOUBLE_EQ(s.hit_rate, 510.0 / 700);
  EXPECT_DOUBLE_EQ(s.oracle_hit_rate, 560.0 / 700);
  EXPECT_DOUBLE_EQ(s.hit_efficiency, 510.0 / 560);
  EXPECT_DOUBLE_EQ(s.turn1_hit_rate, 50.0 / 200);
  EXPECT_DOUBLE_EQ(s.later_hit_rate, 460.0 / 500);
}

}  // namespace
}  // namespace pdserve::tools
