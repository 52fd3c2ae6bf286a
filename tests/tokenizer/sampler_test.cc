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

// Issue 15's fields: each bound on both sides, refused naming the field, the bounds accepted.
TEST(SamplingParams, ValidationOfPenaltiesBiasesMinTokensAndLogprobs) {
  struct Case {
    const char* what;
    void (*mutate)(SamplingParams&);
    const char* field;  // nullptr: valid.
  };
  const Case cases[] = {
      {"frequency -2", [](SamplingParams& p) { p.frequency_penalty = -2.0f; }, nullptr},
      {"frequency 2", [](SamplingParams& p) { p.frequency_penalty = 2.0f; }, nullptr},
      {"frequency 2.01", [](SamplingParams& p) { p.frequency_penalty = 2.01f; }, "frequency_penalty"},
      {"frequency -2.01", [](SamplingParams& p) { p.frequency_penalty = -2.01f; }, "frequency_penalty"},
      {"frequency NaN", [](SamplingParams& p) { p.frequency_penalty = std::nanf(""); }, "frequency_penalty"},
      {"presence 2", [](SamplingParams& p) { p.presence_penalty = 2.0f; }, nullptr},
      {"presence -3", [](SamplingParams& p) { p.presence_penalty = -3.0f; }, "presence_penalty"},
      {"presence NaN", [](SamplingParams& p) { p.presence_penalty = std::nanf(""); }, "presence_penalty"},
      {"bias 100",
       [](SamplingParams& p) {
         p.logit_bias = {{5, 100.0f}, {6, -100.0f}};
       },
       nullptr},
      {"bias 100.5",
       [](SamplingParams& p) {
         p.logit_bias = {{5, 100.5f}};
       },
       "logit_bias"},
      {"bias -101",
       [](SamplingParams& p) {
         p.logit_bias = {{5, -101.0f}};
       },
       "logit_bias"},
      {"bias NaN",
       [](SamplingParams& p) {
         p.logit_bias = {{5, std::nanf("")}};
       },
       "logit_bias"},
      {"bias id -1",
       [](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       },
       "logit_bias"},
      {"bias 1024 ids",
       [](SamplingParams& p) {
         for (int i = 0; i < SamplingParams::kMaxLogitBias; ++i) p.logit_bias.push_back({i, 1.0f});
       },
       nullptr},
      {"bias 1025 ids",
       [](SamplingParams& p) {
         for (int i = 0; i <= SamplingParams::kMaxLogitBias; ++i) p.logit_bias.push_back({i, 1.0f});
       },
       "logit_bias"},
      {"min_tokens = max_tokens", [](SamplingParams& p) { p.min_tokens = p.max_tokens; }, nullptr},
      {"min_tokens > max_tokens", [](SamplingParams& p) { p.min_tokens = p.max_tokens + 1; }, "min_tokens"},
      {"min_tokens -1", [](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens"},
      {"logprobs 0", [](SamplingParams& p) { p.logprobs = 0; }, nullptr},
      {"logprobs 20", [](SamplingParams& p) { p.logprobs = kernels::kMaxLogprobs; }, nullptr},
      {"logprobs 21", [](SamplingParams& p) { p.logprobs = kernels::kMaxLogprobs + 1; }, "logprobs"},
      {"logprobs -2", [](SamplingParams& p) { p.logprobs = -2; }, "logprobs"},
      {"prompt_logprobs 20", [](SamplingParams& p) { p.prompt_logprobs = 20; }, nullptr},
      {"prompt_logprobs 21", [](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs"},
      {"prompt_logprobs -2", [](SamplingParams& p) { p.prompt_logprobs = -2; }, "prompt_logprobs"},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.mutate(params);
    const Status s = params.validate();
    if (c.field == nullptr) {
      EXPECT_TRUE(s.ok()) << c.what << ": " << s;
    } else {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.what << ": " << s;
      EXPECT_NE(s.message().find(c.field), std::string::npos) << c.what << ": " << s;
    }
  }
}

// next_row carries the penalties and the logprobs wanted into the kernel's row.
TEST(Sampler, RowCarriesPenaltiesAndLogprobs) {
  SamplingParams params;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = -1.25f;
  params.logprobs = 3;
  Sampler sampler(params);
  const kernels::SampleRow row = sampler.next_row();
  EXPECT_EQ(row.frequency_penalty, 0.5f);
  EXPECT_EQ(row.presence_penalty, -1.25f);
  EXPECT_EQ(row.logprobs, 3);
  EXPECT_EQ(row.logprob_of, -1);  // Of the sampled token.
  EXPECT_EQ(Sampler(SamplingParams{}).next_row().logprobs, -1);
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
