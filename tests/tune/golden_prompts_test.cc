#include "tune/golden_prompts.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace pdserve::tune {
namespace {

// stories260K's vocabulary and context, with a small step budget so the chunk boundary fits.
GoldenShape stories(int max_batch_tokens = 64) {
  GoldenShape s;
  s.vocab_size = 512;
  s.bos_id = 1;
  s.eos_ids = {2};
  s.max_context = 512;
  s.block_size = 16;
  s.max_batch_tokens = max_batch_tokens;
  return s;
}

std::vector<int> lengths(const std::vector<GoldenPrompt>& set) {
  std::vector<int> out;
  for (const GoldenPrompt& p : set) out.push_back(int(p.tokens.size()));
  return out;
}

TEST(GoldenPromptsTest, LengthsSitOnTheBlockChunkAndContextBoundaries) {
  const std::vector<GoldenPrompt> set = golden_prompts(stories());
  EXPECT_EQ(lengths(set), (std::vector<int>{1, 15, 16, 17, 65, 480, 40, 83}));
  std::vector<GoldenKind> kinds;
  for (const GoldenPrompt& p : set) kinds.push_back(p.kind);
  EXPECT_EQ(kinds, (std::vector<GoldenKind>{GoldenKind::kShort, GoldenKind::kBlockMinusOne, GoldenKind::kBlock,
                                            GoldenKind::kBlockPlusOne, GoldenKind::kChunkBoundary,
                                            GoldenKind::kNearMaxContext, GoldenKind::kOrdinary, GoldenKind::kOrdinary}));
}

TEST(GoldenPromptsTest, TokensAreBosThenVocabularyIdsThatAreNeitherBosNorEos) {
  for (const GoldenPrompt& p : golden_prompts(stories())) {
    ASSERT_FALSE(p.tokens.empty());
    EXPECT_EQ(p.tokens[0], 1);
    for (size_t i = 1; i < p.tokens.size(); ++i) {
      EXPECT_GE(p.tokens[i], 3);
      EXPECT_LT(p.tokens[i], 512);
    }
  }
}

TEST(GoldenPromptsTest, NoTokenIsEosAndOnlyTheFirstIsBos) {
  GoldenShape s = stories();
  s.vocab_size = 8;  // Ids 3..7: EOS (5) and BOS (6) would be drawn often.
  s.bos_id = 6;
  s.eos_ids = {5};
  for (const GoldenPrompt& p : golden_prompts(s)) {
    EXPECT_EQ(p.tokens[0], 6);
    for (size_t i = 1; i < p.tokens.size(); ++i) {
      EXPECT_NE(p.tokens[i], 5);
      EXPECT_NE(p.tokens[i], 6);
    }
  }
}

TEST(GoldenPromptsTest, NewTokensAre32To64AndFitTheContext) {
  for (const GoldenPrompt& p : golden_prompts(stories())) {
    EXPECT_GE(p.max_tokens, 32) << golden_kind_name(p.kind);
    EXPECT_LE(p.max_tokens, 64) << golden_kind_name(p.kind);
    EXPECT_LE(int(p.tokens.size()) + p.max_tokens, 512) << golden_kind_name(p.kind);
  }
}

TEST(GoldenPromptsTest, SeededAndDeterministic) {
  const auto a = golden_prompts(stories(), 7), b = golden_prompts(stories(), 7), c = golden_prompts(stories(), 8);
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
  }
  EXPECT_NE(a[3].tokens, c[3].tokens);
}

TEST(GoldenPromptsTest, APromptTheContextCannotHoldIsLeftOutWithoutChangingTheOthers) {
  // A step budget of 512 puts the chunk boundary at 513 tokens, past the 512-position context.
  const auto small = golden_prompts(stories(64)), big = golden_prompts(stories(512));
  EXPECT_EQ(lengths(big), (std::vector<int>{1, 15, 16, 17, 480, 40, 83}));
  EXPECT_EQ(big[5].tokens, small[6].tokens);
}

TEST(GoldenPromptsTest, WithoutAKnownContextNothingIsCappedAndNoNearMaxPrompt) {
  GoldenShape s = stories();
  s.max_context = 0;
  EXPECT_EQ(lengths(golden_prompts(s)), (std::vector<int>{1, 15, 16, 17, 65, 40, 83}));
}

TEST(GoldenPromptsTest, AModelWithoutBosDrawsItsFirstTokenLikeTheOthers) {
  GoldenShape s = stories();
  s.bos_id = -1;
  for (const GoldenPrompt& p : golden_prompts(s)) EXPECT_GE(p.tokens[0], 3);
}

}  // namespace
}  // namespace pdserve::tune
