// StopChecker: stop tokens, EOS, stop strings spanning tokens, held-back text, max_tokens.
#include "engine/sampling/stop_checker.h"

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

SamplingParams with_stops(std::vector<std::string> stops, int max_tokens = 100) {
  SamplingParams params;
  params.stop_strings = std::move(stops);
  params.max_tokens = max_tokens;
  return params;
}

TEST(FinishReason, Names) {
  EXPECT_EQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::kAbort), "abort");
  EXPECT_EQ(finish_reason_name(FinishReason::kNone), "");
}

TEST(StopChecker, StopStringSplitAcrossTokens) {
  StopChecker checker(with_stops({"END"}), {2});
  StopStep step = checker.push(10, "The E");
  EXPECT_EQ(step.finish, FinishReason::kNone);
  EXPECT_EQ(step.delta, "The ");  // "E" might begin "END".
  step = checker.push(11, "N");
  EXPECT_EQ(step.delta, "");
  step = checker.push(12, "Dgame");
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_FALSE(step.stop_token);  // The token that completed a stop string is output (cut).
  EXPECT_EQ(step.delta, "");
  EXPECT_EQ(checker.text(), "The ");
  EXPECT_EQ(checker.num_tokens(), 3);
  // After the finish, nothing changes.
  EXPECT_EQ(checker.push(13, "more").delta, "");
  EXPECT_EQ(checker.text(), "The ");
}

TEST(StopChecker, ReleasesHeldTextWhenRuledOut) {
  StopChecker checker(with_stops({"END", "\n\n"}), {2});
  EXPECT_EQ(checker.push(1, "an E").delta, "an ");
  EXPECT_EQ(checker.push(1, "NTRY\n").delta, "ENTRY");
  EXPECT_EQ(checker.push(1, "x").delta, "\nx");
  EXPECT_EQ(checker.push(1, "\n\nrest").finish, FinishReason::kStop);
  EXPECT_EQ(checker.text(), "an ENTRY\nx");
}

TEST(StopChecker, EarliestStopStringWins) {
  StopChecker checker(with_stops({"cd", "abc"}), {});
  const StopStep step = checker.push(1, "xabcd");
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_EQ(step.delta, "x");
  EXPECT_EQ(checker.text(), "x");
}

TEST(StopChecker, EosAndStopTokens) {
  SamplingParams params = with_stops({});
  params.stop_token_ids = {7};
  StopChecker eos(params, {2});
  EXPECT_EQ(eos.push(5, "hi").delta, "hi");
  const StopStep step = eos.push(2, "");
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_TRUE(step.stop_token);
  EXPECT_EQ(eos.text(), "hi");

  params.ignore_eos = true;
  StopChecker ignoring(params, {2});
  EXPECT_EQ(ignoring.push(2, "").finish, FinishReason::kNone);
  EXPECT_EQ(ignoring.push(7, "</x>").finish, FinishReason::kStop);  // Stop ids still stop.
  EXPECT_EQ(ignoring.text(), "");
}

TEST(StopChecker, MaxTokensIsLengthAndFlushes) {
  StopChecker checker(with_stops({"STOP"}, 2), {2});
  EXPECT_EQ(checker.push(1, "ab").delta, "ab");
  const StopStep step = checker.push(1, "ST");
  EXPECT_EQ(step.finish, FinishReason::kLength);
  EXPECT_EQ(step.delta, "ST");  // Held back as a possible "STOP", released at the end.
  EXPECT_EQ(checker.text(), "abST");
}

TEST(StopChecker, StopTokenBeatsLength) {
  StopChecker checker(with_stops({}, 1), {2});
  EXPECT_EQ(checker.push(2, "").finish, FinishReason::kStop);
}

// vLLM's min_tokens: neither stop tokens nor stop strings stop the first min_tokens tokens,
// then both do again; max_tokens is unaffected.
TEST(StopChecker, MinTokensHoldsOffStopTokensAndStopStrings) {
  SamplingParams params = with_stops({"END"}, 10);
  params.stop_token_ids = {7};
  params.min_tokens = 3;
  StopChecker checker(params, {2});
  EXPECT_EQ(checker.push(2, "").finish, FinishReason::kNone);     // EOS, token 1.
  EXPECT_EQ(checker.push(5, "END").finish, FinishReason::kNone);  // A stop string, token 2.
  EXPECT_EQ(checker.push(7, "").finish, FinishReason::kNone);     // A stop id, token 3.
  const StopStep step = checker.push(5, "xEND");                  // Token 4 may stop.
  EXPECT_EQ(step.finish, FinishReason::kStop);
  EXPECT_EQ(checker.text(), "ENDx");
  StopChecker by_token(params, {2});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(by_token.push(2, "").finish, FinishReason::kNone) << i;
  EXPECT_TRUE(by_token.push(2, "").stop_token);
  params.min_tokens = 10;
  params.max_tokens = 2;  // Length still ends it (validate would refuse this; the cap may not).
  StopChecker capped(params, {2});
  EXPECT_EQ(capped.push(2, "").finish, FinishReason::kNone);
  EXPECT_EQ(capped.push(2, "").finish, FinishReason::kLength);
}

TEST(StopChecker, DeltasAreWholeUtf8Characters) {
  StopChecker checker(with_stops({}), {});
  EXPECT_EQ(checker.push(1, "a\xF0\x9F").delta, "a");  // Byte-fallback halves of U+1F600.
  EXPECT_EQ(checker.push(1, "\x98\x80").delta, "\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace pdserve::engine
