// SamplingParams validation and the Sampler's greedy, top-k, top-p and seeded draws.
#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace pdserve::engine {
namespace {

SamplingParams random_params(int64_t seed) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = seed;
  return params;
}

TEST(SamplingParams, Validation) {
  EXPECT_TRUE(SamplingParams{}.validate().ok());
  const auto invalid = [](auto mutate) {
    SamplingParams params;
    mutate(params);
    return params.validate().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.temperature = -0.1f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.temperature = std::nanf(""); }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_p = 0.0f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_p = 1.5f; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_p = std::nanf(""); }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.top_k = -1; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.max_tokens = 0; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.stop_strings = {""}; }));
  EXPECT_TRUE(invalid([](SamplingParams& p) { p.stop_token_ids = {-3}; }));
  SamplingParams params;
  params.top_p = 2.0f;
  EXPECT_NE(params.validate().message().find("top_p"), std::string::npos);
}

TEST(Sampler, GreedyIsArgmaxLowestIndexOnTies) {
  Sampler sampler{SamplingParams{}};
  const float logits[] = {0.5f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(sampler.sample(logits, 4), 1);
  const float with_nan[] = {std::nanf(""), -2.0f, -1.0f};
  EXPECT_EQ(sampler.sample(with_nan, 3), 2);
}

TEST(Sampler, TopKOneEqualsGreedy) {
  SamplingParams params = random_params(5);
  params.temperature = 2.0f;
  params.top_k = 1;
  Sampler sampler(params);
  const float logits[] = {1.0f, 2.0f, 2.0f, 0.0f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits, 4), 1);
}

TEST(Sampler, TinyTopPIsArgmax) {
  SamplingParams params = random_params(9);
  params.top_p = 1e-6f;
  Sampler sampler(params);
  const float logits[] = {0.0f, 0.1f, 0.3f, 0.2f};
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sampler.sample(logits, 4), 2);
}

TEST(Sampler, TopPKeepsSmallestPrefixWithEnoughMass) {
  // Probabilities 0.6, 0.3, 0.1: top_p 0.8 keeps the first two (0.9 >= 0.8).
  const float logits[] = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams params = random_params(11);
  params.top_p = 0.8f;
  Sampler sampler(params);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 3000; ++i) ++counts[sampler.sample(logits, 3)];
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[0] / 3000.0, 2.0 / 3.0, 0.05);  // 0.6 / 0.9
}

TEST(Sampler, TopKRestrictsToMostLikely) {
  const float logits[] = {0.0f, 1.0f, 0.5f, 1.2f, -1.0f};
  SamplingParams params = random_params(3);
  params.top_k = 2;
  Sampler sampler(params);
  for (int i = 0; i < 500; ++i) {
    const int token = sampler.sample(logits, 5);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
}

TEST(Sampler, FollowsSoftmaxWithTemperature) {
  const float logits[] = {0.0f, std::log(3.0f)};
  Sampler sampler(random_params(1));
  int ones = 0;
  for (int i = 0; i < 8000; ++i) ones += sampler.sample(logits, 2);
  EXPECT_NEAR(ones / 8000.0, 0.75, 0.03);
  // Temperature 0.5 squares the odds: 9:1.
  SamplingParams cold = random_params(2);
  cold.temperature = 0.5f;
  Sampler cold_sampler(cold);
  ones = 0;
  for (int i = 0; i < 8000; ++i) ones += cold_sampler.sample(logits, 2);
  EXPECT_NEAR(ones / 8000.0, 0.9, 0.02);
  // -inf logits never come up.
  const float masked[] = {-std::numeric_limits<float>::infinity(), 0.0f, 0.0f};
  for (int i = 0; i < 200; ++i) EXPECT_NE(sampler.sample(masked, 3), 0);
}

TEST(Sampler, TopPOnLargeVocabStaysInNucleus) {
  // A flat-ish distribution over 5000 tokens: the nucleus runs to thousands of tokens, past
  // the sampler's first partially sorted prefix.
  const int vocab = 5000;
  std::vector<float> logits(vocab);
  for (int i = 0; i < vocab; ++i) logits[i] = std::sin(i * 1.3f) * 0.5f;
  const float top_p = 0.5f;
  std::vector<double> probs(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) total += probs[i] = std::exp(logits[i]);
  std::vector<int> order(vocab);
  for (int i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  });
  std::vector<bool> in_nucleus(vocab, false);
  double mass = 0.0;
  for (int id : order) {
    in_nucleus[id] = true;
    if ((mass += probs[id]) >= top_p * total) break;
  }
  SamplingParams params = random_params(17);
  params.top_p = top_p;
  Sampler sampler(params);
  for (int i = 0; i < 2000; ++i) {
    const int token = sampler.sample(logits.data(), vocab);
    ASSERT_TRUE(in_nucleus[token]) << token;
  }
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits(1000);
  for (int i = 0; i < 1000; ++i) logits[i] = std::sin(i * 0.37f) * 3.0f;
  const auto draw = [&](int64_t seed) {
    SamplingParams params = random_params(seed);
    params.top_p = 0.9f;
    params.top_k = 50;
    Sampler sampler(params);
    std::vector<int> tokens;
    for (int i = 0; i < 64; ++i) tokens.push_back(sampler.sample(logits.data(), 1000));
    return tokens;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

}  // namespace
}  // namespace pdserve::engine
